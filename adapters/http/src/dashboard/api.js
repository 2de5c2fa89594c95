// Calls to this node's API with the user's token (sessionStorage), bounded in time.

const KEY = "queen.token";
const LIMIT_MS = 10000;

/** A call that did not answer 2xx: its status and the JSON error the node sent. */
export class HttpError extends Error {
  constructor(status, json, text) {
    super((json && json.error) || text || `HTTP ${status}`);
    this.status = status;
    this.json = json;
    this.text = text;
  }
}

let unauthorized = () => {};

/** Called with the node's error body each time a call answers 401. */
export function onUnauthorized(fn) {
  unauthorized = fn;
}

export function token() {
  return sessionStorage.getItem(KEY);
}

export function setToken(t) {
  if (t) sessionStorage.setItem(KEY, t);
  else sessionStorage.removeItem(KEY);
}

/** One call: {status, json, text}; never throws for an HTTP status. */
export async function request(method, path, body) {
  const headers = {};
  const t = token();
  if (t) headers.authorization = `Bearer ${t}`;
  if (body !== undefined) headers["content-type"] = "application/json";
  const ctl = new AbortController();
  const timer = setTimeout(() => ctl.abort(), LIMIT_MS);
  let res;
  try {
    res = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      signal: ctl.signal,
      cache: "no-store",
    });
  } catch (e) {
    throw new HttpError(0, null, `${method} ${path}: ${e.name === "AbortError" ? "no answer within 10 s" : e.message}`);
  } finally {
    clearTimeout(timer);
  }
  const text = await res.text();
  let json = null;
  try {
    json = text ? JSON.parse(text) : null;
  } catch {
    json = null;
  }
  if (res.status === 401) unauthorized(json);
  return { status: res.status, json, text };
}

/** A call that must answer 2xx: its JSON (or text), else an HttpError. */
export async function call(method, path, body) {
  const r = await request(method, path, body);
  if (r.status < 200 || r.status > 299) throw new HttpError(r.status, r.json, r.text);
  return r.json ?? r.text;
}

export const get = (path) => call("GET", path);

/** A path with its query: q("/api/v1/messages", {queue: "a b"}) -> "/api/v1/messages?queue=a+b". */
export function q(path, params) {
  const s = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v !== undefined && v !== null && v !== "") s.set(k, String(v));
  }
  const text = s.toString();
  return text ? `${path}?${text}` : path;
}

/** A path segment: enc("a/b") -> "a%2Fb". */
export const enc = encodeURIComponent;

/** The Prometheus text of this node, summed per family: {"queen_acks_total": 12, ...}. */
export async function metrics() {
  const text = await call("GET", "/metrics/prometheus");
  const out = {};
  for (const line of String(text).split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    const v = Number(m[3]);
    if (Number.isFinite(v)) out[m[1]] = (out[m[1]] || 0) + v;
  }
  return out;
}
