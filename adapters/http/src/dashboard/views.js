// The views: each builds its section from the API's answers, as text nodes only.

import { call, enc, get, q, request } from "./api.js";
import { lineChart } from "./chart.js";
import { bytes, failure, fields, figures, h, num, pre, replace, table, text } from "./dom.js";

const link = (hash, label) => h("a", { href: hash }, label);
const when = (v) => (v ? String(v).replace("T", " ").replace(/\.\d+Z$/, "Z") : "–");
const yes = (v) => (v ? "yes" : "no");
/** A time the sink writes as microseconds since the epoch. */
const micros = (v) => (typeof v === "number" ? when(new Date(v / 1000).toISOString()) : when(v));

/** A form whose submit sets the hash to `#name?field=value...` from its inputs. */
function filterForm(name, inputs) {
  const form = h("form", { class: "filters" }, inputs, h("button", { type: "submit" }, "Show"));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const p = new URLSearchParams();
    for (const [k, v] of new FormData(form)) if (v !== "") p.set(k, String(v));
    const next = `#${name}?${p}`;
    if (location.hash === next) document.dispatchEvent(new Event("queen:render"));
    else location.hash = next;
  });
  return form;
}

function input(name, label, value, attrs = {}) {
  return h("label", {}, `${label} `, h("input", { name, value: value ?? "", ...attrs }));
}

function select(name, label, value, options) {
  return h(
    "label",
    {},
    `${label} `,
    h("select", { name }, options.map(([v, l]) => h("option", { value: v, selected: v === (value ?? "") }, l))),
  );
}

/** The queues' names, for the pickers (empty on failure). */
async function queueNames() {
  try {
    const r = await get("/api/v1/resources/queues");
    return (r.queues || []).map((x) => x.name);
  } catch {
    return [];
  }
}

async function queuePicker(value) {
  const names = await queueNames();
  if (value && !names.includes(value)) names.unshift(value);
  return select("queue", "Queue", value, [["", "— choose —"], ...names.map((n) => [n, n])]);
}

/** Runs `f`; on failure puts the node's error into `el` instead. */
async function guarded(el, what, f) {
  try {
    return await f();
  } catch (e) {
    el.appendChild(failure(e, what));
    return undefined;
  }
}

// --- overview -----------------------------------------------------------------------------

function charts(history) {
  const rates = history.rates;
  const samples = history.samples;
  return h(
    "div",
    { class: "charts" },
    lineChart({
      title: "Throughput (messages per second, sampled every 5 s)",
      unit: "/s",
      key: "throughput",
      series: [
        { name: "pushed", points: rates.map((r) => [r.t, r.pushed]) },
        { name: "delivered", points: rates.map((r) => [r.t, r.delivered]) },
        { name: "acked", points: rates.map((r) => [r.t, r.acked]) },
      ],
    }),
    lineChart({
      title: "Lag (messages)",
      key: "lag",
      series: [
        { name: "consumer groups", points: samples.filter((s) => s.groupLag !== null).map((s) => [s.t, s.groupLag]) },
        { name: "raft commit − applied", points: samples.filter((s) => s.raftLag !== null).map((s) => [s.t, s.raftLag]) },
      ],
    }),
  );
}

