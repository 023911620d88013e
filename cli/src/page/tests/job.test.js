// The page of the processes of one job (job.js, over a fake DOM): its lanes, the table of which
// rank peaked when, the groups' joint peaks, and picking the process shown below.
"use strict";
const test = require("node:test");
const assert = require("node:assert");
const { load } = require("./load.js");
const { fakePage } = require("./fake_dom.js");
const { jobData, timeline, pageData } = require("./runs.js");

function open(data) {
  const page = fakePage(data);
  load(null, page);
  return { ...page, byId: id => page.document.getElementById(id) };
}
const cells = tr => tr.children.map(c => c.textContent);

test("the lanes: each process's devices, then each group's joint line", () => {
  const $ = load(null, fakePage({ runs: [], sizes: jobData().sizes }));
  const d = jobData(), lanes = $("jobLanes")(d.job, d.runs);
  assert.deepStrictEqual(lanes.map(l => l.label),
    ["rank 0 · device 0", "rank 1 · device 0", "pid 13 · device 1", "group pair · device 0"]);
  assert.deepStrictEqual(lanes.map(l => l.scale), ["proc", "proc", "proc", "group"]);
  assert.deepStrictEqual([...lanes[3].s.used], [1024, 2048, 5120, 3072, 0], "the joint used, decoded");
  assert.deepStrictEqual([...lanes[0].s.times], [20, 30, 70]);
});

test("a job's page states each rank's peak and when, the highest marked, and the clock", () => {
  const p = open(jobData());
  assert.strictEqual(p.document.body.dataset.ready, "1");
  assert.strictEqual(p.byId("job").hidden, false);
  const rows = p.byId("ranks").byTag("tr");
  assert.deepStrictEqual(cells(rows[0]), ["rank", "pid", "host", "devices", "peak", "on", "at", "group", ""]);
  assert.deepStrictEqual(rows.slice(1).map(cells), [
    ["0", "11", "n1", "0", "2.00 KiB", "device 0", "+30 µs", "pair", ""],
    ["1", "12", "n1", "0", "3.00 KiB", "device 0", "+40 µs", "pair", "highest"],
    ["-", "13", "n1", "1", "1.00 KiB", "device 1", "+10 µs", "-", ""]]);
  assert.deepStrictEqual(rows.slice(1).map(r => [r.dataset.pid, r.dataset.bytes, r.dataset.t]),
    [["11", "2048", "30"], ["12", "3072", "40"], ["13", "1024", "10"]]);
  assert.strictEqual(rows[2].className, "top");
  const top = p.byId("job-top");
  assert.deepStrictEqual([top.dataset.pid, top.dataset.rank, top.dataset.bytes], ["12", "1", "3072"]);
  assert.strictEqual(top.textContent, "rank 1: 3.00 KiB");
  assert.strictEqual(p.byId("job-clock").dataset.clock, "monotonic");
  assert.match(p.byId("job-clock").textContent, /CLOCK_MONOTONIC of host n1/);
  const groups = p.byId("groups").byTag("tr").slice(1).map(cells);
  assert.deepStrictEqual(groups, [["pair", "0", "rank 0, rank 1", "5.00 KiB", "+40 µs", "5.00 KiB"]]);
  const texts = p.byId("job-chart").getContext().texts;
  for (const want of ["rank 0 · device 0", "pid 13 · device 1", "group pair · device 0", "peak 3.00 KiB", "5.00 KiB", "+0 µs"]) {
    assert.ok(texts.includes(want), want + " not among " + JSON.stringify(texts));
  }
});

test("the highest rank's own view shows below, at its peak; a row or a lane picks another", () => {
  const p = open(jobData());
  const sections = () => p.byId("runs").children.map(s => [s.id, s.hidden]);
  assert.deepStrictEqual(sections(), [["run-2", false]], "only rank 1's view is made");
  assert.strictEqual(p.byId("peak-2").dataset.bytes, "3072");
  assert.strictEqual(p.byId("range-2").dataset.to, "80", "its chart on the job's axis");
  assert.strictEqual(p.byId("job-show").value, 1);
  // A row: that process at its peak.
  p.byId("ranks").byTag("tr")[1].onclick();
  assert.deepStrictEqual(sections(), [["run-2", true], ["run", false]]);
  assert.strictEqual(p.byId("instant").dataset.t, "30");
  // A click on pid 13's lane (the third) at 10 µs.
  const chart = p.byId("job-chart"), c = chart.dataset;
  const x = +c.plotX + 10 / 80 * +c.plotW, y = 6 + 2 * 48 + 20;
  chart.fire("mousedown", { clientX: x, clientY: y, button: 0, preventDefault() {} });
  p.window.fire("mouseup", { clientX: x, clientY: y });
  assert.strictEqual(chart.dataset.shown, "2");
  assert.deepStrictEqual(sections(), [["run-2", true], ["run", true], ["run-3", false]]);
  assert.strictEqual(p.byId("instant-3").dataset.t, "10");
  // A drag zooms every lane; a double-click shows the whole job.
  chart.fire("mousedown", { clientX: +c.plotX + 0.25 * +c.plotW, clientY: 20, button: 0, preventDefault() {} });
  p.window.fire("mouseup", { clientX: +c.plotX + 0.5 * +c.plotW, clientY: 20 });
  assert.deepStrictEqual([+p.byId("job-range").dataset.from, +p.byId("job-range").dataset.to], [20, 40]);
  chart.fire("dblclick", {});
  assert.deepStrictEqual([+p.byId("job-range").dataset.from, +p.byId("job-range").dataset.to], [0, 80]);
});

test("a page of one run has no job section", () => {
  const p = open(pageData(timeline()));
  assert.strictEqual(p.byId("job").hidden, true);
  assert.strictEqual(p.byId("job").children.length, 0);
});
