// The runs without a timeline and the comparison of two runs (js/report.js), and tables (js/dom.js).
"use strict";
const test = require("node:test");
const assert = require("node:assert");
const { load } = require("./load.js");
const { fakePage } = require("./fake_dom.js");
const { timeline, oomReport, S1, S2 } = require("./runs.js");

// The cells of a table element, row by row.
function cells(t) { return t.byTag("tr").map(r => r.children.map(c => c.textContent)); }

test("a table has its head, then a row per row; numbers right-aligned, a first column of text a site", () => {
  const $ = load(["format.js", "dom.js"]);
  const t = $("table")(["site", "bytes"], [["a.py:1", 5], ["b.py:2", 6]], [0, 1]);
  assert.deepStrictEqual(cells(t), [["site", "bytes"], ["a.py:1", "5"], ["b.py:2", "6"]]);
  assert.deepStrictEqual(t.byTag("td").map(c => c.className), ["site", "n", "site", "n"]);
  assert.deepStrictEqual(t.byTag("th").map(c => c.className), ["", "n"]);
});

test("an out-of-memory report shows the refused request first, then what was held on its device", () => {
  const page = fakePage(), $ = load(["format.js", "dom.js", "report.js"], page);
  const root = page.document.createElement("section");
  $("reportView")(oomReport(), root, "");
  const oom = [...root.all()].find(e => e.id === "oom");
  assert.deepStrictEqual(cells(oom), [
    ["", "bytes", "", "module", "site"],
    ["refused: cudaMalloc (over the ceiling)", "4.00 MiB", "", "libB.so", S2],
    ["held", "1.00 MiB", "", "libA.so", S1],
  ]);
  const bars = oom.byTag("div").map(b => [b.className, b.getAttribute("style")]);
  assert.deepStrictEqual(bars, [["bar refused", "width:100.0%"], ["bar", "width:25.0%"]]);
  const title = [...root.all()].find(e => e.id === "oom-title");
  assert.strictEqual(title.textContent, "out of memory on device 0: 4.00 MiB asked with 1.00 MiB in use under a ceiling of 2.00 MiB");
  assert.ok(root.textContent.includes("3 smaller allocations not listed"));
  const devices = root.byTag("table")[1];
  assert.deepStrictEqual(cells(devices)[1], ["0", "1.00 MiB", "1.00 MiB", "2.00 MiB", "1"]);
  assert.deepStrictEqual(cells([...root.all()].find(e => e.id === "by-site").byTag("table")[0])[1],
    [S1, "1.00 MiB", "3.00 MiB", "1"]);
  assert.ok(!root.textContent.includes("held at exit"), "an out-of-memory report's live list is its bars");
});

test("an exit report lists what was held at exit; a live process says it has no timeline", () => {
  const page = fakePage(), $ = load(["format.js", "dom.js", "report.js"], page);
  const run = oomReport();
  run.source = "report";
  run.report.oom = null;
  run.report.by_site = [];
  const root = page.document.createElement("section");
  $("reportView")(run, root, "-2");
  const tables = root.byTag("table");
  assert.deepStrictEqual(cells(tables[tables.length - 1]), [["site", "bytes", "module", "age"],
    [S1, "1.00 MiB", "libA.so", "2.50 s"], ["no Python call site", "1.00 MiB", "libC.so", "1.00 s"]]);
  assert.ok(root.textContent.includes("no call sites: run the program with --stacks python:1MiB"));
  assert.ok([...root.all()].some(e => e.id === "by-module-2"), "the second run's ids end in -2");
  run.source = "live";
  const live = page.document.createElement("section");
  $("reportView")(run, live, "");
  assert.ok(live.textContent.startsWith("a live process has no timeline"));
});

test("two runs: the change of peak and each site's peak in both, largest first", () => {
  const page = fakePage(), $ = load(["format.js", "dom.js", "report.js"], page);
  const a = timeline(), b = oomReport();
  assert.deepStrictEqual($("sitePeakRows")(a, b), [
    [S1, "1.00 KiB", "3.00 MiB", "+3.00 MiB"], [S2, "3.00 KiB", "0 B", "-3.00 KiB"]]);
  $("compareView")(a, b);
  const sec = page.document.getElementById("compare");
  assert.strictEqual(sec.hidden, false);
  const change = page.document.getElementById("peak-change");
  assert.strictEqual(change.textContent, "peak 4.00 KiB → 1.00 MiB");
  assert.strictEqual(change.dataset.bytes, String((1 << 20) - 4096));
  assert.strictEqual(cells(sec.byTag("table")[0]).length, 3);
});