const overview = {
  nav: "overview",
  async render(el, _args, _params, history) {
    el.appendChild(h("h2", {}, "Overview"));
    const [health, status, counts] = await Promise.all([
      request("GET", "/health"),
      get("/status").catch((e) => e),
      get("/api/v1/resources/overview").catch((e) => e),
    ]);
    const raft = (health.json && health.json.raft) || {};
    el.appendChild(
      figures([
        ["Health", health.json ? health.json.status : `HTTP ${health.status}`, "health"],
        ["Node", raft.nodeId, "node"],
        ["Role", raft.role, "role"],
        ["Leader", raft.leaderId ?? "none", "leader"],
        ["Term", raft.term, "term"],
        ["Commit", raft.commit, "commit"],
        ["Applied", raft.applied, "applied"],
      ]),
    );
    if (counts instanceof Error) el.appendChild(failure(counts, "/api/v1/resources/overview"));
    else {
      const m = counts.messages || {};
      el.appendChild(
        figures([
          ["Queues", counts.queues, "queues"],
          ["Partitions", counts.partitions, "partitions"],
          ["Messages", m.total, "messages"],
          ["Pending", m.pending, "pending"],
          ["Dead letters", m.deadLetter, "deadLetter"],
          ["Lag", counts.lag, "lag"],
        ]),
      );
    }
    const chartBox = h("div", { id: "overview-charts" }, charts(history));
    el.appendChild(chartBox);
    await longHistory(el);
    if (status instanceof Error) el.appendChild(failure(status, "/status"));
    else {
      el.appendChild(h("h3", {}, "This node"));
      el.appendChild(
        figures([
          ["Version", status.node.version, "version"],
          ["Uptime", `${status.node.uptimeSeconds} s`, "uptime"],
          ["Safe time", when(status.safeTime), "safeTime"],
          ["Store on disk", bytes(status.storage.diskBytes), "diskBytes"],
          ["Long polls waiting", status.pops.waiting, "waiting"],
          ["S3 sink", status.s3 ? status.s3.phase : "off", "sink"],
        ]),
      );
    }
    await members(el, raft.leaderId);
  },
  refresh(history) {
    const box = document.getElementById("overview-charts");
    if (box) replace(box, charts(history));
  },
};

/** The last hour per minute, from the samples the node keeps (`/api/v1/status/analytics`):
 * unlike the charts above, it is there as soon as the page opens. */
async function longHistory(el) {
  const r = await get(q("/api/v1/status/analytics", { interval: "minute" })).catch((e) => e);
  if (r instanceof Error) {
    el.appendChild(h("p", { class: "muted", "data-history": "off" }, `No history kept by the node: ${r.message}`));
    return;
  }
  const at = (b) => Date.parse(b.at);
  const totals = r.totals || [];
  el.appendChild(
    h(
      "div",
      { class: "charts", "data-history": String(r.samples || 0) },
      lineChart({
        title: "Last hour: messages per minute (kept by the node)",
        unit: "/min",
        key: "history",
        series: [
          { name: "pushed", points: totals.map((b) => [at(b), b.pushed || 0]) },
          { name: "consumed", points: totals.map((b) => [at(b), b.consumed || 0]) },
        ],
      }),
      lineChart({
        title: "Last hour: lag and depth (messages, each minute's last sample)",
        key: "history-lag",
        series: [
          { name: "lag", points: totals.map((b) => [at(b), b.lag || 0]) },
          { name: "depth", points: totals.map((b) => [at(b), b.depth || 0]) },
        ],
      }),
    ),
  );
}

/** The members as the leader sees them (admin-only with JWT on); `leader` is the leader's id
 * as this node knows it. */
async function members(el, leader) {
  el.appendChild(h("h3", {}, "Members"));
  const r = await request("GET", "/api/v1/system/raft/membership");
  if (r.status === 401 || r.status === 403) {
    el.appendChild(h("p", { class: "muted" }, "Reading the membership needs an admin token (or the raft token) when JWT is on."));
    return;
  }
  if (r.status !== 200) {
    el.appendChild(failure({ status: r.status, json: r.json, message: r.text }, "membership"));
    return;
  }
  el.appendChild(
    table(
      [
        { title: "Node", get: (m) => m.id },
        { title: "Role", get: (m) => (m.id === leader ? "leader" : m.voter ? "follower" : "learner") },
        { title: "Live", get: (m) => yes(m.live) },
        { title: "Behind the leader (entries)", get: (m) => m.lag, num: true },
        { title: "Raft address", get: (m) => m.raft || "–" },
        {
          title: "Client address",
          get: (m) => (m.http ? h("a", { href: `${location.protocol}//${m.http}/` }, m.http) : "–"),
        },
      ],
      r.json.members,
    ),
  );
}

// --- queues -------------------------------------------------------------------------------

