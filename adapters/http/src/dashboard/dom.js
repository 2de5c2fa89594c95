// Building the page from API data without ever parsing it as HTML: every string goes in as a
// text node or an attribute value.

/** h("a", {href: "#x", class: "c"}, "text", child, [more]) */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === undefined || c === null || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else if (c instanceof Node) el.appendChild(c);
    else el.appendChild(document.createTextNode(String(c)));
  }
}

/** Replace an element's children. */
export function replace(el, ...children) {
  el.replaceChildren();
  append(el, children);
}

/** A number as people read it (1 234 567), or "–" for null. */
export function num(v) {
  if (v === null || v === undefined || v === "") return "–";
  if (typeof v !== "number") return String(v);
  return Number.isInteger(v) ? v.toLocaleString("en-US") : v.toLocaleString("en-US", { maximumFractionDigits: 2 });
}

export function bytes(v) {
  if (typeof v !== "number") return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i += 1;
  }
  return `${v.toFixed(i ? 1 : 0)} ${units[i]}`;
}

/** Any value as short text: JSON for objects, "–" for null. */
export function text(v, max = 120) {
  if (v === null || v === undefined) return "–";
  const s = typeof v === "string" ? v : JSON.stringify(v);
  return s.length > max ? `${s.slice(0, max)}…` : s;
}

/** A table: columns [{title, get: row => text or Node, num?: true}], rows; "none" when empty. */
export function table(columns, rows, empty = "None.") {
  if (!rows || rows.length === 0) return h("p", { class: "muted empty" }, empty);
  return h(
    "table",
    {},
    h("thead", {}, h("tr", {}, columns.map((c) => h("th", { class: c.num ? "num" : null }, c.title)))),
    h(
      "tbody",
      {},
      rows.map((r) =>
        h(
          "tr",
          {},
          columns.map((c) => {
            const v = c.get(r);
            return h("td", { class: c.num ? "num" : null }, v instanceof Node ? v : c.num ? num(v) : text(v, c.max));
          }),
        ),
      ),
    ),
  );
}

/** Figures as labelled cards: [[label, value, key]]; key becomes data-figure for tests. */
export function figures(items) {
  return h(
    "dl",
    { class: "figures" },
    items.map(([label, value, key]) =>
      h("div", { class: "figure" }, h("dt", {}, label), h("dd", { "data-figure": key }, value instanceof Node ? value : num(value))),
    ),
  );
}

/** A definition list of a plain object's fields. */
export function fields(obj) {
  return h(
    "dl",
    { class: "fields" },
    Object.entries(obj || {}).map(([k, v]) => [h("dt", {}, k), h("dd", {}, text(v, 400))]),
  );
}

/** JSON, pretty, in a <pre>. */
export function pre(v) {
  return h("pre", { class: "json" }, typeof v === "string" ? v : JSON.stringify(v, null, 2));
}

/** An error box with the node's JSON error. */
export function failure(e, what) {
  const body = e && e.json ? JSON.stringify(e.json) : e && e.message ? e.message : String(e);
  return h("div", { class: "error", role: "alert" }, h("strong", {}, what ? `${what}: ` : ""), e && e.status ? `HTTP ${e.status} ` : "", body);
}
