// instant.js: what was live at the timeline's chosen instant: its heading (#instant), the flame
// graph (flame.js), the strip of live allocations largest first, and the tables by module and site.

// The allocations live at the instant on the device shown, largest first (indexes into `allocs`).
TimelineView.prototype.live = function () {
  if (this.dev < 0) return [];
  return liveAt(this.run.allocs, this.spans, this.run.devices[this.dev].device, this.instant);
};
// Allocation `i` for its tooltip: size, module, thread, age at the instant, site.
TimelineView.prototype.describe = function (i) {
  const a = this.run.allocs, r = this.run;
  return size(a.b[i]) + "\nmodule " + (r.modules[a.m[i]] || "unknown") + "\nthread " + r.threads[a.h[i]] +
    "\nage " + dur(this.instant - this.spans.starts[i]) + "\nsite " + (r.sites[a.s[i]] || "none recorded");
};
TimelineView.prototype.showInstant = function () {
  const live = this.live(), a = this.run.allocs, r = this.run;
  let total = 0;
  for (const i of live) total += a.b[i];
  this.instantEl.textContent = "live at +" + dur(this.instant) + ": " + size(total) + " in " + live.length +
    (live.length === 1 ? " allocation" : " allocations") + (this.dev >= 0 && this.instant === r.devices[this.dev].peak_t ? " (the peak)" : "");
  this.instantEl.dataset.t = Math.round(this.instant);
  this.instantEl.dataset.bytes = total;
  drawFlame(this.flame, live.map(i => ({ bytes: a.b[i], site: r.sites[a.s[i]], module: r.modules[a.m[i]] || "unknown module",
    text: () => this.describe(i) })), total);
  this.drawStrip(live, total);
  const rows = liveRows(r, live, total);
  this.tables.replaceChildren(
    el("div", { id: "by-module" + this.sfx }, el("h3", { text: "by module" }), table(["module", "bytes", "share"], rows.modules, [0, 1, 1])),
    el("div", { id: "by-site" + this.sfx }, el("h3", { text: "by call site" }),
      table(["site", "bytes", "share", "allocations"], rows.sites, [0, 1, 1, 1])));
};
// The rows of the tables of `live` (indexes into `run.allocs`, holding `total` bytes): by module
// (name, bytes, share) and by site (site, bytes, share, allocations; the 200 largest), largest first.
function liveRows(run, live, total) {
  const a = run.allocs, byModule = new Map(), bySite = new Map();
  for (const i of live) {
    byModule.set(a.m[i], (byModule.get(a.m[i]) || 0) + a.b[i]);
    const s = bySite.get(a.s[i]) || [0, 0];
    bySite.set(a.s[i], [s[0] + a.b[i], s[1] + 1]);
  }
  const modules = [...byModule].sort((x, y) => y[1] - x[1]).map(([m, b]) => [run.modules[m] || "unknown", size(b), share(b, total)]);
  const sites = [...bySite].sort((x, y) => y[1][0] - x[1][0]).slice(0, 200)
    .map(([s, [b, n]]) => [run.sites[s] || "no Python call site", size(b), share(b, total), n]);
  return { modules, sites };
}
// The first 2000 live allocations side by side, each as wide as its share; hovering one describes it.
TimelineView.prototype.drawStrip = function (live, total) {
  const { g, w } = canvasSize(this.strip, 26);
  const shown = live.slice(0, 2000), a = this.run.allocs, boxes = [];
  let x = 0;
  shown.forEach(i => {
    const bw = total > 0 ? a.b[i] / total * w : 0;
    g.fillStyle = COLORS[a.s[i] % COLORS.length];
    g.fillRect(x, 2, Math.max(bw - (bw > 3 ? 1 : 0), 0.5), 22);
    boxes.push([x, x + Math.max(bw, 0.5), i]);
    x += bw;
  });
  this.strip.onmousemove = ev => {
    const px = ev.clientX - this.strip.getBoundingClientRect().left;
    const hit = boxes.find(b => px >= b[0] && px < b[1]);
    if (hit) showTip(ev, this.describe(hit[2])); else hideTip();
  };
  this.strip.onmouseleave = hideTip;
};