const queues = {
  async render(el) {
    el.appendChild(h("h2", {}, "Queues"));
    const r = await guarded(el, "/api/v1/resources/queues", () => get("/api/v1/resources/queues"));
    if (!r) return;
    el.appendChild(
      table(
        [
          { title: "Queue", get: (x) => link(`#queue/${enc(x.name)}`, x.name) },
          { title: "Namespace", get: (x) => x.namespace },
          { title: "Task", get: (x) => x.task },
          { title: "Partitions", get: (x) => x.partitionCount, num: true },
          { title: "Messages", get: (x) => x.messages.total, num: true },
          { title: "Pending", get: (x) => x.messages.pending, num: true },
          { title: "Dead letters", get: (x) => x.messages.deadLetter, num: true },
          { title: "Created", get: (x) => when(x.createdAt) },
        ],
        r.queues,
        "No queue yet.",
      ),
    );
    const total = r.pagination && r.pagination.total;
    if (total > (r.queues || []).length) el.appendChild(h("p", { class: "muted" }, `The first ${r.queues.length} of ${total} queues.`));
  },
};

const queue = {
  nav: "queues",
  async render(el, [name], p) {
    el.appendChild(h("h2", {}, "Queue ", h("code", {}, name)));
    const after = p.get("after");
    const r = await guarded(el, "queue", () => get(q(`/api/v1/resources/queues/${enc(name)}`, { after })));
    if (!r) return;
    el.appendChild(
      h(
        "p",
        { class: "links" },
        link(`#messages?${new URLSearchParams({ queue: name })}`, "Messages"),
        link(`#dlq?${new URLSearchParams({ queue: name })}`, "Dead letters"),
        link(`#timers?${new URLSearchParams({ queue: name })}`, "Timers"),
      ),
    );
    el.appendChild(
      figures([
        ["Partitions", r.partitionCount, "partitions"],
        ["Messages", r.messages.total, "messages"],
        ["Pending", r.messages.pending, "pending"],
        ["Dead letters", r.messages.deadLetter, "deadLetter"],
      ]),
    );
    if (r.approximate) {
      el.appendChild(h("p", { class: "muted" }, `Pending counted over the first ${r.pendingPartitionsCounted} partitions.`));
    }
    el.appendChild(h("h3", {}, "Partitions"));
    el.appendChild(
      table(
        [
          { title: "Partition", get: (p) => p.name },
          { title: "Id", get: (p) => p.id },
          { title: "Messages", get: (p) => p.messages, num: true },
          { title: "Pending", get: (p) => p.pending, num: true },
          { title: "Log start", get: (p) => p.logStart, num: true },
          { title: "High watermark", get: (p) => p.highWatermark, num: true },
          { title: "Leased", get: (p) => yes(p.leaseActive) },
          { title: "Last write", get: (p) => when(p.lastWriteAt) },
          { title: "Oldest pending", get: (p) => when(p.oldestPendingAt) },
        ],
        r.partitions,
      ),
    );
    // The partitions come a page at a time (the node answers at most 1000 per call).
    if (r.truncated && r.nextCursor) {
      const next = new URLSearchParams({ after: r.nextCursor });
      el.appendChild(h("p", { class: "pager" }, after ? link(`#queue/${enc(name)}`, "← first ") : null, link(`#queue/${enc(name)}?${next}`, "next partitions →")));
    } else if (after) {
      el.appendChild(h("p", { class: "pager" }, link(`#queue/${enc(name)}`, "← first")));
    }
    el.appendChild(h("h3", {}, "Options"));
    el.appendChild(fields(r.options));
    const st = await request("GET", `/api/v1/status/queues/${enc(name)}`);
    if (st.status === 200 && st.json && st.json.messages) {
      el.appendChild(h("p", { class: "muted" }, `Status: ${text(st.json.messages)}`));
    }
  },
};

// --- consumer groups ----------------------------------------------------------------------

