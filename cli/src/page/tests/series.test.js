// The computations on a timeline's data (js/series.js): decoding, min and max per pixel column,
// the lanes of scopes, what was live at an instant, what each group held.
"use strict";
const test = require("node:test");
const assert = require("node:assert");
const { load } = require("./load.js");

const $ = load(["series.js"]);

// A pseudo-random sequence, the same every run.
function numbers(n, seed) {
  const out = [];
  let x = seed;
  for (let i = 0; i < n; i++) { x = (x * 1103515245 + 12345) % 2147483648; out.push(x % 1000); }
  return out;
}

test("undelta gives back the values of their differences", () => {
  assert.deepStrictEqual([...$("undelta")([5, 3, -2, 0, 10])], [5, 8, 6, 6, 16]);
  assert.deepStrictEqual([...$("undelta")([])], []);
});

test("the pyramid's min and max of any range are those of the values in it", () => {
  const Pyramid = $("Pyramid");
  for (const n of [1, 2, 3, 7, 8, 33, 100]) {
    const values = Float64Array.from(numbers(n, n)), p = new Pyramid(values);
    for (let i0 = 0; i0 < n; i0++) {
      for (let i1 = i0 + 1; i1 <= n; i1++) {
        const part = [...values.slice(i0, i1)];
        assert.deepStrictEqual(p.range(i0, i1), [Math.min(...part), Math.max(...part)], `n ${n}, [${i0}, ${i1})`);
      }
    }
  }
  assert.deepStrictEqual(new Pyramid(Float64Array.from([4, 2])).range(1, 1), [Infinity, -Infinity]);
});

test("firstAtOrAfter finds the first time not before t", () => {
  const first = $("firstAtOrAfter"), times = [1, 3, 3, 7];
  assert.deepStrictEqual([0, 1, 2, 3, 4, 7, 8].map(t => first(times, t)), [0, 0, 1, 1, 3, 3, 4]);
  assert.strictEqual(first([], 5), 0);
});

// A device's series as the timeline view keeps it.
function series(times, used) {
  const u = Float64Array.from(used);
  return { times: Float64Array.from(times), used: u, pyramid: new ($("Pyramid"))(u) };
}

test("each pixel column holds the min and max of used in it, with the value carried into it", () => {
  // used: 0 until 10, 100 at 10, 300 at 11 (a spike), 50 at 12, 80 at 35.
  const s = series([10, 11, 12, 35], [100, 300, 50, 80]);
  const col = $("minMaxColumns")(s, 0, 40, 4);
  assert.strictEqual(col.n, 4);
  // [0, 10): 0 all along; [10, 20): from 0 (carried in) to the 300 spike; [20, 30): 50 carried;
  // [30, 40): 50 carried, then 80.
  assert.deepStrictEqual([...col.lo], [0, 0, 50, 50]);
  assert.deepStrictEqual([...col.hi], [0, 300, 50, 80]);
  // The last column holds a change at its end: the run's last event, drawn.
  const last = $("minMaxColumns")(s, 0, 35, 5);
  assert.deepStrictEqual([last.lo[4], last.hi[4]], [50, 80]);
  // Zoomed in on [11, 13): the spike's column and the one after it.
  const zoomed = $("minMaxColumns")(s, 11, 13, 2);
  assert.deepStrictEqual([...zoomed.lo], [100, 50]);
  assert.deepStrictEqual([...zoomed.hi], [300, 300]);
});

test("a column's min and max are those of a brute-force scan", () => {
  const times = numbers(500, 3).map((v, i) => i * 10 + (v % 10)), used = numbers(500, 4);
  const s = series(times, used), n = 37, from = 123, to = times[450], dt = (to - from) / n;
  const col = $("minMaxColumns")(s, from, to, n);
  for (let c = 0; c < n; c++) {
    const a = from + c * dt, b = from + (c + 1) * dt;
    const carried = times.filter(t => t < a).length;
    const inside = used.filter((u, i) => times[i] >= a && (times[i] < b || (c === n - 1 && times[i] <= to)));
    const before = carried > 0 ? used[carried - 1] : 0;
    assert.strictEqual(col.lo[c], Math.min(before, ...inside), "column " + c);
    assert.strictEqual(col.hi[c], Math.max(before, ...inside), "column " + c);
  }
});

test("scopes take the first lane free when they open, and at most six are drawn", () => {
  const lanes = $("scopeLanes");
  // b opens inside a, c after a closed, d never closes, e inside d.
  const got = lanes([["a", 0, 10], ["b", 5, 8], ["c", 10, 20], ["d", 30, null], ["e", 40, 50]]);
  assert.deepStrictEqual(got.lane, [0, 1, 0, 0, 1]);
  assert.strictEqual(got.count, 2);
  const nested = Array.from({ length: 8 }, (_, i) => ["s" + i, i, 100]);
  assert.strictEqual(lanes(nested).count, 6);
  assert.deepStrictEqual(lanes([]).lane, []);
});

// Four allocations: device 0 (0-10 µs, 1000 B; 5 µs to the end, 3000 B; 12-20 µs, 500 B) and one
// on device 1, with modules (m) and sites (s).
const allocs = { t: [0, 5, 0, 7], e: [10, -1, 20, 8], b: [1000, 3000, 7000, 500], d: [0, 0, 1, 0], m: [1, 2, 1, 1], s: [0, 1, 2, 2] };

test("spans decode starts and ends, held to the end being Infinity", () => {
  const spans = $("allocationSpans")(allocs);
  assert.deepStrictEqual([...spans.starts], [0, 5, 5, 12]);
  assert.deepStrictEqual([...spans.ends], [10, Infinity, 25, 20]);
});

