// The icicle graph of what was live (js/flame.js): its tree of frames and what its canvas states.
"use strict";
const test = require("node:test");
const assert = require("node:assert");
const { load } = require("./load.js");
const { fakePage, FakeElement } = require("./fake_dom.js");

const $ = load(["format.js", "dom.js", "flame.js"]);

const items = [
  { bytes: 64, module: "libcudart.so", site: "w.py:5 in load < w.py:20 in <module>" },
  { bytes: 8, module: "libcudart.so", site: "w.py:12 in forward < w.py:22 in <module>" },
  { bytes: 8, module: "libcublas.so", site: "w.py:12 in forward < w.py:22 in <module>" },
  { bytes: 4, module: "libtorch.so", site: "deep.py:3 in f < deep.py:9 in g" },
  { bytes: 2, module: "libx.so", site: "" },
];

// The tree as nested [name, bytes, kids...], kids in insertion order.
function shape(node) { return [node.name, node.bytes, ...[...node.kids.values()].map(shape)]; }

test("frames nest from the outermost down, the module under the innermost", () => {
  const { root, depth } = $("flameTree")(items);
  assert.deepStrictEqual(shape(root), ["all", 86,
    ["w.py:20 in <module>", 64, ["w.py:5 in load", 64, ["[libcudart.so]", 64]]],
    ["w.py:22 in <module>", 16, ["w.py:12 in forward", 16, ["[libcudart.so]", 8], ["[libcublas.so]", 8]]],
    ["\u2026 outer frames not recorded", 4, ["deep.py:9 in g", 4, ["deep.py:3 in f", 4, ["[libtorch.so]", 4]]]],
    ["no Python call site", 2, ["[libx.so]", 2]]]);
  assert.strictEqual(depth, 5, "the cut stack: root, its own root, two frames, the module");
  const leaf = root.kids.get("w.py:20 in <module>").kids.get("w.py:5 in load").kids.get("[libcudart.so]");
  assert.deepStrictEqual(leaf.items, [items[0]], "each leaf keeps its allocations");
});

test("the widest path follows the most bytes at each level", () => {
  const { root } = $("flameTree")(items);
  assert.deepStrictEqual($("widestPath")(root), ["w.py:20 in <module>", "w.py:5 in load", "[libcudart.so]"]);
  assert.deepStrictEqual($("widestPath")($("flameTree")([]).root), []);
});

test("the canvas states the widest path's innermost frame and module, and draws sized labels", () => {
  const page = fakePage();
  const $$ = load(["format.js", "dom.js", "flame.js"], page);
  const canvas = new FakeElement("canvas");
  $$("drawFlame")(canvas, items.map(it => ({ ...it, text: () => "one" })), 86);
  assert.strictEqual(canvas.dataset.topFrame, "w.py:5 in load");
  assert.strictEqual(canvas.dataset.topModule, "libcudart.so");
  assert.strictEqual(canvas.dataset.topPath, "w.py:20 in <module> > w.py:5 in load > [libcudart.so]");
  assert.strictEqual(canvas.dataset.total, "86");
  assert.strictEqual(canvas.style.height, 5 * 18 + 2 + "px");
  assert.ok(canvas.getContext().texts.includes("all 86 B"), canvas.getContext().texts.join(" | "));
  // Hovering the root says its bytes and share; hovering nothing hides the tip.
  canvas.onmousemove({ clientX: 10, clientY: 5 });
  const tip = page.document.getElementById("tip");
  assert.strictEqual(tip.hidden, false);
  assert.strictEqual(tip.textContent, "all\n86 B (100.0 % of what was live)");
  canvas.onmousemove({ clientX: 10, clientY: 500 });
  assert.strictEqual(tip.hidden, true);
});
