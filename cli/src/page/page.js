// gpumemhook view: draws the data of #gmh-data (cli/src/page/data.rs) with canvas, no library.
// Each run gets its figures, its timeline (min/max per pixel column from a pyramid, zoom and pan),
// what was live at a chosen instant (flame graph by call site, tables by module and site) and,
// for reports, their tables. Figures a test reads carry ids and data- attributes.
"use strict";
(function () {
  const DATA = JSON.parse(document.getElementById("gmh-data").textContent);
  const COLORS = ["#42a5f5", "#66bb6a", "#ffa726", "#ab47bc", "#26c6da", "#ef5350", "#8d6e63",
    "#d4e157", "#ec407a", "#78909c"];
  const tip = document.getElementById("tip");

  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "text") e.textContent = v;
      else if (k === "cls") e.className = v;
      else e.setAttribute(k, v);
    }
    for (const k of kids) if (k != null) e.append(k);
    return e;
  }
  function size(b) {
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let u = 0, v = b;
    while (Math.abs(v) >= 1024 && u < units.length - 1) { v /= 1024; u++; }
    return u === 0 ? b + " B" : v.toFixed(2) + " " + units[u];
  }
  function dur(us) {
    const a = Math.abs(us);
    if (a < 1000) return us.toFixed(0) + " µs";
    if (a < 1e6) return (us / 1e3).toFixed(a < 1e4 ? 2 : 1) + " ms";
    if (a < 6e7) return (us / 1e6).toFixed(a < 1e7 ? 2 : 1) + " s";
    return (us / 6e7).toFixed(1) + " min";
  }
  function share(part, whole) { return whole > 0 ? (100 * part / whole).toFixed(1) + " %" : "-"; }
  function undelta(arr) {
    const out = new Float64Array(arr.length);
    let v = 0;
    for (let i = 0; i < arr.length; i++) { v += arr[i]; out[i] = v; }
    return out;
  }
  function showTip(ev, text) {
    tip.textContent = text;
    tip.hidden = false;
    tip.style.left = Math.min(ev.clientX + 12, window.innerWidth - 360) + "px";
    tip.style.top = (ev.clientY + 14) + "px";
  }
  function hideTip() { tip.hidden = true; }
  function innermost(site) { return site ? site.split(" < ")[0] : "no Python call site"; }
  function table(head, rows, numeric) {
    const t = el("table", {}, el("tr", {}, ...head.map((h, i) =>
      el("th", { cls: numeric[i] ? "n" : "", text: h }))));
    for (const r of rows) {
      t.append(el("tr", {}, ...r.map((c, i) =>
        el("td", { cls: numeric[i] ? "n" : (i === 0 ? "site" : ""), text: String(c) }))));
    }
    return t;
  }
  function canvasSize(c, height) {
    const dpr = window.devicePixelRatio || 1;
    const w = Math.max(200, c.clientWidth || c.parentElement.clientWidth || 800);
    c.width = Math.round(w * dpr);
    c.height = Math.round(height * dpr);
    c.style.height = height + "px";
    const g = c.getContext("2d");
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    return { g, w, h: height };
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
  Pyramid.prototype.range = function (i0, i1) {
    let lo = Infinity, hi = -Infinity, k = 0;
    while (i0 < i1) {
      if (i0 & 1) { lo = Math.min(lo, this.mins[k][i0]); hi = Math.max(hi, this.maxs[k][i0]); i0++; }
      if (i1 & 1) { i1--; lo = Math.min(lo, this.mins[k][i1]); hi = Math.max(hi, this.maxs[k][i1]); }
      i0 >>= 1; i1 >>= 1; k++;
    }
    return [lo, hi];
  };
  function firstAtOrAfter(times, t) {
    let lo = 0, hi = times.length;
    while (lo < hi) { const m = (lo + hi) >> 1; if (times[m] < t) lo = m + 1; else hi = m; }
    return lo;
  }

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
        s.top_site ? " (peak " + size(s.top_site_peak) + ")" : ""));
  }

  // ---- a timeline ----
  function TimelineView(run, root, sfx) {
    this.run = run; this.sfx = sfx;
    this.series = run.devices.map(d => {
      const times = undelta(d.t), used = undelta(d.v);
      return { d, times, used, pyramid: new Pyramid(used.length ? used : new Float64Array([0])) };
    });
    const a = run.allocs;
    this.starts = undelta(a.t);
    this.ends = new Float64Array(a.e.length);
    for (let i = 0; i < a.e.length; i++) this.ends[i] = a.e[i] < 0 ? Infinity : this.starts[i] + a.e[i];
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
    this.instantEl = el("h3", { id: "instant" + sfx });
    this.flame = el("canvas", { id: "flame" + sfx });
    this.strip = el("canvas", { id: "allocs" + sfx });
    this.tables = el("div", { cls: "tables" });
    root.append(this.instantEl, this.flame,
      el("h3", { text: "largest live allocations (hover one)" }), this.strip, this.tables);
    this.listen();
  };
  TimelineView.prototype.plotBox = function (w, h) {
    const lanes = this.lanes().count;
    const top = 6 + lanes * 15;
    return { x: 74, y: top, w: w - 84, h: h - top - 24 };
  };
  TimelineView.prototype.lanes = function () {
    if (this._lanes) return this._lanes;
    const ends = [], lane = [];
    const order = this.run.scopes.map((s, i) => i).sort((a, b) => this.run.scopes[a][1] - this.run.scopes[b][1]);
    for (const i of order) {
      const [, open, close] = this.run.scopes[i];
      let l = ends.findIndex(e => e <= open);
      if (l < 0) { l = ends.length; ends.push(0); }
      ends[l] = close == null ? Infinity : close;
      lane[i] = l;
    }
    this._lanes = { lane, count: Math.min(ends.length, 6) };
    return this._lanes;
  };
  TimelineView.prototype.xOf = function (t, box) { return box.x + (t - this.from) / (this.to - this.from) * box.w; };
  TimelineView.prototype.tOf = function (x, box) { return this.from + (x - box.x) / box.w * (this.to - this.from); };
  TimelineView.prototype.zoom = function (from, to) {
    const end = Math.max(this.run.end, 1), span = Math.max(to - from, 2);
    from = Math.max(0, Math.min(from, end - span));
    this.from = from; this.to = Math.min(end, from + span);
    this.draw();
  };

  // Min and max of `used` per pixel column, with the value carried into each column.
  TimelineView.prototype.columns = function (s, box) {
    const n = Math.max(1, Math.floor(box.w)), lo = new Float64Array(n), hi = new Float64Array(n);
    const dt = (this.to - this.from) / n;
    let i = firstAtOrAfter(s.times, this.from);
    for (let c = 0; c < n; c++) {
      const j = firstAtOrAfter(s.times, this.from + (c + 1) * dt);
      const before = i > 0 ? s.used[i - 1] : 0;
      let [mn, mx] = i < j ? s.pyramid.range(i, j) : [before, before];
      lo[c] = Math.min(mn, before); hi[c] = Math.max(mx, before);
      i = j;
    }
    return { lo, hi, n };
  };

  // Held per group (module or site) at the end of each pixel column, by difference arrays: no sort.
  TimelineView.prototype.stacks = function (box, n) {
    const a = this.run.allocs, dev = this.run.devices[this.dev].device;
    const key = this.mode === "module" ? a.m : a.s;
    const names = this.mode === "module" ? this.run.modules : this.run.sites;
    const groups = this.rankGroups(key, names.length, dev);
    const dt = (this.to - this.from) / n;
    const diff = groups.top.map(() => new Float64Array(n + 1));
    for (let i = 0; i < this.starts.length; i++) {
      if (a.d[i] !== dev || this.starts[i] > this.to || this.ends[i] <= this.from) continue;
      const c0 = Math.max(0, Math.floor((this.starts[i] - this.from) / dt));
      const c1 = Math.min(n, Math.floor((this.ends[i] - this.from) / dt));
      if (c1 <= c0) continue;
      const g = diff[groups.slot[key[i]]];
      g[c0] += a.b[i]; g[c1] -= a.b[i];
    }
    const held = diff.map(d => { let v = 0; const out = new Float64Array(n); for (let c = 0; c < n; c++) { v += d[c]; out[c] = v; } return out; });
    const labels = groups.top.map((k, i) => (held[i].some(v => v > 0) ? (k < 0 ? "other" : this.groupName(k)) : null));
    return { held, labels };
  };
  TimelineView.prototype.groupName = function (k) {
    if (this.mode === "module") return this.run.modules[k] || "unknown module";
    return innermost(this.run.sites[k]);
  };
  // The nine groups holding the most at the peak, then "other".
  TimelineView.prototype.rankGroups = function (key, count, dev) {
    const at = this.run.devices[this.dev].peak_t, a = this.run.allocs, held = new Float64Array(count);
    for (let i = 0; i < this.starts.length; i++) {
      if (a.d[i] === dev && this.starts[i] <= at && this.ends[i] > at) held[key[i]] += a.b[i];
    }
    const order = Array.from(held.keys()).filter(k => held[k] > 0).sort((x, y) => held[y] - held[x]);
    const top = order.slice(0, 9);
    const slot = new Int32Array(count).fill(top.length);
    top.forEach((k, i) => { slot[k] = i; });
    top.push(-1);
    return { top, slot };
  };

  TimelineView.prototype.draw = function () {
    for (const [m, b] of Object.entries(this.buttons)) b.className = m === this.mode ? "on" : "";
    const { g, w, h } = canvasSize(this.chart, 320);
    const box = this.plotBox(w, h);
    this.box = box;
    g.clearRect(0, 0, w, h);
    g.font = "11px system-ui, sans-serif";
    this.chart.dataset.plotX = box.x;
    this.chart.dataset.plotW = box.w;
    this.rangeEl.dataset.from = Math.round(this.from);
    this.rangeEl.dataset.to = Math.round(this.to);
    this.rangeEl.textContent = "showing +" + dur(this.from) + " to +" + dur(this.to) + " of " + dur(this.run.end);
    if (this.dev < 0) { g.fillText("no device memory in this timeline", box.x, box.y + 20); return; }
    const s = this.series[this.dev], d = s.d;
    const col = this.columns(s, box);
    let ymax = 1;
    for (let c = 0; c < col.n; c++) ymax = Math.max(ymax, col.hi[c]);
    const ceilings = d.ceil.filter(c => c[1] != null && c[1] < ymax * 1.6).map(c => c[1]);
    ymax = Math.max(ymax, ...ceilings) * 1.08;
    const yOf = v => box.y + box.h - v / ymax * box.h;
    this.drawScopes(g, box);
    this.drawAxes(g, box, ymax, yOf);
    if (this.mode === "total") {
      g.fillStyle = "rgba(66,165,245,0.35)";
      for (let c = 0; c < col.n; c++) g.fillRect(box.x + c, yOf(col.lo[c]), 1, box.y + box.h - yOf(col.lo[c]));
      this.legend.replaceChildren(el("span", { text: "used on device " + d.device }));
    } else {
      const st = this.stacks(box, col.n);
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
    g.fillStyle = "#1565c0";  // the envelope: min to max of every column
    for (let c = 0; c < col.n; c++) g.fillRect(box.x + c, yOf(col.hi[c]), 1, Math.max(1, yOf(col.lo[c]) - yOf(col.hi[c])));
    this.drawMarks(g, box, yOf, d);
  };
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
      const label = name, room = x1 - x0 - 4;
      if (room > 20) {
        g.save(); g.beginPath(); g.rect(x0, y, x1 - x0, 12); g.clip();
        g.fillText(label, x0 + 2, y + 10); g.restore();
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
  function niceStep(raw, binary) {
    const base = binary ? 2 : 10;
    const p = Math.pow(base, Math.floor(Math.log(Math.max(raw, 1e-9)) / Math.log(base)));
    for (const m of binary ? [1, 2] : [1, 2, 5]) if (p * m >= raw) return p * m;
    return p * base;
  }
  TimelineView.prototype.drawMarks = function (g, box, yOf, d) {
    const inside = t => t >= this.from && t <= this.to;
    g.strokeStyle = "#c62828"; g.setLineDash([6, 4]); g.lineWidth = 1.5; g.beginPath();
    // A ceiling above the plotted range is said in words at the top, never drawn at the edge
    // (where it would look like a ceiling at the range's top).
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
    if (inside(d.peak_t)) {
      const x = this.xOf(d.peak_t, box), y = yOf(d.peak);
      g.fillStyle = "#000"; g.beginPath(); g.arc(x, y, 4, 0, 7); g.fill();
      // The label on the side of the peak with more room, on a light ground, so that neither the
      // spike it names nor a refusal mark beside it runs through its text.
      const label = "peak " + size(d.peak), tw = g.measureText(label).width;
      const lx = x - box.x > box.w / 2 ? x - 8 - tw : x + 8;
      const ly = Math.max(box.y + 12, y - 8);
      g.fillStyle = "rgba(255, 255, 255, 0.85)"; g.fillRect(lx - 2, ly - 10, tw + 4, 13);
      g.fillStyle = "#000"; g.fillText(label, lx, ly);
    }
    if (inside(this.instant)) {
      g.fillStyle = "#ff6f00"; g.fillRect(this.xOf(this.instant, box), box.y, 1.5, box.h);
    }
  };

  // A click lands on the highest point within 3 pixels of it (the spike one aimed at), else on
  // the time under it.
  TimelineView.prototype.snap = function (x, box) {
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
  TimelineView.prototype.listen = function () {
    const c = this.chart;
    let down = null;
    const xAt = ev => ev.clientX - c.getBoundingClientRect().left;
    c.addEventListener("mousedown", ev => {
      down = { x: xAt(ev), pan: ev.shiftKey || ev.button === 1, from: this.from, to: this.to };
      ev.preventDefault();
    });
    window.addEventListener("mousemove", ev => {
      if (!down) return;
      const x = xAt(ev), box = this.box;
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
      const x = xAt(ev), box = this.box, was = down;
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
    c.addEventListener("wheel", ev => {
      ev.preventDefault();
      const box = this.box, span = this.to - this.from;
      if (Math.abs(ev.deltaX) > Math.abs(ev.deltaY)) {
        const shift = ev.deltaX / box.w * span;
        this.zoom(this.from + shift, this.to + shift);
        return;
      }
      const at = this.tOf(xAt(ev), box), f = Math.exp(ev.deltaY * 0.002);
      this.zoom(at - (at - this.from) * f, at + (this.to - at) * f);
    }, { passive: false });
    c.addEventListener("mousemove", ev => {
      if (down || this.dev < 0) return;
      const s = this.series[this.dev], t = this.tOf(xAt(ev), this.box);
      const i = firstAtOrAfter(s.times, t + 1e-9);
      showTip(ev, "+" + dur(t) + "\nused " + size(i > 0 ? s.used[i - 1] : 0) + "\nclick: what was live then");
    });
    c.addEventListener("mouseleave", hideTip);
  };

  // What was live at the chosen instant: allocations made at or before it and not freed by then.
  TimelineView.prototype.live = function () {
    const a = this.run.allocs, T = this.instant, out = [];
    if (this.dev < 0) return out;
    const dev = this.run.devices[this.dev].device;
    for (let i = 0; i < this.starts.length && this.starts[i] <= T; i++) {
      if (a.d[i] === dev && this.ends[i] > T) out.push(i);
    }
    return out.sort((x, y) => a.b[y] - a.b[x]);
  };
  TimelineView.prototype.describe = function (i) {
    const a = this.run.allocs, r = this.run;
    return size(a.b[i]) + "\nmodule " + (r.modules[a.m[i]] || "unknown") + "\nthread " + r.threads[a.h[i]] +
      "\nage " + dur(this.instant - this.starts[i]) + "\nsite " + (r.sites[a.s[i]] || "none recorded");
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
    const byModule = new Map(), bySite = new Map();
    for (const i of live) {
      byModule.set(a.m[i], (byModule.get(a.m[i]) || 0) + a.b[i]);
      const s = bySite.get(a.s[i]) || [0, 0];
      bySite.set(a.s[i], [s[0] + a.b[i], s[1] + 1]);
    }
    const mods = [...byModule].sort((x, y) => y[1] - x[1]).map(([m, b]) => [r.modules[m] || "unknown", size(b), share(b, total)]);
    const sites = [...bySite].sort((x, y) => y[1][0] - x[1][0]).slice(0, 200)
      .map(([s, [b, n]]) => [r.sites[s] || "no Python call site", size(b), share(b, total), n]);
    this.tables.replaceChildren(
      el("div", { id: "by-module" + this.sfx }, el("h3", { text: "by module" }), table(["module", "bytes", "share"], mods, [0, 1, 1])),
      el("div", { id: "by-site" + this.sfx }, el("h3", { text: "by call site" }),
        table(["site", "bytes", "share", "allocations"], sites, [0, 1, 1, 1])));
  };
  TimelineView.prototype.drawStrip = function (live, total) {
    const { g, w } = canvasSize(this.strip, 26);
    const shown = live.slice(0, 2000), a = this.run.allocs, boxes = [];
    let x = 0;
    shown.forEach((i, k) => {
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

  // An icicle graph of call sites: the outermost frame at the top, the innermost at the bottom, and
  // under it the module that asked the driver; each box as wide as the bytes below it.
  function drawFlame(canvas, items, total) {
    const root = { name: "all", bytes: 0, kids: new Map(), items: [] };
    let depth = 1;
    for (const it of items) {
      const frames = it.site ? it.site.split(" < ").reverse() : ["no Python call site"];
      // A stack cut at the recorded depth (`--stacks python:SIZE:depth=N`) does not reach the
      // script's top: under a root of its own, so that the first row holds only outermost frames.
      if (it.site && !/ in <module>$/.test(frames[0])) frames.unshift("\u2026 outer frames not recorded");
      frames.push("[" + it.module + "]");
      let node = root;
      node.bytes += it.bytes;
      for (const f of frames) {
        if (!node.kids.has(f)) node.kids.set(f, { name: f, bytes: 0, kids: new Map(), items: [] });
        node = node.kids.get(f);
        node.bytes += it.bytes;
      }
      node.items.push(it);
      depth = Math.max(depth, frames.length + 1);
    }
    const rowH = 18, { g, w } = canvasSize(canvas, Math.min(depth, 24) * rowH + 2), boxes = [];
    g.font = "11px system-ui, sans-serif";
    const place = (node, x, level, width) => {
      if (level >= 24 || width < 0.3) return;
      boxes.push([x, level * rowH, width, node]);
      g.fillStyle = level === 0 ? "#b0bec5" : node.name.startsWith("[") ? "#ffb74d" : "#ef9a9a";
      g.fillRect(x, level * rowH, Math.max(width - 1, 0.5), rowH - 1);
      if (width > 30) {
        g.save(); g.beginPath(); g.rect(x, level * rowH, width - 2, rowH); g.clip();
        g.fillStyle = "#111"; g.fillText(node.name + " " + size(node.bytes), x + 3, level * rowH + 13); g.restore();
      }
      let cx = x;
      for (const kid of [...node.kids.values()].sort((p, q) => q.bytes - p.bytes)) {
        const kw = node.bytes > 0 ? width * kid.bytes / node.bytes : 0;
        place(kid, cx, level + 1, kw);
        cx += kw;
      }
    };
    place(root, 0, 0, w);
    // The widest path from the top down: the frame a reader looks at first.
    let node = root, path = [];
    while (node.kids.size) {
      node = [...node.kids.values()].reduce((p, q) => (q.bytes > p.bytes ? q : p));
      path.push(node.name);
    }
    const python = path.filter(n => !n.startsWith("["));
    canvas.dataset.total = total;
    canvas.dataset.topFrame = python.length ? python[python.length - 1] : "";
    canvas.dataset.topModule = path.length ? path[path.length - 1].slice(1, -1) : "";
    canvas.dataset.topPath = path.join(" > ");
    canvas.onmousemove = ev => {
      const r = canvas.getBoundingClientRect(), px = ev.clientX - r.left, py = ev.clientY - r.top;
      const hit = boxes.find(b => px >= b[0] && px < b[0] + b[2] && py >= b[1] && py < b[1] + rowH);
      if (!hit) { hideTip(); return; }
      const n = hit[3];
      showTip(ev, n.items.length === 1 && !n.kids.size ? n.items[0].text()
        : n.name + "\n" + size(n.bytes) + " (" + share(n.bytes, total) + " of what was live)");
    };
    canvas.onmouseleave = hideTip;
  }

  // ---- an exit report, an out-of-memory report, a live process ----
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
    const sites = (s.by_site || []).map(x => [x.site, size(x.used), size(x.peak), x.allocs]);
    root.append(el("div", { cls: "tables" },
      el("div", { id: "by-module" + sfx }, el("h3", { text: "by module" }),
        table(["module", "device", "used", "share", "peak"], mods, [0, 1, 1, 1, 1])),
      el("div", { id: "by-site" + sfx }, el("h3", { text: "by call site" }),
        sites.length ? table(["site", "used", "peak", "allocations"], sites, [0, 1, 1, 1])
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

  // Two runs: each site's peak in both.
  function compareView(a, b) {
    const peaks = run => new Map(run.source === "timeline" ? run.site_peaks
      : (run.report.by_site || []).map(x => [x.site, x.peak]));
    const pa = peaks(a), pb = peaks(b);
    const sites = [...new Set([...pa.keys(), ...pb.keys()])];
    sites.sort((x, y) => Math.max(pb.get(y) || 0, pa.get(y) || 0) - Math.max(pb.get(x) || 0, pa.get(x) || 0));
    const sec = document.getElementById("compare");
    sec.hidden = false;
    sec.append(el("h3", { text: "per-site peaks: " + a.label + " beside " + b.label }),
      el("p", { id: "peak-change", "data-bytes": b.summary.peak - a.summary.peak,
        text: "peak " + size(a.summary.peak) + " → " + size(b.summary.peak) }),
      sites.length ? table(["site", "peak (first)", "peak (second)", "change"], sites.slice(0, 300).map(s => {
        const x = pa.get(s) || 0, y = pb.get(s) || 0;
        return [s, size(x), size(y), (y >= x ? "+" : "-") + size(Math.abs(y - x))];
      }), [0, 1, 1, 1]) : el("p", { text: "no call sites in either run (--stacks python:1MiB records them)" }));
  }

  const views = [];
  DATA.runs.forEach((run, i) => {
    const sfx = i === 0 ? "" : "-" + (i + 1);
    const sec = el("section", { cls: "run", id: "run" + sfx, "data-source": run.source },
      el("h2", { text: (run.label === "pid " + run.pid ? "" : run.label + ": ") + "pid " + run.pid + "  " + run.command }),
      figures(run, sfx));
    document.getElementById("runs").append(sec);
    if (run.source === "timeline") views.push(new TimelineView(run, sec, sfx));
    else reportView(run, sec, sfx);
  });
  if (DATA.runs.length === 2) compareView(DATA.runs[0], DATA.runs[1]);
  // Drawn again now that every run has its place: a chart drawn before the second run was laid out
  // beside it had the whole width.
  const redraw = () => views.forEach(v => { v.draw(); v.showInstant(); });
  if (DATA.runs.length > 1) redraw();
  window.addEventListener("resize", redraw);
  // Milliseconds from the start of navigation to the first view drawn (scripts/bench/view).
  document.body.dataset.drawnMs = performance.now().toFixed(0);
  document.body.dataset.ready = "1";
})();
