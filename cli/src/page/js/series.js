// series.js: the computations on a timeline's data (cli/src/page/data.rs), without drawing:
// decoding its delta-encoded columns, min and max of `used` per pixel column (from a pyramid), the
// lanes of scopes, what was live at an instant, and what each module or site held over time (on a
// long run's page, which keeps the allocations live at its `moments` only, at those moments).

// The running sums of delta-encoded values: the values themselves.
function undelta(arr) {
  const out = new Float64Array(arr.length);
  let v = 0;
  for (let i = 0; i < arr.length; i++) { v += arr[i]; out[i] = v; }
  return out;
}

// Each device's `used` of `run` decoded, with its pyramid: `{ d, times, used, pyramid }`, made once
// per run (its own view and a job's lanes share them).
function seriesOf(run) {
  if (!run._series) {
    run._series = run.devices.map(d => {
      const times = undelta(d.t), used = undelta(d.v);
      return { d, times, used, pyramid: new Pyramid(used.length ? used : new Float64Array([0])) };
    });
  }
  return run._series;
}

// Min and max of a series over any index range in O(log n): level k holds the min and max of
// each block of 2^k values.
function Pyramid(values) {
  this.mins = [values];
  this.maxs = [values];
  let lo = values, hi = values;
  while (lo.length > 1) {
    const n = Math.ceil(lo.length / 2), nlo = new Float64Array(n), nhi = new Float64Array(n);
    for (let j = 0; j < n; j++) {
      const a = 2 * j, b = Math.min(a + 1, lo.length - 1);
      nlo[j] = Math.min(lo[a], lo[b]);
      nhi[j] = Math.max(hi[a], hi[b]);
    }
    this.mins.push(nlo);
    this.maxs.push(nhi);
    lo = nlo; hi = nhi;
  }
}
// [min, max] of the values at indexes i0 to i1 - 1 ([Infinity, -Infinity] when none).
Pyramid.prototype.range = function (i0, i1) {
  let lo = Infinity, hi = -Infinity, k = 0;
  while (i0 < i1) {
    if (i0 & 1) { lo = Math.min(lo, this.mins[k][i0]); hi = Math.max(hi, this.maxs[k][i0]); i0++; }
    if (i1 & 1) { i1--; lo = Math.min(lo, this.mins[k][i1]); hi = Math.max(hi, this.maxs[k][i1]); }
    i0 >>= 1; i1 >>= 1; k++;
  }
  return [lo, hi];
};

// The first index of sorted `times` at or after `t` (times.length when none).
function firstAtOrAfter(times, t) {
  let lo = 0, hi = times.length;
  while (lo < hi) { const m = (lo + hi) >> 1; if (times[m] < t) lo = m + 1; else hi = m; }
  return lo;
}

// Min and max of a device's `used` (`s`: its `times`, `used` and their `pyramid`) in each of `n`
// columns splitting [from, to] (the last column holds a change at `to` itself: a run's last event,
// or on a job's page the last event of the job), with the value carried into each column.
function minMaxColumns(s, from, to, n) {
  const lo = new Float64Array(n), hi = new Float64Array(n), dt = (to - from) / n;
  let i = firstAtOrAfter(s.times, from);
  for (let c = 0; c < n; c++) {
    let j = firstAtOrAfter(s.times, from + (c + 1) * dt);
    if (c === n - 1) while (j < s.times.length && s.times[j] <= to) j++;
    const before = i > 0 ? s.used[i - 1] : 0;
    const [mn, mx] = i < j ? s.pyramid.range(i, j) : [before, before];
    lo[c] = Math.min(mn, before); hi[c] = Math.max(mx, before);
    i = j;
  }
  return { lo, hi, n };
}

// The lane of each scope (`[name, open, close or null]`): by opening time, each in the first lane
// free when it opens; `count` is the lanes drawn (at most 6).
function scopeLanes(scopes) {
  const ends = [], lane = [];
  const order = scopes.map((s, i) => i).sort((a, b) => scopes[a][1] - scopes[b][1]);
  for (const i of order) {
    const [, open, close] = scopes[i];
    let l = ends.findIndex(e => e <= open);
    if (l < 0) { l = ends.length; ends.push(0); }
    ends[l] = close == null ? Infinity : close;
    lane[i] = l;
  }
  return { lane, count: Math.min(ends.length, 6) };
}