const groups = {
  async render(el) {
    el.appendChild(h("h2", {}, "Consumer groups"));
    const r = await guarded(el, "/api/v1/consumer-groups", () => get("/api/v1/consumer-groups"));
    if (!r) return;
    el.appendChild(
      table(
        [
          { title: "Group", get: (g) => link(`#group/${enc(g.name)}`, g.name) },
          { title: "Queue", get: (g) => link(`#queue/${enc(g.queueName)}`, g.queueName) },
          { title: "State", get: (g) => g.state },
          { title: "Members", get: (g) => g.members, num: true },
          { title: "Lag (messages)", get: (g) => g.totalLag, num: true },
          { title: "Partitions lagging", get: (g) => g.partitionsWithLag, num: true },
          { title: "Oldest lag (s)", get: (g) => g.maxTimeLag, num: true },
          { title: "Subscribed", get: (g) => when(g.subscriptionCreatedAt) },
        ],
        r,
        "No consumer group yet.",
      ),
    );
  },
};

const group = {
  nav: "groups",
  async render(el, [name]) {
    el.appendChild(h("h2", {}, "Consumer group ", h("code", {}, name)));
    const r = await guarded(el, "group", () => get(`/api/v1/consumer-groups/${enc(name)}`));
    if (!r) return;
    for (const [qname, detail] of Object.entries(r)) {
      el.appendChild(h("h3", {}, "Queue ", link(`#queue/${enc(qname)}`, qname)));
      el.appendChild(
        table(
          [
            { title: "Partition", get: (p) => p.partition },
            { title: "Lag (messages)", get: (p) => p.offsetLag, num: true },
            { title: "Lag (s)", get: (p) => p.timeLagSeconds, num: true },
            { title: "Leased", get: (p) => yes(p.leaseActive) },
            { title: "Last consumed", get: (p) => when(p.lastConsumedAt) },
          ],
          detail.partitions,
        ),
      );
    }
  },
};

// --- messages -----------------------------------------------------------------------------

const STATUSES = [
  ["", "any"],
  ["pending", "pending"],
  ["processing", "processing"],
  ["completed", "completed"],
  ["dead_letter", "dead letter"],
];

const messageLink = (m) => link(`#message/${enc(m.partitionId)}/${enc(m.transactionId)}`, m.transactionId);

/** A view listing one queue's messages from `path`: a filter form with the queue picker, the
 * `extra` inputs and limit/offset, then the table and a pager (`total` reads the answer's
 * count). */
function queueList({ name, title, path, extra, columns, empty, total }) {
  return {
    async render(el, _args, p) {
      el.appendChild(h("h2", {}, title));
      const queueName = p.get("queue") || "";
      el.appendChild(
        filterForm(name, [
          await queuePicker(queueName),
          ...extra(p),
          input("limit", "Limit", p.get("limit") || "50", { type: "number", min: 1, max: 1000 }),
          input("offset", "Offset", p.get("offset") || "0", { type: "number", min: 0 }),
        ]),
      );
      if (!queueName) {
        el.appendChild(h("p", { class: "muted" }, "Choose a queue."));
        return;
      }
      const params = Object.fromEntries(p);
      params.limit = params.limit || 50;
      const r = await guarded(el, path, () => get(q(path, params)));
      if (!r) return;
      el.appendChild(table(columns, r.messages, empty));
      pager(el, name, p, r.messages.length, total(r), r.pagination && r.pagination.nextCursor);
    },
  };
}

const messages = queueList({
  name: "messages",
  title: "Messages",
  path: "/api/v1/messages",
  extra: (p) => [
    select("status", "Status", p.get("status"), STATUSES),
    input("consumerGroup", "Consumer group", p.get("consumerGroup"), { placeholder: "queue mode" }),
    input("partition", "Partition", p.get("partition")),
  ],
  columns: [
    { title: "Partition", get: (m) => m.partition },
    { title: "Offset", get: (m) => m.offset, num: true },
    { title: "Transaction", get: messageLink },
    { title: "Status", get: (m) => h("span", { class: `status ${m.status}` }, m.status) },
    { title: "Created", get: (m) => when(m.createdAt) },
    { title: "Payload", get: (m) => h("code", {}, text(m.data, 80)) },
  ],
  empty: "No message matches.",
  total: (r) => r.pagination && r.pagination.total,
});

