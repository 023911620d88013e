// timeline.js: the view of one run's timeline: its state (device, mode, the span shown, the
// instant), its toolbar and canvases, and drawing the chart of `used`. The chart's scopes, axes and
// marks are in chart.js, the mouse in pointer.js, what was live at the instant in instant.js.

function TimelineView(run, root, sfx) {
  this.run = run; this.sfx = sfx; this.root = root;
  this.series = seriesOf(run);
  this.spans = allocationSpans(run.allocs);
  const top = run.devices.reduce((b, d, i) => (d.peak > run.devices[b].peak ? i : b), 0);
  this.dev = run.devices.length ? top : -1;
  this.mode = "module";
  this.from = 0; this.to = Math.max(run.end, 1);
  this.instant = run.devices.length ? run.devices[this.dev].peak_t : 0;
  this.build(root);
  this.draw();
  this.showInstant();
}
TimelineView.prototype.build = function (root) {
  const sfx = this.sfx;
  const bar = el("div", { cls: "toolbar" });
  if (this.run.devices.length > 1) {
    const pick = el("select", { id: "device" + sfx });
    this.run.devices.forEach((d, i) => pick.append(el("option", { value: i, text: "device " + d.device })));
    pick.value = this.dev;
    pick.onchange = () => { this.dev = +pick.value; this.draw(); this.showInstant(); };
    bar.append(pick);
  }
  this.buttons = {};
  for (const [mode, label] of [["total", "total"], ["module", "by module"], ["site", "by site"]]) {
    const b = el("button", { id: "mode-" + mode + sfx, text: label });
    b.onclick = () => { this.mode = mode; this.draw(); };
    this.buttons[mode] = b;
    bar.append(b);
  }
  const reset = el("button", { id: "reset" + sfx, text: "whole run" });
  reset.onclick = () => this.zoom(0, Math.max(this.run.end, 1));
  this.rangeEl = el("span", { cls: "range", id: "range" + sfx });
  bar.append(reset, this.rangeEl);
  this.chart = el("canvas", { cls: "chart", id: "chart" + sfx });
  this.legend = el("div", { cls: "figures", id: "legend" + sfx });
  root.append(bar, this.chart, this.legend,
    el("div", { cls: "note", text: "drag: zoom in · wheel: zoom · shift-drag or horizontal wheel: pan · " +
      "double-click: whole run · click: what was live then" }));
  if (this.run.moments) {
    root.append(el("div", { cls: "note", id: "reduced" + sfx, text: "a long run, kept in bounded memory: its curve " +
      "holds the lowest and highest of each of " + this.run.columns + " spans of time (zoomed in further, it is " +
      "drawn in steps), and what was live is kept at " + this.run.moments.length + " moments (evenly spread, " +
      "each device's peak, the end): a click shows the moment nearest, and the stacks by module and by site " +
      "are drawn from those moments" +
      (this.run.marks_left_out ? "; of its refusals and failures, the first and last 1,000 are drawn (" +
        this.run.marks_left_out + " between them are not)" : "") }));
  }
  this.instantEl = el("h3", { id: "instant" + sfx });
  this.flame = el("canvas", { id: "flame" + sfx });
  this.strip = el("canvas", { id: "allocs" + sfx });
  this.tables = el("div", { cls: "tables" });
  root.append(this.instantEl, this.flame,
    el("h3", { text: "largest live allocations (hover one)" }), this.strip, this.tables);
  this.listen();
};
// The plot's box in the chart, below the lanes of scopes.
TimelineView.prototype.plotBox = function (w, h) {
  const top = 6 + this.lanes().count * 15;
  return { x: 74, y: top, w: w - 84, h: h - top - 24 };
};
TimelineView.prototype.lanes = function () {
  if (!this._lanes) this._lanes = scopeLanes(this.run.scopes);
  return this._lanes;
};
TimelineView.prototype.xOf = function (t, box) { return box.x + (t - this.from) / (this.to - this.from) * box.w; };
TimelineView.prototype.tOf = function (x, box) { return this.from + (x - box.x) / box.w * (this.to - this.from); };
// Shows [from, to], kept inside the run and at least 2 µs wide.
TimelineView.prototype.zoom = function (from, to) {
  const end = Math.max(this.run.end, 1), span = Math.max(to - from, 2);
  from = Math.max(0, Math.min(from, end - span));
  this.from = from; this.to = Math.min(end, from + span);
  this.draw();
};

