// report.js: the runs without a timeline (an exit report, an out-of-memory report, a live
// process): their tables, and for an out-of-memory report the refused request beside what was
// held; and, for two runs, each call site's peak in both.

function reportView(run, root, sfx) {
  const s = run.report;
  if (run.source === "live") {
    root.append(el("p", { cls: "note", text: "a live process has no timeline: these are its figures now " +
      "(record one with gpumemhook run --trace, or --html)" }));
  } else {
    root.append(el("p", { cls: "note", text: "an exit report holds the figures at exit, not their " +
      "history: a timeline (gpumemhook run --trace or --html) draws them over time" }));
  }
  if (s.oom) root.append(oomView(s, sfx));
  root.append(el("h3", { text: "devices" }), table(["device", "used", "peak", "ceiling", "allocations"],
    s.devices.map(d => [d.device, size(d.used), size(d.peak), d.limit == null ? "none" : size(d.limit), d.allocs]),
    [1, 1, 1, 1, 1]));
  const mods = [];
  for (const d of s.devices) {
    for (const m of d.by_module || []) mods.push([m.module, d.device, size(m.used), share(m.used, d.used), size(m.peak)]);
  }
  const sites = (s.by_site || []).map(x => [x.site, size(x.used), size(x.peak), x.live_allocs]);
  root.append(el("div", { cls: "tables" },
    el("div", { id: "by-module" + sfx }, el("h3", { text: "by module" }),
      table(["module", "device", "used", "share", "peak"], mods, [0, 1, 1, 1, 1])),
    el("div", { id: "by-site" + sfx }, el("h3", { text: "by call site" }),
      sites.length ? table(["site", "used", "peak", "held allocations"], sites, [0, 1, 1, 1])
        : el("p", { text: "no call sites: run the program with --stacks python:1MiB" }))));
  if (s.live && !s.oom) {
    root.append(el("h3", { text: "held at exit, largest first" }),
      table(["site", "bytes", "module", "age"], s.live.slice(0, 200).map(l =>
        [l.site || "no Python call site", size(l.bytes), l.module, dur(l.age_s * 1e6)]), [0, 1, 0, 1]));
  }
}

// The refused request beside what was held, largest first, each as a bar on one scale.
function oomView(s, sfx) {
  const o = s.oom, live = (s.live || []).filter(l => l.device === o.device);
  const scale = Math.max(o.bytes, ...live.map(l => l.bytes), 1);
  const rows = [{ refused: true, bytes: o.bytes, module: o.module, site: o.site,
    what: "refused: " + o.entry + " (" + (o.reason === "ceiling" ? "over the ceiling" : "the driver ran out") + ")" }]
    .concat(live.map(l => ({ bytes: l.bytes, module: l.module, site: l.site, what: "held" })));
  const t = el("table", { id: "oom" + sfx }, el("tr", {}, ...["", "bytes", "", "module", "site"].map(h => el("th", { text: h }))));
  for (const r of rows) {
    t.append(el("tr", { cls: r.refused ? "refused" : "" },
      el("td", { text: r.what }), el("td", { cls: "n", text: size(r.bytes) }),
      el("td", { style: "width:30%" }, el("div", { cls: "bar" + (r.refused ? " refused" : ""),
        style: "width:" + (100 * r.bytes / scale).toFixed(1) + "%" })),
      el("td", { text: r.module }), el("td", { cls: "site", text: r.site || "no Python call site" })));
  }
  return el("div", {}, el("h3", { id: "oom-title" + sfx, "data-bytes": o.bytes,
    text: "out of memory on device " + o.device + ": " + size(o.bytes) + " asked with " + size(o.used) +
      " in use" + (o.limit != null ? " under a ceiling of " + size(o.limit) : "") }), t,
    s.live_omitted ? el("p", { text: s.live_omitted + " smaller allocations not listed" }) : null);
}

// Each call site's peak in runs `a` and `b` (a timeline's replayed, a report's own): the rows
// of the comparison, the sites with the largest peak first.
function sitePeakRows(a, b) {
  const peaks = run => new Map(run.source === "timeline" ? run.site_peaks
    : (run.report.by_site || []).map(x => [x.site, x.peak]));
  const pa = peaks(a), pb = peaks(b);
  const sites = [...new Set([...pa.keys(), ...pb.keys()])];
  sites.sort((x, y) => Math.max(pb.get(y) || 0, pa.get(y) || 0) - Math.max(pb.get(x) || 0, pa.get(x) || 0));
  return sites.slice(0, 300).map(s => {
    const x = pa.get(s) || 0, y = pb.get(s) || 0;
    return [s, size(x), size(y), (y >= x ? "+" : "-") + size(Math.abs(y - x))];
  });
}

// Two runs: the change of peak, and each site's peak in both (#compare).
function compareView(a, b) {
  const rows = sitePeakRows(a, b), sec = document.getElementById("compare");
  sec.hidden = false;
  sec.append(el("h3", { text: "per-site peaks: " + a.label + " beside " + b.label }),
    el("p", { id: "peak-change", "data-bytes": b.summary.peak - a.summary.peak,
      text: "peak " + size(a.summary.peak) + " → " + size(b.summary.peak) }),
    rows.length ? table(["site", "peak (first)", "peak (second)", "change"], rows, [0, 1, 1, 1])
      : el("p", { text: "no call sites in either run (--stacks python:1MiB records them)" }));
}