/** Offset paging, or the node's cursor when it gave one (a listing reads a bounded number of
 * messages per call, so a filtered page may be short yet not the last). */
function pager(el, name, p, got, total, cursor) {
  const limit = Number(p.get("limit") || 50);
  const offset = Number(p.get("offset") || 0);
  const at = (o) => {
    const next = new URLSearchParams(p);
    next.set("offset", String(Math.max(0, o)));
    next.set("limit", String(limit));
    next.delete("after");
    return `#${name}?${next}`;
  };
  if (cursor) {
    const next = new URLSearchParams(p);
    next.set("after", cursor);
    next.set("offset", "0");
    next.set("limit", String(limit));
    el.appendChild(h("p", { class: "pager" }, p.get("after") ? link(at(0), "← first ") : null, ` ${got} shown `, link(`#${name}?${next}`, "next →")));
    return;
  }
  if (got === 0 && offset === 0) return;
  el.appendChild(
    h(
      "p",
      { class: "pager" },
      offset > 0 ? link(at(offset - limit), "← previous") : null,
      ` ${offset + 1}–${offset + got}${typeof total === "number" ? ` of ${total}` : ""} `,
      got === limit ? link(at(offset + limit), "next →") : null,
    ),
  );
}

/** The retry and delete buttons of one message; the node's answer (or JSON error) below. */
function actions(pid, txn, after) {
  const out = h("div", { class: "action-result", "data-action-result": "" });
  const act = async (method, path, done) => {
    replace(out, "…");
    try {
      const r = await call(method, path);
      replace(out, h("div", { class: "ok" }, `${done}. `), pre(r));
      if (after) after();
    } catch (e) {
      replace(out, failure(e, `${method} ${path}`));
    }
  };
  const base = `/api/v1/messages/${enc(pid)}/${enc(txn)}`;
  return h(
    "div",
    { class: "actions" },
    h("button", { type: "button", "data-action": "retry", onclick: () => act("POST", `${base}/retry`, "Retried") }, "Retry"),
    h(
      "button",
      {
        type: "button",
        class: "danger",
        "data-action": "delete",
        onclick: () => {
          if (confirm(`Delete message ${txn}? This cannot be undone.`)) act("DELETE", base, "Deleted");
        },
      },
      "Delete",
    ),
    out,
  );
}

const message = {
  nav: "messages",
  async render(el, [pid, txn]) {
    el.appendChild(h("h2", {}, "Message ", h("code", {}, txn)));
    const r = await guarded(el, "message", () => get(`/api/v1/messages/${enc(pid)}/${enc(txn)}`));
    if (!r) return;
    el.appendChild(h("p", { class: "links" }, link(`#messages?${new URLSearchParams({ queue: r.queue })}`, `Messages of ${r.queue}`)));
    const { payload, data, ...rest } = r;
    el.appendChild(fields(rest));
    el.appendChild(h("h3", {}, "Payload"));
    el.appendChild(pre(payload ?? data));
    el.appendChild(actions(pid, txn));
  },
};

// --- dead letters -------------------------------------------------------------------------

const dlq = queueList({
  name: "dlq",
  title: "Dead letters",
  path: "/api/v1/dlq",
  extra: (p) => [input("consumerGroup", "Consumer group", p.get("consumerGroup")), input("partition", "Partition", p.get("partition"))],
  columns: [
    { title: "Partition", get: (m) => m.partition },
    { title: "Transaction", get: messageLink },
    { title: "Group", get: (m) => m.consumerGroup ?? "queue mode" },
    { title: "Error", get: (m) => m.errorMessage },
    { title: "Retries", get: (m) => m.retryCount, num: true },
    { title: "Failed", get: (m) => when(m.failedAt) },
    { title: "Payload", get: (m) => h("code", {}, text(m.data, 60)) },
    { title: "", get: (m) => actions(m.partitionId, m.transactionId) },
  ],
  empty: "No dead letter.",
  total: (r) => r.total,
});

