// job.js: the page of the processes of one job (`DATA.job`, written by cli/src/page/job.rs): a lane
// per process and device, and a lane per group's joint line, on the job's one time axis (every
// run's times are on it); the table of which rank peaked when; and one process's own view below,
// picked in the table, the menu, or by a click on its lane (at the time clicked).

// A process as the page names it: its rank, else its pid.
function procName(p) { return p.rank != null ? "rank " + p.rank : "pid " + p.pid; }

// The lanes of `job` over `runs`: each process's devices, in the processes' order, then each
// group's joint line. `scale` names the lanes that share a height scale.
function jobLanes(job, runs) {
  const lanes = [];
  runs.forEach((run, i) => seriesOf(run).forEach(s => lanes.push({
    proc: i, s, scale: "proc", peak: s.d.peak, peakT: s.d.peak_t, color: COLORS[i % COLORS.length],
    label: procName(job.procs[i]) + " · device " + s.d.device })));
  job.groups.forEach(g => {
    const times = undelta(g.t), used = undelta(g.v);
    lanes.push({ group: g, scale: "group", peak: g.peak, peakT: g.peak_t, color: "#455a64",
      s: { times, used, pyramid: new Pyramid(used.length ? used : new Float64Array([0])) },
      label: "group " + g.name + " · device " + g.device });
  });
  return lanes;
}

// The rows of the table of peaks: per process its rank, pid, host, devices, peak, the device and
// time of the peak, its group; the highest marked.
function peakRows(job) {
  return job.procs.map((p, i) => [p.rank != null ? p.rank : "-", p.pid, p.host || "-",
    p.devices.join(", ") || "none", size(p.peak), p.devices.length ? "device " + p.peak_device : "-",
    p.peak_t != null ? "+" + dur(p.peak_t) : "-", p.group || "-",
    (i === job.top ? "highest" : "") + (p.cut_short ? (i === job.top ? ", " : "") + "cut short" : "")]);
}