// Held per group (module or site) at the end of each of `n` columns, and each group's label
// (null for a group holding nothing in the span shown).
TimelineView.prototype.stacks = function (n) {
  const a = this.run.allocs, dev = this.run.devices[this.dev].device;
  const key = this.mode === "module" ? a.m : a.s;
  const names = this.mode === "module" ? this.run.modules : this.run.sites;
  const groups = rankGroups(a, this.spans, key, names.length, dev, this.run.devices[this.dev].peak_t);
  const held = this.run.moments
    ? heldByGroupAtMoments(a, this.spans, key, groups, dev, this.run.moments, this.from, this.to, n)
    : heldByGroup(a, this.spans, key, groups, dev, this.from, this.to, n);
  const labels = groups.top.map((k, i) => (held[i].some(v => v > 0) ? (k < 0 ? "other" : this.groupName(k)) : null));
  return { held, labels };
};
TimelineView.prototype.groupName = function (k) {
  if (this.mode === "module") return this.run.modules[k] || "unknown module";
  return innermost(this.run.sites[k]);
};

TimelineView.prototype.draw = function () {
  for (const [m, b] of Object.entries(this.buttons)) b.className = m === this.mode ? "on" : "";
  const { g, w, h } = canvasSize(this.chart, 320);
  const box = this.plotBox(w, h);
  beginChart(this, g, w, h, box, this.run.end);
  if (this.dev < 0) { g.fillText("no device memory in this timeline", box.x, box.y + 20); return; }
  const s = this.series[this.dev], d = s.d;
  const col = minMaxColumns(s, this.from, this.to, Math.max(1, Math.floor(box.w)));
  let ymax = 1;
  for (let c = 0; c < col.n; c++) ymax = Math.max(ymax, col.hi[c]);
  const ceilings = d.ceil.filter(c => c[1] != null && c[1] < ymax * 1.6).map(c => c[1]);
  ymax = Math.max(ymax, ...ceilings) * 1.08;
  const yOf = v => box.y + box.h - v / ymax * box.h;
  this.drawScopes(g, box);
  this.drawAxes(g, box, ymax, yOf);
  this.drawUsed(g, box, col, yOf);
  this.drawMarks(g, box, yOf, d);
};
// `used` in the mode chosen (the total, or stacked by module or site) with its legend, and the
// envelope on top: min to max of every column.
TimelineView.prototype.drawUsed = function (g, box, col, yOf) {
  if (this.mode === "total") {
    g.fillStyle = "rgba(66,165,245,0.35)";
    for (let c = 0; c < col.n; c++) g.fillRect(box.x + c, yOf(col.lo[c]), 1, box.y + box.h - yOf(col.lo[c]));
    this.legend.replaceChildren(el("span", { text: "used on device " + this.series[this.dev].d.device }));
  } else {
    const st = this.stacks(col.n);
    for (let c = 0; c < col.n; c++) {
      let base = 0;
      st.held.forEach((held, k) => {
        if (!held[c]) return;
        g.fillStyle = COLORS[k % COLORS.length];
        g.fillRect(box.x + c, yOf(base + held[c]), 1, yOf(base) - yOf(base + held[c]));
        base += held[c];
      });
    }
    this.legend.replaceChildren(...st.labels.map((l, k) => l == null ? null : el("span", {},
      el("b", { style: "color:" + COLORS[k % COLORS.length], text: "■ " }), l)).filter(e => e));
  }
  g.fillStyle = "#1565c0";
  for (let c = 0; c < col.n; c++) g.fillRect(box.x + c, yOf(col.hi[c]), 1, Math.max(1, yOf(col.lo[c]) - yOf(col.hi[c])));
};
