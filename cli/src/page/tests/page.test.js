// The whole page (every module, main.js last, as html.rs puts them in the page) over a fake DOM:
// what it states of a timeline, and what a click, a drag, the wheel and a double-click do.
"use strict";
const test = require("node:test");
const assert = require("node:assert");
const { load } = require("./load.js");
const { fakePage } = require("./fake_dom.js");
const { timeline, oomReport, pageData, S2 } = require("./runs.js");

// The page of `data`, drawn: its document, window and `byId`.
function open(data) {
  const page = fakePage(data);
  load(null, page);
  return { ...page, byId: id => page.document.getElementById(id) };
}

// The chart's x of time `t` µs in the span [from, to] shown (the plot's box starts at data-plot-x).
function xOf(p, t) {
  const c = p.byId("chart").dataset, r = p.byId("range").dataset;
  return +c.plotX + (t - +r.from) / (+r.to - +r.from) * +c.plotW;
}
function click(p, x) {
  p.byId("chart").fire("mousedown", { clientX: x, button: 0, preventDefault() {} });
  p.window.fire("mouseup", { clientX: x });
}
const range = p => [+p.byId("range").dataset.from, +p.byId("range").dataset.to];

test("a timeline's page states its figures and what was live at the peak", () => {
  const p = open(pageData(timeline()));
  assert.strictEqual(p.document.body.dataset.ready, "1");
  assert.strictEqual(p.byId("peak").textContent, "4.00 KiB");
  assert.strictEqual(p.byId("peak").dataset.bytes, "4096");
  assert.strictEqual(p.byId("top-module").dataset.name, "libB.so");
  assert.strictEqual(p.byId("top-site").textContent, "a.py:2 in f", "the innermost frame");
  assert.strictEqual(p.byId("top-site").getAttribute("title"), S2);
  const instant = p.byId("instant");
  assert.strictEqual(instant.textContent, "live at +20 µs: 4.00 KiB in 2 allocations (the peak)");
  assert.strictEqual(instant.dataset.t, "20");
  assert.strictEqual(instant.dataset.bytes, "4096");
  assert.strictEqual(p.byId("flame").dataset.topFrame, "a.py:2 in f");
  assert.strictEqual(p.byId("flame").dataset.topModule, "libB.so");
  const rows = p.byId("by-module").byTag("tr").map(r => r.children.map(c => c.textContent));
  assert.deepStrictEqual(rows, [["module", "bytes", "share"], ["libB.so", "3.00 KiB", "75.0 %"], ["libA.so", "1.00 KiB", "25.0 %"]]);
  assert.deepStrictEqual(range(p), [0, 100]);
});

test("the chart says a ceiling above its range in words and marks the refusal and the peak", () => {
  const p = open(pageData(timeline()));
  const chart = p.byId("chart");
  assert.strictEqual(chart.dataset.ceilingAbove, "8192");
  const texts = chart.getContext().texts;
  for (const want of ["\u2191 ceiling 8.00 KiB, above this range", "peak 4.00 KiB", "×", "step", "+0 µs"]) {
    assert.ok(texts.includes(want), want + " not among " + JSON.stringify(texts));
  }
  assert.deepStrictEqual(p.byId("legend").children.map(c => c.textContent), ["■ libB.so", "■ libA.so"]);
  p.byId("mode-total").onclick();
  assert.strictEqual(p.byId("legend").textContent, "used on device 0");
  assert.strictEqual(p.byId("mode-total").className, "on");
});

test("a click picks the instant, a drag zooms in, the wheel zooms, a double-click shows the whole run", () => {
  const p = open(pageData(timeline()));
  click(p, xOf(p, 50));
  assert.strictEqual(p.byId("instant").dataset.t, "50");
  assert.strictEqual(p.byId("instant").dataset.bytes, "1024", "the 3 KiB freed at 40");
  assert.strictEqual(p.byId("instant").textContent, "live at +50 µs: 1.00 KiB in 1 allocation");
  // A click within 3 pixels of the peak lands on it.
  click(p, xOf(p, 20) + 2);
  assert.strictEqual(p.byId("instant").dataset.t, "20");
  const chart = p.byId("chart");
  chart.fire("mousedown", { clientX: xOf(p, 25), button: 0, preventDefault() {} });
  p.window.fire("mousemove", { clientX: xOf(p, 40) });
  p.window.fire("mouseup", { clientX: xOf(p, 75) });
  assert.deepStrictEqual(range(p), [25, 75]);
  chart.fire("wheel", { clientX: xOf(p, 50), deltaX: 0, deltaY: -200, preventDefault() {} });
  const [from, to] = range(p);
  assert.ok(to - from < 50 && from > 25 && to < 75, `the wheel zoomed in around 50: ${from} to ${to}`);
  chart.fire("dblclick", {});
  assert.deepStrictEqual(range(p), [0, 100]);
  // Hovering says the time and what was used then.
  chart.fire("mousemove", { clientX: xOf(p, 30), clientY: 5 });
  assert.strictEqual(p.byId("tip").textContent, "+30 µs\nused 4.00 KiB\nclick: what was live then");
});

test("a click snaps to the highest point within 3 pixels, else to the peak within 3, else stays", () => {
  const $ = load(["format.js", "dom.js", "series.js", "timeline.js", "pointer.js"]);
  const used = Float64Array.from([100, 50, 20]);
  // A peak at 30 µs that is no change of `used` here (the series restarted), one pixel a µs.
  const view = Object.create($("TimelineView").prototype);
  Object.assign(view, { run: { end: 100 }, from: 0, to: 100, dev: 0,
    series: [{ times: Float64Array.from([10, 12, 60]), used, d: { peak_t: 30, peak: 4096 } }] });
  const box = { x: 0, w: 100 }, snap = t => view.snap(t, box);
  assert.strictEqual(snap(11.5), 10, "the higher of two points within 3 pixels");
  assert.strictEqual(snap(14.5), 12, "the one point within 3 pixels");
  assert.strictEqual(snap(32.5), 30, "no point near: the peak within 3 pixels");
  assert.strictEqual(snap(45), 45, "nothing near: where it was clicked");
  assert.strictEqual(snap(150), 100, "inside the run");
});

test("two runs side by side: the second's ids end in -2, and the comparison follows", () => {
  const p = open(pageData(timeline(), oomReport()));
  assert.strictEqual(p.byId("peak").textContent, "4.00 KiB");
  assert.strictEqual(p.byId("peak-2").textContent, "1.00 MiB");
  assert.strictEqual(p.byId("run-2").dataset.source, "oom");
  assert.ok(p.byId("oom-2"), "the out-of-memory table of the second run");
  assert.strictEqual(p.byId("peak-change").textContent, "peak 4.00 KiB → 1.00 MiB");
  assert.strictEqual(p.document.body.dataset.ready, "1");
});

test("a timeline without device memory says so", () => {
  const run = timeline();
  run.devices = [];
  run.allocs = { d: [], t: [], e: [], b: [], m: [], s: [], h: [] };
  const p = open(pageData(run));
  assert.ok(p.byId("chart").getContext().texts.includes("no device memory in this timeline"));
  assert.strictEqual(p.byId("instant").textContent, "live at +0 µs: 0 B in 0 allocations");
});