function JobView(job, runs, drawRun) {
  this.job = job; this.runs = runs; this.drawRun = drawRun;
  this.built = []; this.shown = -1; this.instant = null;
  this.lanes = jobLanes(job, runs);
  this.from = 0; this.to = Math.max(job.end, 1);
  this.build(document.getElementById("job"));
  this.draw();
  if (runs.length) this.show(job.top != null ? job.top : 0, null);
}
JobView.prototype.xOf = TimelineView.prototype.xOf;
JobView.prototype.tOf = TimelineView.prototype.tOf;
JobView.prototype.xAt = TimelineView.prototype.xAt;
JobView.prototype.build = function (root) {
  const job = this.job, top = job.procs[job.top];
  root.hidden = false;
  root.append(el("h2", { text: job.procs.length + " processes of one job" + (this.runs[0] ? ": " + this.runs[0].command : "") }),
    el("div", { cls: "figures" },
      top ? el("span", {}, "highest peak ", el("b", { id: "job-top", "data-pid": top.pid, "data-rank": top.rank == null ? "" : top.rank,
        "data-bytes": top.peak, text: procName(top) + ": " + size(top.peak) }),
        " (pid " + top.pid + ", device " + top.peak_device + (top.peak_t != null ? ", at +" + dur(top.peak_t) : "") + ")") : null,
      el("span", { id: "job-clock", "data-clock": job.clock, text: "time axis: " + job.clock_note +
        (job.start_unix_us != null ? "; 0 is " + new Date(job.start_unix_us / 1000).toISOString() : "") })));
  const reset = el("button", { id: "job-reset", text: "whole job" });
  reset.onclick = () => this.zoom(0, Math.max(this.job.end, 1));
  this.pick = el("select", { id: "job-show" });
  job.procs.forEach((p, i) => this.pick.append(el("option", { value: i, text: procName(p) + " (pid " + p.pid + ")" })));
  this.pick.onchange = () => this.show(+this.pick.value, null);
  this.rangeEl = el("span", { cls: "range", id: "job-range" });
  this.chart = el("canvas", { cls: "lanes", id: "job-chart" });
  const rows = peakRows(job), ranks = table(["rank", "pid", "host", "devices", "peak", "on", "at", "group", ""],
    rows, [1, 1, 0, 0, 1, 0, 1, 0, 0]);
  ranks.setAttribute("id", "ranks");
  job.procs.forEach((p, i) => {
    const tr = ranks.children[i + 1];
    tr.setAttribute("data-pid", p.pid);
    tr.setAttribute("data-rank", p.rank == null ? "" : p.rank);
    tr.setAttribute("data-bytes", p.peak);
    if (p.peak_t != null) tr.setAttribute("data-t", p.peak_t);
    if (i === job.top) tr.className = "top";
    tr.onclick = () => this.show(i, p.peak_t);
  });
  root.append(el("div", { cls: "toolbar" }, reset, el("span", { text: "show:" }), this.pick, this.rangeEl),
    this.chart,
    el("div", { cls: "note", text: "a lane per process and device, one height scale; a group's lane: what its " +
      "members held together · drag: zoom in · wheel: zoom · double-click: whole job · click a lane: that " +
      "process's view below, at that time" }),
    el("h3", { text: "peaks by rank (click a row: that process at its peak)" }), ranks);
  if (job.groups.length) {
    const gt = table(["group", "device", "members", "joint peak", "at", "members' own peaks added"],
      job.groups.map(g => [g.name, g.device, g.members.map(i => procName(job.procs[i])).join(", "), size(g.peak),
        "+" + dur(g.peak_t), size(g.members.reduce((sum, i) => sum + (seriesOf(this.runs[i]).find(s => s.d.device === g.device) || { d: { peak: 0 } }).d.peak, 0))]),
      [0, 1, 0, 1, 1, 1]);
    gt.setAttribute("id", "groups");
    job.groups.forEach((g, i) => gt.children[i + 1].setAttribute("data-bytes", g.peak));
    root.append(el("h3", { text: "groups: the most their members held at one instant" }), gt);
  }
  this.listen();
};
// The lanes' boxes: the label column, then one band per lane, the time axis below.
JobView.prototype.laneHeight = function () { return this.lanes.length > 12 ? 30 : 48; };
JobView.prototype.plotBox = function (w) {
  return { x: 150, y: 6, w: w - 160, h: this.lanes.length * this.laneHeight() };
};
// Shows [from, to], kept inside the job and at least 2 µs wide.
JobView.prototype.zoom = function (from, to) {
  const end = Math.max(this.job.end, 1), span = Math.max(to - from, 2);
  from = Math.max(0, Math.min(from, end - span));
  this.from = from; this.to = Math.min(end, from + span);
  this.draw();
};
JobView.prototype.draw = function () {
  const lh = this.laneHeight();
  const { g, w, h } = canvasSize(this.chart, 6 + Math.max(1, this.lanes.length) * lh + 24);
  const box = this.plotBox(w);
  beginChart(this, g, w, h, box, this.job.end);
  const n = Math.max(1, Math.floor(box.w)), ymax = {};
  const cols = this.lanes.map(l => minMaxColumns(l.s, this.from, this.to, n));
  this.lanes.forEach((l, k) => {
    let top = 1;
    for (let c = 0; c < n; c++) top = Math.max(top, cols[k].hi[c]);
    ymax[l.scale] = Math.max(ymax[l.scale] || 1, top);
  });
  this.lanes.forEach((l, k) => this.drawLane(g, box, k, l, cols[k], ymax[l.scale] * 1.1));
  g.strokeStyle = "#999"; g.strokeRect(box.x, box.y, box.w, box.h);
  this.drawTimeAxis(g, box);
  if (this.instant != null && this.instant >= this.from && this.instant <= this.to) {
    g.fillStyle = "#ff6f00"; g.fillRect(this.xOf(this.instant, box), box.y, 1.5, box.h);
  }
};
// Lane `k`: its label and peak on the left, `used` as an envelope (min to max of each column), the
// peak a dot.
JobView.prototype.drawLane = function (g, box, k, l, col, ymax) {
  const lh = this.laneHeight(), y0 = box.y + k * lh, bh = lh - 4;
  const yOf = v => y0 + lh - 1 - v / ymax * bh;
  if (k > 0) { g.fillStyle = "#ddd"; g.fillRect(box.x, y0, box.w, 1); }
  if (this.shown === l.proc) { g.fillStyle = "rgba(255,179,0,0.12)"; g.fillRect(0, y0, box.x - 4, lh); }
  g.fillStyle = "#222"; g.fillText(l.label, 4, y0 + 13);
  g.fillStyle = "#555";
  if (lh >= 40) g.fillText("peak " + size(l.peak), 4, y0 + 28);
  g.globalAlpha = 0.35; g.fillStyle = l.color;
  for (let c = 0; c < col.n; c++) g.fillRect(box.x + c, yOf(col.lo[c]), 1, y0 + lh - 1 - yOf(col.lo[c]));
  g.globalAlpha = 1;
  for (let c = 0; c < col.n; c++) g.fillRect(box.x + c, yOf(col.hi[c]), 1, Math.max(1, yOf(col.lo[c]) - yOf(col.hi[c])));
  if (l.peakT >= this.from && l.peakT <= this.to) {
    const x = this.xOf(l.peakT, box), y = yOf(l.peak);
    g.fillStyle = "#000"; g.beginPath(); g.arc(x, y, 3, 0, 7); g.fill();
    const label = size(l.peak), tw = g.measureText(label).width;
    g.fillText(label, x - box.x > box.w / 2 ? x - 6 - tw : x + 6, Math.max(y0 + 11, y + 4));
  }
};
JobView.prototype.drawTimeAxis = function (g, box) {
  g.fillStyle = "#444";
  const tstep = niceStep((this.to - this.from) / 8, false);
  for (let t = Math.ceil(this.from / tstep) * tstep; t <= this.to; t += tstep) {
    const x = this.xOf(t, box), label = "+" + dur(t);
    g.fillRect(x, box.y + box.h, 1, 4);
    g.fillText(label, Math.max(box.x - 4, Math.min(x - 14, box.x + box.w - g.measureText(label).width)), box.y + box.h + 16);
  }
};
// The lane under `y` (CSS pixels from the chart's top), or null.
JobView.prototype.laneAt = function (y) {
  const k = Math.floor((y - this.box.y) / this.laneHeight());
  return k >= 0 && k < this.lanes.length ? this.lanes[k] : null;
};
// Shows process `i`'s own view below the chart (made the first time), at time `t` when given.
JobView.prototype.show = function (i, t) {
  if (this.shown >= 0 && this.built[this.shown]) this.built[this.shown].sec.hidden = true;
  if (!this.built[i]) this.built[i] = this.drawRun(this.runs[i], i);
  const b = this.built[i];
  b.sec.hidden = false;
  this.shown = i;
  this.pick.value = i;
  this.chart.dataset.shown = i;
  if (t != null && b.view) { b.view.instant = nearestMoment(b.view.run.moments, t); b.view.draw(); b.view.showInstant(); }
  this.instant = t;
  this.draw();
};
JobView.prototype.listen = function () {
  const c = this.chart;
  let down = null;
  const yAt = ev => ev.clientY - c.getBoundingClientRect().top;
  c.addEventListener("mousedown", ev => { down = { x: this.xAt(ev), y: yAt(ev) }; ev.preventDefault(); });
  window.addEventListener("mouseup", ev => {
    if (!down) return;
    const x = this.xAt(ev), was = down, box = this.box;
    down = null;
    if (Math.abs(x - was.x) >= 4) { this.zoom(this.tOf(Math.min(was.x, x), box), this.tOf(Math.max(was.x, x), box)); return; }
    const lane = this.laneAt(was.y), t = Math.max(0, Math.min(this.job.end, Math.round(this.tOf(x, box))));
    if (lane && lane.proc != null) this.show(lane.proc, t);
    else { this.instant = t; this.draw(); }
  });
  c.addEventListener("dblclick", () => this.zoom(0, Math.max(this.job.end, 1)));
  c.addEventListener("wheel", ev => {
    ev.preventDefault();
    const at = this.tOf(this.xAt(ev), this.box), f = Math.exp(ev.deltaY * 0.002);
    this.zoom(at - (at - this.from) * f, at + (this.to - at) * f);
  }, { passive: false });
  c.addEventListener("mousemove", ev => {
    const lane = this.laneAt(yAt(ev));
    if (down || !lane) { hideTip(); return; }
    const t = this.tOf(this.xAt(ev), this.box), i = firstAtOrAfter(lane.s.times, t + 1e-9);
    showTip(ev, lane.label + "\n+" + dur(t) + "\nused " + size(i > 0 ? lane.s.used[i - 1] : 0) +
      (lane.proc != null ? "\nclick: this process then" : ""));
  });
  c.addEventListener("mouseleave", hideTip);
};