// --- KV -----------------------------------------------------------------------------------

const kv = {
  async render(el, _args, p) {
    el.appendChild(h("h2", {}, "KV"));
    const ns = p.get("ns") || "";
    el.appendChild(
      filterForm("kv", [
        input("ns", "Namespace", ns, { required: true }),
        input("prefix", "Key prefix", p.get("prefix")),
        input("after", "After key", p.get("after")),
      ]),
    );
    if (!ns) {
      el.appendChild(h("p", { class: "muted" }, "Name a namespace to list its keys (100 a page)."));
      return;
    }
    const op = { op: "getPrefix", ns, prefix: p.get("prefix") || "", limit: 100 };
    if (p.get("after")) op.after = p.get("after");
    const r = await guarded(el, "/api/v1/kv", () => call("POST", "/api/v1/kv", { operations: [op] }));
    if (!r) return;
    const res = (r.results || [])[0] || {};
    el.appendChild(
      table(
        [
          { title: "Key", get: (x) => h("code", {}, x.key) },
          { title: "Version", get: (x) => x.version, num: true },
          { title: "Updated", get: (x) => when(x.updatedAt) },
          { title: "Expires", get: (x) => (x.expiresAt ? when(x.expiresAt) : "never") },
          { title: "Value", get: (x) => h("code", {}, text(JSON.stringify(x.value), 100)) },
        ],
        res.rows,
        "No key under this prefix.",
      ),
    );
    if (res.truncated && res.nextAfter) {
      const next = new URLSearchParams(p);
      next.set("after", res.nextAfter);
      el.appendChild(h("p", { class: "pager" }, link(`#kv?${next}`, "next →")));
    }
  },
};

// --- timers -------------------------------------------------------------------------------

function decoded(b64) {
  try {
    return atob(b64);
  } catch {
    return b64;
  }
}

const timers = {
  async render(el, _args, p) {
    el.appendChild(h("h2", {}, "Timers"));
    const queueName = p.get("queue") || "";
    el.appendChild(filterForm("timers", [await queuePicker(queueName), input("after", "After key", p.get("after"))]));
    if (!queueName) {
      el.appendChild(h("p", { class: "muted" }, "Choose a queue."));
      return;
    }
    const r = await guarded(el, "timers", () => get(q(`/api/v1/timers/${enc(queueName)}`, { limit: 100, after: p.get("after") })));
    if (!r) return;
    el.appendChild(
      table(
        [
          { title: "Timer key", get: (t) => h("code", {}, t.timerKey) },
          { title: "Partition", get: (t) => t.partition },
          { title: "Deliver at", get: (t) => when(t.deliverAt) },
          { title: "Scheduled", get: (t) => when(t.scheduledAt) },
          { title: "Attempts", get: (t) => t.attempts, num: true },
          { title: "Message id", get: (t) => t.messageId },
          { title: "Payload", get: (t) => h("code", {}, t.encrypted ? "(encrypted)" : text(decoded(t.payload), 80)) },
        ],
        r.rows,
        "No timer pending.",
      ),
    );
    if (r.truncated && r.nextAfter) {
      const next = new URLSearchParams(p);
      next.set("after", r.nextAfter);
      el.appendChild(h("p", { class: "pager" }, link(`#timers?${next}`, "next →")));
    }
  },
};

// --- S3 sink ------------------------------------------------------------------------------

