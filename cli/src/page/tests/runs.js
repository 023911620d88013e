// runs.js: runs as cli/src/page/data.rs writes them into the page's data, small enough to check by
// hand, for the unit tests of the whole page and of reports.
"use strict";
const { SIZES } = require("./load.js");

const S1 = "a.py:1 in <module>", S2 = "a.py:2 in f < a.py:9 in <module>";

// A timeline: 1 KiB (libA, S1) at 10 µs held to the end, 3 KiB (libB, S2) at 20 µs freed at 40 µs;
// the peak 4 KiB at 20 µs under a ceiling of 8 KiB; a scope over [15, 45]; a refusal of 1 TiB at 50.
function timeline() {
  return {
    label: "t.json", source: "timeline", command: "python a.py", pid: 7, t0: 0, end: 100,
    devices: [{ device: 0, peak: 4096, peak_t: 20, restarted: null, last: 1024,
      t: [10, 10, 20], v: [1024, 3072, -3072], ceil: [[0, 8192]], resets: [] }],
    scopes: [["step", 15, 45]],
    modules: ["", "libA.so", "libB.so"], sites: ["", S1, S2], threads: [0, 99],
    allocs: { d: [0, 0], t: [10, 10], e: [-1, 20], b: [1024, 3072], m: [1, 2], s: [1, 2], h: [1, 1] },
    marks: [["denied", 50, 0, 2 ** 40, 1024, 2, 2]],
    site_peaks: [[S2, 3072], [S1, 1024]],
    summary: { peak: 4096, peak_device: 0, peak_t: 20, top_module: "libB.so", top_module_peak: 3072,
      top_site: S2, top_site_peak: 3072 },
    report: null,
  };
}

// An out-of-memory report: 4 MiB refused over a ceiling of 2 MiB with 1 MiB held (S1, libA).
function oomReport() {
  const live = [{ device: 0, bytes: 1 << 20, module: "libA.so", address: "0x1", age_s: 2.5, site: S1 },
    { device: 1, bytes: 1 << 20, module: "libC.so", address: "0x2", age_s: 1, site: null }];
  const report = {
    pid: 8, command: "python b.py", devices: [{ device: 0, used: 1 << 20, peak: 1 << 20, limit: 2 << 20, allocs: 1,
      by_module: [{ module: "libA.so", path: "/x/libA.so", used: 1 << 20, peak: 1 << 20, live_allocs: 1 }] }],
    live, live_omitted: 3,
    oom: { device: 0, bytes: 4 << 20, entry: "cudaMalloc", reason: "ceiling", used: 1 << 20, limit: 2 << 20,
      module: "libB.so", site: S2 },
    by_site: [{ site: S1, used: 1 << 20, peak: 3 << 20, live_allocs: 1 }],
  };
  return { label: "oom.json", source: "oom", command: report.command, pid: 8, t0: 0, end: 0, devices: [],
    scopes: [], modules: [], sites: [], threads: [], allocs: { d: [], t: [], e: [], b: [], m: [], s: [], h: [] },
    marks: [], site_peaks: [], report,
    summary: { peak: 1 << 20, peak_device: 0, peak_t: null, top_module: "libA.so", top_module_peak: 1 << 20,
      top_site: S1, top_site_peak: 3 << 20 } };
}

// Three processes of one job on its axis, as cli/src/page/job.rs writes them: rank 0 (pid 11) on
// device 0 peaks at 2 KiB at 30 µs; rank 1 (pid 12), the same group, on device 0 peaks at 3 KiB at
// 40 µs; pid 13 (no rank) on device 1 peaks at 1 KiB at 10 µs. Together ranks 0 and 1 held 5 KiB at
// 40 µs.
function job() {
  const proc = (pid, device, t, v, peak, peakT, end) => ({
    label: "t." + pid + ".json", source: "timeline", command: "python train.py", pid, t0: 1000, end,
    devices: [{ device, peak, peak_t: peakT, restarted: null, last: 0, t, v, ceil: [], resets: [] }],
    scopes: [], modules: [""], sites: [""], threads: [0],
    allocs: { d: [], t: [], e: [], b: [], m: [], s: [], h: [] }, marks: [], site_peaks: [], report: null,
    summary: { peak, peak_device: device, peak_t: peakT, top_module: "", top_module_peak: 0, top_site: "",
      top_site_peak: 0 },
  });
  const runs = [proc(11, 0, [20, 10, 40], [1024, 1024, -2048], 2048, 30, 70),
    proc(12, 0, [40, 30], [3072, -3072], 3072, 40, 80),
    proc(13, 1, [10], [1024], 1024, 10, 10)];
  const p = (rank, pid, device, peak, peakT, group) => ({ rank, local_rank: rank, host: "n1", group, pid,
    devices: [device], peak, peak_device: device, peak_t: peakT, cut_short: false });
  return { runs, job: {
    clock: "monotonic", clock_note: "CLOCK_MONOTONIC of host n1: every process on one clock", start_unix_us: null,
    end: 80, top: 1,
    procs: [p("0", 11, 0, 2048, 30, "pair"), p("1", 12, 0, 3072, 40, "pair"), p(null, 13, 1, 1024, 10, null)],
    groups: [{ name: "pair", device: 0, members: [0, 1], t: [20, 10, 10, 20, 10], v: [1024, 1024, 3072, -2048, -3072],
      peak: 5120, peak_t: 40 }],
  } };
}

// The page's data of `runs`, with Rust's size rule.
function pageData(...runs) { return { runs, sizes: SIZES.rule }; }

// The page's data of the job of `job()`.
function jobData() { const j = job(); return { runs: j.runs, job: j.job, sizes: SIZES.rule }; }

module.exports = { timeline, oomReport, pageData, jobData, S1, S2 };
