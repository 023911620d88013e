// Sizes, durations and shares as the page writes them (js/format.js).
"use strict";
const test = require("node:test");
const assert = require("node:assert");
const { load, SIZES } = require("./load.js");

const $ = load(["format.js"]);

test("the page writes every size as Rust's format_size does (sizes.json, from reader/src/size.rs)", () => {
  const size = $("sizeFormatter")(SIZES.rule);
  assert.ok(SIZES.cases.length > 100, "sizes.json holds the cases");
  const wrong = SIZES.cases.filter(([bytes, text]) => size(bytes) !== text)
    .map(([bytes, text]) => bytes + ": page " + JSON.stringify(size(bytes)) + ", Rust " + JSON.stringify(text));
  assert.deepStrictEqual(wrong, []);
});

test("sizes follow the rule given, with no unit or threshold of their own", () => {
  const size = $("sizeFormatter")({ units: ["b", "kb", "Mb"], step: 1000, fine_below: 10, fine_digits: 3, coarse_digits: 0 });
  assert.strictEqual(size(999), "999 b");
  assert.strictEqual(size(1000), "1.000 kb");
  assert.strictEqual(size(9999), "9.999 kb");
  assert.strictEqual(size(10000), "10 kb");
  assert.strictEqual(size(5e9), "5000 Mb", "the last unit holds whatever is larger");
});

test("an exact tie goes to the even digit, as Rust's {:.N}; anything else to the nearest", () => {
  const fixed = $("fixed");
  assert.strictEqual(fixed(1.125, 2), "1.12");
  assert.strictEqual(fixed(1.375, 2), "1.38");
  assert.strictEqual(fixed(100.25, 1), "100.2");
  assert.strictEqual(fixed(100.75, 1), "100.8");
  assert.strictEqual(fixed(1.005, 2), "1.00", "1.005 is a little under it as a double: no tie");
  assert.strictEqual(fixed(1.1250000001, 2), "1.13");
  assert.strictEqual(fixed(1023.999, 1), "1024.0");
});

test("durations pick their unit and precision", () => {
  const dur = $("dur");
  assert.strictEqual(dur(0), "0 µs");
  assert.strictEqual(dur(999), "999 µs");
  assert.strictEqual(dur(1000), "1.00 ms");
  assert.strictEqual(dur(12345), "12.3 ms");
  assert.strictEqual(dur(2.5e6), "2.50 s");
  assert.strictEqual(dur(12.5e6), "12.5 s");
  assert.strictEqual(dur(9e7), "1.5 min");
  assert.strictEqual(dur(-2000), "-2.00 ms");
});

test("shares and innermost frames", () => {
  assert.strictEqual($("share")(1, 3), "33.3 %");
  assert.strictEqual($("share")(5, 0), "-");
  assert.strictEqual($("innermost")("a.py:2 in f < a.py:9 in <module>"), "a.py:2 in f");
  assert.strictEqual($("innermost")(""), "no Python call site");
});
