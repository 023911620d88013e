// chart.js: what the timeline's chart draws around `used` (timeline.js): the scopes' bands and
// lanes, the axes, the ceiling's steps, peak resets, refused and failed allocations, the peak and
// the instant shown below the chart.

TimelineView.prototype.drawScopes = function (g, box) {
  const lanes = this.lanes();
  this.run.scopes.forEach(([name, open, close], i) => {
    const x0 = Math.max(box.x, this.xOf(open, box));
    const x1 = Math.min(box.x + box.w, this.xOf(close == null ? this.run.end : close, box));
    if (x1 < box.x || x0 > box.x + box.w || lanes.lane[i] >= 6) return;
    const color = COLORS[i % COLORS.length];
    g.globalAlpha = 0.08; g.fillStyle = color;
    g.fillRect(x0, box.y, Math.max(1, x1 - x0), box.h);
    g.globalAlpha = 0.8;
    const y = 4 + lanes.lane[i] * 15;
    g.fillRect(x0, y, Math.max(1, x1 - x0), 12);
    g.globalAlpha = 1; g.fillStyle = "#111";
    if (x1 - x0 - 4 > 20) {
      g.save(); g.beginPath(); g.rect(x0, y, x1 - x0, 12); g.clip();
      g.fillText(name, x0 + 2, y + 10); g.restore();
    }
  });
};
TimelineView.prototype.drawAxes = function (g, box, ymax, yOf) {
  g.strokeStyle = "#999"; g.fillStyle = "#444"; g.lineWidth = 1;
  g.strokeRect(box.x, box.y, box.w, box.h);
  const step = niceStep(ymax / 5, true);
  for (let v = 0; v <= ymax; v += step) {
    g.fillText(size(v), 4, yOf(v) + 4);
    g.fillStyle = "#eee"; g.fillRect(box.x + 1, yOf(v), box.w - 2, 1); g.fillStyle = "#444";
  }
  const tstep = niceStep((this.to - this.from) / 8, false);
  for (let t = Math.ceil(this.from / tstep) * tstep; t <= this.to; t += tstep) {
    const x = this.xOf(t, box);
    g.fillRect(x, box.y + box.h, 1, 4);
    const label = "+" + dur(t);
    // The last label stays inside the canvas, the first inside the plot's left edge.
    const lx = Math.max(box.x - 4, Math.min(x - 14, box.x + box.w - g.measureText(label).width));
    g.fillText(label, lx, box.y + box.h + 16);
  }
};
// The step of an axis's ticks: the smallest power of 2 (binary) or 1, 2 or 5 times a power of 10
// that is at least `raw`.
function niceStep(raw, binary) {
  const base = binary ? 2 : 10;
  const p = Math.pow(base, Math.floor(Math.log(Math.max(raw, 1e-9)) / Math.log(base)));
  for (const m of binary ? [1, 2] : [1, 2, 5]) if (p * m >= raw) return p * m;
  return p * base;
}
TimelineView.prototype.drawMarks = function (g, box, yOf, d) {
  const inside = t => t >= this.from && t <= this.to;
  this.drawCeilings(g, box, yOf, d);
  g.setLineDash([6, 4]);
  g.strokeStyle = "#6a1b9a";
  for (const t of d.resets) if (inside(t)) {
    g.beginPath(); g.moveTo(this.xOf(t, box), box.y); g.lineTo(this.xOf(t, box), box.y + box.h); g.stroke();
    g.fillStyle = "#6a1b9a"; g.fillText("peak reset", this.xOf(t, box) + 3, box.y + 24);
  }
  g.setLineDash([]);
  for (const [kind, t, dev, , used] of this.run.marks) if (dev === d.device && inside(t)) {
    g.fillStyle = kind === "denied" ? "#d50000" : "#6a1b9a";
    g.fillText("×", this.xOf(t, box) - 3, yOf(used) + 4);
  }
  if (inside(d.peak_t)) this.drawPeak(g, box, yOf, d);
  if (inside(this.instant)) {
    g.fillStyle = "#ff6f00"; g.fillRect(this.xOf(this.instant, box), box.y, 1.5, box.h);
  }
};
// The ceiling's steps in the span shown, dashed. A ceiling above the plotted range is said in
// words at the top, never drawn at the edge (where it would look like a ceiling at the range's top).
TimelineView.prototype.drawCeilings = function (g, box, yOf, d) {
  g.strokeStyle = "#c62828"; g.setLineDash([6, 4]); g.lineWidth = 1.5; g.beginPath();
  const above = [];
  d.ceil.forEach(([t, limit], i) => {
    const next = i + 1 < d.ceil.length ? d.ceil[i + 1][0] : this.run.end;
    if (limit == null || next < this.from || t > this.to) return;
    const y = yOf(limit);
    if (y < box.y) { above.push([t, limit]); return; }
    g.moveTo(Math.max(box.x, this.xOf(t, box)), y);
    g.lineTo(Math.min(box.x + box.w, this.xOf(next, box)), y);
  });
  g.stroke();
  g.setLineDash([]);
  this.chart.dataset.ceilingAbove = above.map(([, limit]) => limit).join(" ");
  for (const [t, limit] of above) {
    g.fillStyle = "#c62828";
    g.fillText("\u2191 ceiling " + size(limit) + ", above this range",
      Math.max(box.x, this.xOf(t, box)) + 4, box.y + 12);
  }
};
// The peak: a dot, and its label on the side with more room, on a light ground, so that neither
// the spike it names nor a refusal mark beside it runs through its text.
TimelineView.prototype.drawPeak = function (g, box, yOf, d) {
  const x = this.xOf(d.peak_t, box), y = yOf(d.peak);
  g.fillStyle = "#000"; g.beginPath(); g.arc(x, y, 4, 0, 7); g.fill();
  const label = "peak " + size(d.peak), tw = g.measureText(label).width;
  const lx = x - box.x > box.w / 2 ? x - 8 - tw : x + 8;
  const ly = Math.max(box.y + 12, y - 8);
  g.fillStyle = "rgba(255, 255, 255, 0.85)"; g.fillRect(lx - 2, ly - 10, tw + 4, 13);
  g.fillStyle = "#000"; g.fillText(label, lx, ly);
};
