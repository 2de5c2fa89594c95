// The dashboard's entry: the token prompt, the hash router, and the sampler that keeps a
// bounded history of this node's counters for the overview's charts and the banner.

import { get, metrics, onUnauthorized, request, setToken, token } from "./api.js";
import { h, replace } from "./dom.js";
import { views } from "./views.js";

const SAMPLE_MS = 5000;
const HISTORY = 120; // 10 minutes of samples

/** What the sampler has seen: raw samples and the rates derived from consecutive ones. */
export const history = { samples: [], rates: [], last: null, error: null };

const $ = (id) => document.getElementById(id);

// --- token ------------------------------------------------------------------------------

function askForToken(body) {
  const why = body && body.error ? body.error : "This node asks for a token.";
  replace($("login-why"), token() ? `The token was refused: ${why}` : `This node asks for a token: ${why}`);
  $("login").hidden = false;
  $("token").focus();
}

onUnauthorized(askForToken);

$("login").addEventListener("submit", (ev) => {
  ev.preventDefault();
  setToken($("token").value.trim());
  $("token").value = "";
  $("login").hidden = true;
  $("forget").hidden = false;
  sample();
  render();
});

$("forget").addEventListener("click", () => {
  setToken(null);
  $("forget").hidden = true;
  render();
});
$("forget").hidden = !token();

// --- sampler ------------------------------------------------------------------------------

function total(groups) {
  return Array.isArray(groups) ? groups.reduce((a, g) => a + (Number(g.totalLag) || 0), 0) : null;
}

async function sample() {
  const t = Date.now();
  try {
    const [health, m, groups] = await Promise.all([
      request("GET", "/health"),
      metrics(),
      get("/api/v1/consumer-groups").catch(() => null),
    ]);
    const raft = (health.json && health.json.raft) || {};
    const s = {
      t,
      health: health.json,
      pushed: m.queen_messages_pushed_total || 0,
      delivered: m.queen_messages_delivered_total || 0,
      acked: m.queen_acks_total || 0,
      diskUsed: m.queen_disk_used_ratio,
      diskGate: m.queen_disk_gate_ratio,
      groupLag: total(groups),
      raftLag: raft.lag ?? null,
    };
    const prev = history.last;
    if (prev) {
      const dt = (t - prev.t) / 1000;
      const rate = (k) => Math.max(0, (s[k] - prev[k]) / dt);
      history.rates.push({ t, pushed: rate("pushed"), delivered: rate("delivered"), acked: rate("acked") });
      if (history.rates.length > HISTORY) history.rates.shift();
    }
    history.samples.push(s);
    if (history.samples.length > HISTORY) history.samples.shift();
    history.last = s;
    history.error = null;
    banner(s);
  } catch (e) {
    history.error = e;
    banner(null, e);
  }
  document.dispatchEvent(new CustomEvent("queen:sample"));
}

/** The banner: disk gate closed, no leader, no quorum, or the node not answering. */
function banner(s, err) {
  const lines = [];
  // A 401 is the token prompt's business, not the banner's.
  if (err && err.status === 0) lines.push(`This node did not answer: ${err.message}`);
  else if (err && err.status !== 401) lines.push(`This node's figures could not be read: ${err.status ? `HTTP ${err.status} ` : ""}${err.message}`);
  if (s) {
    const raft = (s.health && s.health.raft) || {};
    const status = s.health && s.health.status;
    if (status === "no_quorum") lines.push("No quorum: this node knows no leader that a majority acknowledged lately; writes are refused.");
    else if (status && status !== "healthy") lines.push(`This node is not ready: ${status}.`);
    if (s.health && raft.leaderId == null) lines.push("No leader is known.");
    if (typeof s.diskUsed === "number" && typeof s.diskGate === "number" && s.diskUsed >= s.diskGate) {
      lines.push(`Disk gate closed: the data disk is ${(s.diskUsed * 100).toFixed(1)}% full, the gate is at ${(s.diskGate * 100).toFixed(0)}%; pushes and writes answer 507 disk_full.`);
    }
  }
  const b = $("banner");
  replace(b, lines.map((l) => h("p", {}, l)));
  b.hidden = lines.length === 0;
  if (s && s.health && s.health.raft) {
    const r = s.health.raft;
    replace($("whoami"), `node ${r.nodeId} · ${r.role} · term ${r.term}`);
  }
}

// --- router -------------------------------------------------------------------------------

/** "#messages?queue=a" -> {name: "messages", args: [], params: URLSearchParams} */
function route() {
  const hash = location.hash.replace(/^#/, "") || "overview";
  const at = hash.indexOf("?");
  const [path, query] = at < 0 ? [hash, ""] : [hash.slice(0, at), hash.slice(at + 1)];
  const [name, ...args] = path.split("/").map((s) => {
    try {
      return decodeURIComponent(s);
    } catch {
      return s;
    }
  });
  return { name, args, params: new URLSearchParams(query || "") };
}

let rendering = 0;

async function render() {
  const r = route();
  const view = views[r.name] || views.overview;
  for (const a of document.querySelectorAll("#nav a")) {
    a.classList.toggle("active", a.getAttribute("href") === `#${view.nav || r.name}`);
  }
  const mine = ++rendering;
  const el = h("section", { class: "view", "data-view": r.name });
  try {
    await view.render(el, r.args, r.params, history);
  } catch (e) {
    el.appendChild(h("div", { class: "error", role: "alert" }, `This view failed: ${e.message}`));
  }
  if (mine === rendering) replace($("view"), el);
}

window.addEventListener("hashchange", render);
document.addEventListener("queen:sample", () => {
  if (route().name === "overview" || !location.hash) views.overview.refresh?.(history);
});
document.addEventListener("queen:render", render);

sample();
setInterval(sample, SAMPLE_MS);
render();
