// dom.js: building the page's elements: `el` for any element, `table` for a table of rows, a
// canvas sized for the screen's pixels, the tooltip, and the colours of series and call sites.

const COLORS = ["#42a5f5", "#66bb6a", "#ffa726", "#ab47bc", "#26c6da", "#ef5350", "#8d6e63",
  "#d4e157", "#ec407a", "#78909c"];

// An element: `attrs` are attributes, but for `text` (its text) and `cls` (its class); `kids` are
// appended (null ones left out).
function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "text") e.textContent = v;
    else if (k === "cls") e.className = v;
    else e.setAttribute(k, v);
  }
  for (const k of kids) if (k != null) e.append(k);
  return e;
}

// A table of `rows` under `head`; `numeric[i]` right-aligns column i, and a first column of text
// is a call site (it may break inside a path).
function table(head, rows, numeric) {
  const t = el("table", {}, el("tr", {}, ...head.map((h, i) =>
    el("th", { cls: numeric[i] ? "n" : "", text: h }))));
  for (const r of rows) {
    t.append(el("tr", {}, ...r.map((c, i) =>
      el("td", { cls: numeric[i] ? "n" : (i === 0 ? "site" : ""), text: String(c) }))));
  }
  return t;
}

// Sizes canvas `c` to its width on the page and `height` CSS pixels, in device pixels: its
// context `g` draws in CSS pixels, `w` wide and `h` high.
function canvasSize(c, height) {
  const dpr = window.devicePixelRatio || 1;
  const w = Math.max(200, c.clientWidth || c.parentElement.clientWidth || 800);
  c.width = Math.round(w * dpr);
  c.height = Math.round(height * dpr);
  c.style.height = height + "px";
  const g = c.getContext("2d");
  g.setTransform(dpr, 0, 0, dpr, 0, 0);
  return { g, w, h: height };
}

// The tooltip (#tip) beside the pointer of `ev`, saying `text`.
function showTip(ev, text) {
  const tip = document.getElementById("tip");
  tip.textContent = text;
  tip.hidden = false;
  tip.style.left = Math.min(ev.clientX + 12, window.innerWidth - 360) + "px";
  tip.style.top = (ev.clientY + 14) + "px";
}
function hideTip() { document.getElementById("tip").hidden = true; }

/* Starts a view's chart in `box`: clears the canvas, keeps where the plot lies and the range shown
   (the pointer and the tests read them), and says the range against the whole run's `end`. */
function beginChart(view, g, w, h, box, end) {
  view.box = box;
  g.clearRect(0, 0, w, h);
  g.font = "11px system-ui, sans-serif";
  view.chart.dataset.plotX = box.x;
  view.chart.dataset.plotW = box.w;
  view.rangeEl.dataset.from = Math.round(view.from);
  view.rangeEl.dataset.to = Math.round(view.to);
  view.rangeEl.textContent = "showing +" + dur(view.from) + " to +" + dur(view.to) + " of " + dur(end);
}