test("what was live at an instant: made at or before it, not freed by then, on its device, largest first", () => {
  const spans = $("allocationSpans")(allocs), live = (dev, t) => $("liveAt")(allocs, spans, dev, t);
  assert.deepStrictEqual(live(0, 0), [0]);
  assert.deepStrictEqual(live(0, 5), [1, 0], "the 3000 B first");
  assert.deepStrictEqual(live(0, 10), [1], "freed at 10: no longer live at 10");
  assert.deepStrictEqual(live(0, 12), [1, 3]);
  assert.deepStrictEqual(live(0, 1e9), [1]);
  assert.deepStrictEqual(live(1, 6), [2]);
  assert.deepStrictEqual(live(0, -1), []);
});

test("groups rank by what they held at the instant, the tenth and after as other", () => {
  const spans = $("allocationSpans")(allocs);
  const ranked = $("rankGroups")(allocs, spans, allocs.m, 3, 0, 6);
  assert.deepStrictEqual(ranked.top, [2, 1, -1], "module 2 (3000 B), module 1 (1000 B), then other");
  assert.deepStrictEqual([...ranked.slot], [2, 1, 0], "module 0 held nothing: other");
  // Twelve groups of one allocation each, group k holding k + 1 bytes: the nine largest, then other.
  const many = { t: new Array(12).fill(0), e: new Array(12).fill(-1), b: Array.from({ length: 12 }, (_, k) => k + 1),
    d: new Array(12).fill(0), m: Array.from({ length: 12 }, (_, k) => k) };
  const top = $("rankGroups")(many, $("allocationSpans")(many), many.m, 12, 0, 0);
  assert.deepStrictEqual(top.top, [11, 10, 9, 8, 7, 6, 5, 4, 3, -1]);
  assert.deepStrictEqual([...top.slot].slice(0, 3), [9, 9, 9]);
});

test("what each group held at the end of each column", () => {
  const spans = $("allocationSpans")(allocs);
  const groups = $("rankGroups")(allocs, spans, allocs.m, 3, 0, 6);
  // Columns of 5 µs over [0, 20): module 2's 3000 B from 5 on; module 1's 1000 B over [0, 10) and
  // 500 B from 12 (held through the third column's end, freed at 20).
  const held = $("heldByGroup")(allocs, spans, allocs.m, groups, 0, 0, 20, 4).map(h => [...h]);
  assert.deepStrictEqual(held, [[0, 3000, 3000, 3000], [1000, 1000, 500, 500], [0, 0, 0, 0]]);
});

test("a long run's stacks, drawn from its moments, are what the whole run held at each moment", () => {
  // 300 allocations on two devices and three modules, at whole µs; moments between them.
  const n = 300, r = numbers(4 * n, 7), starts = [];
  const allocs = { d: [], t: [], e: [], b: [], m: [] };
  for (let i = 0; i < n; i++) {
    starts.push(i);
    allocs.d.push(r[4 * i] % 2);
    allocs.t.push(i === 0 ? 0 : 1);
    allocs.e.push(r[4 * i + 1] % 5 === 0 ? -1 : 1 + (r[4 * i + 1] % 40));
    allocs.b.push(1 + r[4 * i + 2]);
    allocs.m.push(r[4 * i + 3] % 3);
  }
  const spans = $("allocationSpans")(allocs);
  const moments = Array.from({ length: 30 }, (_, k) => 10 * k + 9.5);
  // The page keeps only the allocations live at a moment (start <= m < end).
  const live = i => moments.some(m => spans.starts[i] <= m && spans.ends[i] > m);
  const keptIdx = [...Array(n).keys()].filter(live);
  assert.ok(keptIdx.length < n, "some allocations live at no moment are left out");
  const kept = { d: [], t: [], e: [], b: [], m: [] };
  let last = 0;
  for (const i of keptIdx) {
    for (const k of ["d", "e", "b", "m"]) kept[k].push(allocs[k][i]);
    kept.t.push(starts[i] - last);
    last = starts[i];
  }
  const keptSpans = $("allocationSpans")(kept);
  for (const device of [0, 1]) {
    const groups = $("rankGroups")(allocs, spans, allocs.m, 3, device, 149.5);
    assert.deepStrictEqual($("rankGroups")(kept, keptSpans, kept.m, 3, device, 149.5), groups);
    // Columns of 10 µs over [-0.5, 299.5): each ends at a moment.
    const whole = $("heldByGroup")(allocs, spans, allocs.m, groups, device, -0.5, 299.5, 30).map(h => [...h]);
    const atMoments = $("heldByGroupAtMoments")(kept, keptSpans, kept.m, groups, device, moments, -0.5, 299.5, 30)
      .map(h => [...h]);
    assert.deepStrictEqual(atMoments, whole, `device ${device}`);
    // Columns of 5 µs: a column ending between two moments shows the one before.
    const fine = $("heldByGroupAtMoments")(kept, keptSpans, kept.m, groups, device, moments, -0.5, 299.5, 60)
      .map(h => [...h]);
    fine.forEach((h, g) => h.forEach((v, c) => assert.strictEqual(v, c % 2 ? whole[g][(c - 1) / 2] : c ? whole[g][c / 2 - 1] : 0)));
  }
});

test("a click on a long run's page picks the moment nearest", () => {
  const nearest = $("nearestMoment");
  assert.strictEqual(nearest([], 12.3), 12.3, "without moments, the time itself");
  assert.strictEqual(nearest(undefined, 7), 7);
  const moments = [10, 20, 40];
  assert.deepStrictEqual([0, 14, 15, 16, 29, 31, 99].map(t => nearest(moments, t)), [10, 10, 10, 20, 20, 40, 40]);
});
