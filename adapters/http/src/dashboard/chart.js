// A small SVG line chart: series of [time ms, value] points over a shared time axis.

import { h, num } from "./dom.js";

const SVG_NS = "http://www.w3.org/2000/svg";
const W = 600;
const H = 160;
const PAD = { left: 56, right: 10, top: 10, bottom: 22 };

function svg(tag, attrs = {}, text) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  if (text !== undefined) el.textContent = text;
  return el;
}

/** A round upper bound for the y axis (1, 2, 5 × 10^n). */
function ceiling(v) {
  if (!(v > 0)) return 1;
  const p = 10 ** Math.floor(Math.log10(v));
  for (const m of [1, 2, 5, 10]) if (v <= m * p) return m * p;
  return 10 * p;
}

/**
 * lineChart({title, unit, series: [{name, points: [[t, v], ...]}], key})
 * Series are drawn in the order given, colours s0, s1, ... from the stylesheet.
 */
export function lineChart({ title, unit, series, key }) {
  const all = series.flatMap((s) => s.points);
  const box = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": title, class: "chart" });
  const x0 = PAD.left;
  const x1 = W - PAD.right;
  const y0 = H - PAD.bottom;
  const y1 = PAD.top;
  box.appendChild(svg("line", { x1: x0, y1: y0, x2: x1, y2: y0, class: "axis" }));
  box.appendChild(svg("line", { x1: x0, y1: y0, x2: x0, y2: y1, class: "axis" }));
  const last = {};
  if (all.length >= 1) {
    const tMin = Math.min(...all.map((p) => p[0]));
    const tMax = Math.max(...all.map((p) => p[0]));
    const vMax = ceiling(Math.max(...all.map((p) => p[1])));
    const span = Math.max(tMax - tMin, 1);
    const x = (t) => x0 + ((t - tMin) / span) * (x1 - x0);
    const y = (v) => y0 - (v / vMax) * (y0 - y1);
    box.appendChild(svg("line", { x1: x0, y1, x2: x1, y2: y1, class: "grid" }));
    box.appendChild(svg("text", { x: x0 - 4, y: y1 + 4, class: "label end" }, num(vMax)));
    box.appendChild(svg("text", { x: x0 - 4, y: y0, class: "label end" }, "0"));
    box.appendChild(svg("text", { x: x0, y: H - 6, class: "label" }, `${Math.round(span / 1000)} s ago`));
    box.appendChild(svg("text", { x: x1, y: H - 6, class: "label end" }, "now"));
    series.forEach((s, i) => {
      if (s.points.length === 0) return;
      const pts = s.points.map(([t, v]) => `${x(t).toFixed(1)},${y(v).toFixed(1)}`).join(" ");
      box.appendChild(svg("polyline", { points: pts, class: `line s${i}` }));
      const [lt, lv] = s.points[s.points.length - 1];
      box.appendChild(svg("circle", { cx: x(lt).toFixed(1), cy: y(lv).toFixed(1), r: 3, class: `dot s${i}` }));
      last[s.name] = lv;
    });
  } else {
    box.appendChild(svg("text", { x: W / 2, y: H / 2, class: "label middle" }, "waiting for two samples…"));
  }
  const legend = h(
    "ul",
    { class: "legend" },
    series.map((s, i) =>
      h("li", {}, h("span", { class: `swatch s${i}` }), `${s.name}: `, h("strong", { "data-series": s.name }, s.name in last ? num(last[s.name]) : "–"), unit ? ` ${unit}` : ""),
    ),
  );
  return h("figure", { class: "chart-box", "data-chart": key }, h("figcaption", {}, title), box, legend);
}