// Each allocation's start and end (Infinity: held to the end), µs, from its delta-encoded start
// and how long it was held (-1: to the end).
function allocationSpans(allocs) {
  const starts = undelta(allocs.t), ends = new Float64Array(allocs.e.length);
  for (let i = 0; i < allocs.e.length; i++) ends[i] = allocs.e[i] < 0 ? Infinity : starts[i] + allocs.e[i];
  return { starts, ends };
}

// The allocations live on `device` at `t` (made at or before it, not freed by then), largest
// first, as indexes into the columns of `allocs`.
function liveAt(allocs, spans, device, t) {
  const out = [];
  for (let i = 0; i < spans.starts.length && spans.starts[i] <= t; i++) {
    if (allocs.d[i] === device && spans.ends[i] > t) out.push(i);
  }
  return out.sort((x, y) => allocs.b[y] - allocs.b[x]);
}

// The nine groups (`key`: a column of `allocs` with `count` names) holding the most on `device` at
// `t`, then -1 for "other": `top` in that order, `slot` each group's place in it.
function rankGroups(allocs, spans, key, count, device, t) {
  const held = new Float64Array(count);
  for (let i = 0; i < spans.starts.length; i++) {
    if (allocs.d[i] === device && spans.starts[i] <= t && spans.ends[i] > t) held[key[i]] += allocs.b[i];
  }
  const order = Array.from(held.keys()).filter(k => held[k] > 0).sort((x, y) => held[y] - held[x]);
  const top = order.slice(0, 9);
  const slot = new Int32Array(count).fill(top.length);
  top.forEach((k, i) => { slot[k] = i; });
  top.push(-1);
  return { top, slot };
}

// What each ranked group held on `device` at the end of each of `n` columns splitting [from, to),
// by difference arrays (no sort): one Float64Array per entry of `groups.top`.
function heldByGroup(allocs, spans, key, groups, device, from, to, n) {
  const dt = (to - from) / n, diff = groups.top.map(() => new Float64Array(n + 1));
  for (let i = 0; i < spans.starts.length; i++) {
    if (allocs.d[i] !== device || spans.starts[i] > to || spans.ends[i] <= from) continue;
    const c0 = Math.max(0, Math.floor((spans.starts[i] - from) / dt));
    const c1 = Math.min(n, Math.floor((spans.ends[i] - from) / dt));
    if (c1 <= c0) continue;
    const g = diff[groups.slot[key[i]]];
    g[c0] += allocs.b[i]; g[c1] -= allocs.b[i];
  }
  return diff.map(d => {
    let v = 0;
    const out = new Float64Array(n);
    for (let c = 0; c < n; c++) { v += d[c]; out[c] = v; }
    return out;
  });
}

// On a long run's page (its allocations those live at `moments`, sorted µs): what each ranked group
// held on `device` at the end of each of `n` columns splitting [from, to), as at the last moment at
// or before that end (0 before the first), by difference arrays over the moments.
function heldByGroupAtMoments(allocs, spans, key, groups, device, moments, from, to, n) {
  const m = moments.length, diff = groups.top.map(() => new Float64Array(m + 1));
  for (let i = 0; i < spans.starts.length; i++) {
    if (allocs.d[i] !== device) continue;
    const k0 = firstAtOrAfter(moments, spans.starts[i]), k1 = firstAtOrAfter(moments, spans.ends[i]);
    if (k1 <= k0) continue;
    const g = diff[groups.slot[key[i]]];
    g[k0] += allocs.b[i]; g[k1] -= allocs.b[i];
  }
  const dt = (to - from) / n;
  return diff.map(d => {
    const atMoment = new Float64Array(m);
    let v = 0;
    for (let k = 0; k < m; k++) { v += d[k]; atMoment[k] = v; }
    const out = new Float64Array(n);
    for (let c = 0; c < n; c++) {
      const end = from + (c + 1) * dt;
      let k = firstAtOrAfter(moments, end);
      if (k < m && moments[k] === end) k++;
      out[c] = k > 0 ? atMoment[k - 1] : 0;
    }
    return out;
  });
}

// The moment of sorted `moments` nearest `t` (`t` itself when there are none).
function nearestMoment(moments, t) {
  if (!moments || !moments.length) return t;
  const i = firstAtOrAfter(moments, t);
  if (i >= moments.length) return moments[moments.length - 1];
  return i > 0 && t - moments[i - 1] <= moments[i] - t ? moments[i - 1] : moments[i];
}