const sink = {
  async render(el) {
    el.appendChild(h("h2", {}, "S3 sink"));
    const [st, all] = await Promise.all([guarded(el, "/status", () => get("/status")), request("GET", "/api/v1/system/raft/nodes")]);
    if (!st) return;
    if (!st.s3) {
      el.appendChild(h("p", { class: "muted", "data-sink": "off" }, "No S3 sink runs on this node (QUEEN_S3_* unset)."));
      return;
    }
    const writers = sinkWriters(all);
    el.appendChild(figures([["Phase", st.s3.phase, "phase"]]));
    if (!writers.known) {
      el.appendChild(
        h("p", { class: "muted" }, "The figures of queues other nodes write are not shown: reading them needs an admin token (or the raft token) when JWT is on."),
      );
    }
    for (const s of st.s3.sinks || []) {
      el.appendChild(h("h3", {}, "Sink ", h("code", {}, s.name || "default")));
      el.appendChild(
        figures([
          ["Healthy", yes(s.ok), "ok"],
          ["Bucket", s.bucket ? s.bucket.target : "–", "bucket"],
          ["Reachable", yes(s.bucket && s.bucket.reachable), "reachable"],
          ["Queues held here", s.placement ? `${s.placement.held} of ${s.placement.queues}` : "–", "held"],
          ["Lagging", s.health ? s.health.lagging : "–", "lagging"],
          ["Failing", s.health ? s.health.failing : "–", "failing"],
          ["Buffered", bytes(s.memory && s.memory.bufferedBytes), "buffered"],
        ]),
      );
      if (s.error) el.appendChild(h("div", { class: "error" }, s.error));
      // Each queue with its writer's figures: this node's row when it writes the queue, else the
      // row of the node that does (windows, records and lag are known only where it is written).
      const rows = (s.queues || []).map((x) => {
        if (x.running) return { ...x, from: `${writers.me ?? "?"} (this node)` };
        const w = writers.rows.get(`${s.name}\u0000${x.queue}`);
        return w ? { ...w.row, from: String(w.node) } : { ...x, from: "–" };
      });
      el.appendChild(
        table(
          [
            { title: "Queue", get: (x) => x.queue },
            { title: "State", get: (x) => x.state },
            { title: "Held by", get: (x) => x.heldBy },
            { title: "Figures from node", get: (x) => x.from },
            { title: "Last window", get: (x) => (x.windowsCommitted ? `#${x.k} to ${micros(x.tEnd)}` : "–") },
            { title: "Complete through", get: (x) => micros(x.completeThrough) },
            { title: "Lag (s)", get: (x) => x.lagSeconds, num: true },
            { title: "Windows", get: (x) => x.windowsCommitted, num: true },
            { title: "Records", get: (x) => x.records, num: true },
            { title: "Bytes", get: (x) => bytes(x.bytes) },
            { title: "Lost", get: lost },
            { title: "Last error", get: (x) => (x.lastError ? `${x.lastError} (${when(x.lastErrorAt)})` : "–") },
          ],
          rows,
          "No queue in the sink yet.",
        ),
      );
    }
  },
};

/** The sink rows each node answered in `/api/v1/system/raft/nodes`, by sink and queue. */
function sinkWriters(all) {
  const out = { known: false, me: undefined, rows: new Map() };
  if (!all || all.status !== 200 || !all.json || !Array.isArray(all.json.nodes)) return out;
  out.known = true;
  out.me = all.json.nodes[0] && all.json.nodes[0].nodeId;
  for (const n of all.json.nodes) {
    for (const row of (n.sink && n.sink.queues) || []) out.rows.set(`${row.sink}\u0000${row.queue}`, { node: n.nodeId, row });
  }
  return out;
}

/** Records retention deleted before the sink read them: the count and the last ranges. */
function lost(x) {
  if (!x.recordsLost) return x.recordsLost === 0 ? "0" : "–";
  const ranges = (x.lostRanges || []).map((r) => `${r.partition} ${r.from}–${r.to} (window #${r.k})`);
  return `${num(x.recordsLost)}: ${ranges.join(", ")}`;
}

// --- replicated log -----------------------------------------------------------------------

