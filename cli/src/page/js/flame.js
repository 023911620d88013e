// flame.js: the icicle graph of what was live at an instant: call sites' frames as a tree, the
// outermost frame at the top, the innermost at the bottom and under it the module that asked the
// driver; each box as wide as the bytes below it.

// The tree of `items` (`{bytes, site, module}`): each node `{name, bytes, kids (by name), items}`,
// and `depth`, the rows it takes (the root's included).
function flameTree(items) {
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
  return { root, depth };
}

// The names along the widest path from the root down: the frames a reader looks at first.
function widestPath(root) {
  const path = [];
  let node = root;
  while (node.kids.size) {
    node = [...node.kids.values()].reduce((p, q) => (q.bytes > p.bytes ? q : p));
    path.push(node.name);
  }
  return path;
}

// Draws the icicle graph of `items` (each with a `text()` for its tooltip; `total` bytes) on
// `canvas`, whose data- attributes name the widest path's innermost frame and module.
function drawFlame(canvas, items, total) {
  const { root, depth } = flameTree(items);
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
  const path = widestPath(root), python = path.filter(n => !n.startsWith("["));
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
