// pointer.js: the timeline's chart under the mouse: a click picks the instant (snapped to the
// spike aimed at), a drag zooms in, shift-drag pans, the wheel zooms or pans, a double-click shows
// the whole run, and hovering says the time and `used` there.

// A click lands on the highest point within 3 pixels of it (the spike one aimed at), else on
// the time under it; on a long run's page, on the moment nearest that (what was live is kept at
// its moments only).
TimelineView.prototype.snap = function (x, box) {
  return nearestMoment(this.run.moments, this.aim(x, box));
};
TimelineView.prototype.aim = function (x, box) {
  const t = Math.max(0, Math.min(this.run.end, this.tOf(x, box)));
  if (this.dev < 0) return t;
  const s = this.series[this.dev], px = (this.to - this.from) / box.w;
  const i0 = firstAtOrAfter(s.times, t - 3 * px), i1 = Math.min(firstAtOrAfter(s.times, t + 3 * px), i0 + 100000);
  let best = -1;
  for (let i = i0; i < i1; i++) if (best < 0 || s.used[i] > s.used[best]) best = i;
  const d = s.d;
  if (Math.abs(d.peak_t - t) <= 3 * px && (best < 0 || s.used[best] <= d.peak)) return d.peak_t;
  return best < 0 ? t : s.times[best];
};
// The x of `ev` on the chart, CSS pixels from its left edge.
TimelineView.prototype.xAt = function (ev) { return ev.clientX - this.chart.getBoundingClientRect().left; };
TimelineView.prototype.listen = function () {
  const c = this.chart;
  let down = null;
  c.addEventListener("mousedown", ev => {
    down = { x: this.xAt(ev), pan: ev.shiftKey || ev.button === 1, from: this.from, to: this.to };
    ev.preventDefault();
  });
  window.addEventListener("mousemove", ev => {
    if (!down) return;
    const x = this.xAt(ev), box = this.box;
    if (down.pan) {
      const shift = (down.x - x) / box.w * (down.to - down.from);
      this.zoom(down.from + shift, down.to + shift);
    } else {
      this.draw();
      const g = c.getContext("2d");
      g.fillStyle = "rgba(255,111,0,0.15)";
      g.fillRect(Math.min(down.x, x), box.y, Math.abs(x - down.x), box.h);
    }
  });
  window.addEventListener("mouseup", ev => {
    if (!down) return;
    const x = this.xAt(ev), box = this.box, was = down;
    down = null;
    if (was.pan) return;
    if (Math.abs(x - was.x) < 4) {
      this.instant = this.snap(x, box);
      this.draw(); this.showInstant();
    } else {
      this.zoom(this.tOf(Math.min(was.x, x), box), this.tOf(Math.max(was.x, x), box));
    }
  });
  c.addEventListener("dblclick", () => this.zoom(0, Math.max(this.run.end, 1)));
  this.listenWheelAndHover(() => down != null);
};
// The wheel zooms around the pointer (or pans, sideways); hovering, unless `dragging()`, says the
// time and `used` under the pointer.
TimelineView.prototype.listenWheelAndHover = function (dragging) {
  const c = this.chart;
  c.addEventListener("wheel", ev => {
    ev.preventDefault();
    const box = this.box, span = this.to - this.from;
    if (Math.abs(ev.deltaX) > Math.abs(ev.deltaY)) {
      const shift = ev.deltaX / box.w * span;
      this.zoom(this.from + shift, this.to + shift);
      return;
    }
    const at = this.tOf(this.xAt(ev), box), f = Math.exp(ev.deltaY * 0.002);
    this.zoom(at - (at - this.from) * f, at + (this.to - at) * f);
  }, { passive: false });
  c.addEventListener("mousemove", ev => {
    if (dragging() || this.dev < 0) return;
    const s = this.series[this.dev], t = this.tOf(this.xAt(ev), this.box);
    const i = firstAtOrAfter(s.times, t + 1e-9);
    showTip(ev, "+" + dur(t) + "\nused " + size(i > 0 ? s.used[i - 1] : 0) + "\nclick: what was live then");
  });
  c.addEventListener("mouseleave", hideTip);
};