const log = {
  async render(el) {
    el.appendChild(h("h2", {}, "Replicated log"));
    const [health, st] = await Promise.all([request("GET", "/health"), get("/status").catch((e) => e)]);
    const raft = (health.json && health.json.raft) || {};
    el.appendChild(h("h3", {}, `This node (${raft.nodeId ?? "?"})`));
    el.appendChild(
      figures([
        ["Role", raft.role, "role"],
        ["Term", raft.term, "term"],
        ["Leader", raft.leaderId ?? "none", "leader"],
        ["Commit", raft.commit, "commit"],
        ["Applied", raft.applied, "applied"],
        ["Last log", st instanceof Error ? "–" : st.raft.last_log, "lastLog"],
        ["Quorum ack (ms)", st instanceof Error ? "–" : st.raft.quorum_ack_ms ?? "–", "quorumAck"],
        ["Storage", yes(raft.storageReady), "storage"],
        ["Log format", `${raft.clusterVersion} (reads up to ${raft.kinds})`, "format"],
      ]),
    );
    if (raft.apply && raft.apply.failure) el.appendChild(h("div", { class: "error" }, `Apply failure: ${raft.apply.failure}`));
    await members(el, raft.leaderId);
    await nodes(el);
  },
};

/** Every member's own role, term and indexes, gathered by this node over the raft port
 * (`/api/v1/system/raft/nodes`; admin-only with JWT on). */
async function nodes(el) {
  el.appendChild(h("h3", {}, "Each node's own figures"));
  const r = await request("GET", "/api/v1/system/raft/nodes");
  if (r.status === 401 || r.status === 403) {
    el.appendChild(h("p", { class: "muted" }, "Reading every node's figures needs an admin token (or the raft token) when JWT is on."));
    return;
  }
  if (!r.json || !Array.isArray(r.json.nodes)) {
    el.appendChild(h("div", { class: "error" }, `GET /api/v1/system/raft/nodes: HTTP ${r.status}`));
    return;
  }
  const dash = (v) => (v === undefined || v === null ? "–" : v);
  el.appendChild(
    h(
      "div",
      { "data-nodes": "" },
      table(
        [
          { title: "Node", get: (n) => n.nodeId },
          { title: "Reachable", get: (n) => yes(n.reachable) },
          { title: "Status", get: (n) => dash(n.status) },
          { title: "Role", get: (n) => dash(n.role) },
          { title: "Term", get: (n) => dash(n.term), num: true },
          { title: "Commit", get: (n) => dash(n.commit), num: true },
          { title: "Applied", get: (n) => dash(n.applied), num: true },
          { title: "Commit − applied", get: (n) => (n.commit >= 0 && n.applied >= 0 ? n.commit - n.applied : "–"), num: true },
        ],
        r.json.nodes,
        "No node answered.",
      ),
    ),
  );
}

// --- ephemeral ----------------------------------------------------------------------------

const ephemeral = {
  async render(el) {
    el.appendChild(h("h2", {}, "Ephemeral queues"));
    const r = await guarded(el, "/api/v1/ephemeral/queues", () => get("/api/v1/ephemeral/queues"));
    if (!r) return;
    el.appendChild(figures([["Queues", r.count, "count"], ["Held", bytes(r.bytes), "bytes"]]));
    el.appendChild(
      table(
        [
          { title: "Queue", get: (x) => x.queue },
          { title: "Tier", get: (x) => x.tier },
          { title: "Depth", get: (x) => x.depth, num: true },
          { title: "Partitions", get: (x) => x.partitions, num: true },
          { title: "Groups", get: (x) => x.groups, num: true },
          { title: "Bytes", get: (x) => bytes(x.bytes) },
          { title: "Dropped", get: (x) => text(x.drops) },
          { title: "Options", get: (x) => text(x.options, 80) },
        ],
        r.queues,
        "No ephemeral queue.",
      ),
    );
    const st = await request("GET", "/status");
    if (st.status === 200 && st.json.ephemeral) {
      const e = st.json.ephemeral;
      el.appendChild(h("h3", {}, "This node"));
      el.appendChild(
        figures([
          ["Messages", e.messages, "messages"],
          ["Budget", bytes(e.budgetBytes), "budget"],
          ["Lost on crashes", e.lostOnCrash, "lostOnCrash"],
        ]),
      );
    }
  },
};

export const views = { overview, queues, queue, groups, group, messages, message, dlq, kv, timers, sink, log, ephemeral };
