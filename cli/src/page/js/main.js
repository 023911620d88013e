// main.js: the page itself, run last: it reads the data (#gmh-data, written by
// cli/src/page/data.rs), takes the size rule from it, and draws each run (its figures, then its
// timeline or its report), the comparison of two runs or the lanes of a job's processes, and marks
// the page drawn. Figures a test
// reads carry ids and data- attributes (docs/view.md lists them).

const DATA = JSON.parse(document.getElementById("gmh-data").textContent);
// Every size of the page is written as reader/src/size.rs writes it (format.js applies its rule).
const size = sizeFormatter(DATA.sizes);

// The run's peak, top module and top site.
function figures(run, sfx) {
  const s = run.summary;
  const peakAt = s.peak_t != null ? " at +" + dur(s.peak_t) : "";
  return el("div", { cls: "figures" },
    el("span", {}, "peak ", el("b", { id: "peak" + sfx, "data-bytes": s.peak, "data-device": s.peak_device,
      text: size(s.peak) }), " on device " + s.peak_device + peakAt),
    el("span", {}, "top module ", el("b", { id: "top-module" + sfx, "data-name": s.top_module,
      "data-bytes": s.top_module_peak, text: s.top_module || "-" }),
      s.top_module ? " (peak " + size(s.top_module_peak) + ")" : ""),
    el("span", {}, "top site ", el("b", { id: "top-site" + sfx, "data-name": s.top_site,
      "data-bytes": s.top_site_peak, title: s.top_site, text: s.top_site ? innermost(s.top_site) : "none recorded" }),
      s.top_site ? " (peak " + size(s.top_site_peak) + ")" : ""),
    // A ring timeline (GPUMEMHOOK_TRACE_MAX): before this, the curve is each interval's lowest
    // and highest, and single allocations are not kept.
    s.detail_from ? el("span", { id: "detail-from" + sfx, "data-t": s.detail_from[0],
      text: "full detail from +" + dur(s.detail_from[0]) + " (" + s.detail_from[1] +
        " events before summarised)" }) : null);
}

const views = [];
// Draws run `i` in #runs: its heading, figures, and its timeline or report. Returns its section and
// its timeline's view (null for a report).
function drawRun(run, i) {
  const sfx = i === 0 ? "" : "-" + (i + 1);
  const sec = el("section", { cls: "run", id: "run" + sfx, "data-source": run.source },
    el("h2", { text: (run.label === "pid " + run.pid ? "" : run.label + ": ") + "pid " + run.pid + "  " + run.command }),
    figures(run, sfx));
  document.getElementById("runs").append(sec);
  let view = null;
  if (run.source === "timeline") views.push(view = new TimelineView(run, sec, sfx));
  else reportView(run, sec, sfx);
  return { sec, view };
}
// The processes of one job: their lanes and peaks (job.js), one process's own view at a time.
const job = DATA.job ? new JobView(DATA.job, DATA.runs, drawRun) : null;
if (!job) DATA.runs.forEach(drawRun);
if (!job && DATA.runs.length === 2) compareView(DATA.runs[0], DATA.runs[1]);
// Drawn again now that every run has its place: a chart drawn before the second run was laid out
// beside it had the whole width.
const redraw = () => {
  if (job) job.draw();
  views.forEach(v => { if (!v.root.hidden) { v.draw(); v.showInstant(); } });
};
if (!job && DATA.runs.length > 1) redraw();
window.addEventListener("resize", redraw);
// Milliseconds from the start of navigation to the first view drawn (scripts/bench/view).
document.body.dataset.drawnMs = performance.now().toFixed(0);
document.body.dataset.ready = "1";
