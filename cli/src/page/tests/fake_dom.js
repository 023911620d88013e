// fake_dom.js: the little of a browser the page's modules use, for their unit tests under node:
// elements (attributes, dataset, children, text, listeners), a canvas whose 2D context records what
// is drawn, `document` with the page's fixed elements (page.html), `window` and `performance`.
"use strict";

class FakeElement {
  constructor(tag) {
    this.tagName = tag.toUpperCase();
    this.children = [];
    this.attributes = {};
    // As in a browser, what is stored in the dataset is a string.
    this.dataset = new Proxy({}, { set(d, k, v) { d[k] = String(v); return true; } });
    this.style = {};
    this.className = "";
    this.hidden = false;
    this.listeners = {};
    this.text = "";
    this.clientWidth = 1000;
    this.parentElement = null;
  }
  setAttribute(name, value) {
    value = String(value);
    this.attributes[name] = value;
    if (name === "id") this.id = value;
    if (name.startsWith("data-")) this.dataset[name.slice(5).replace(/-(\w)/g, (m, c) => c.toUpperCase())] = value;
  }
  getAttribute(name) { return name in this.attributes ? this.attributes[name] : null; }
  append(...kids) {
    for (const k of kids) {
      const node = typeof k === "string" ? { text: k, children: [] } : k;
      node.parentElement = this;
      this.children.push(node);
    }
  }
  replaceChildren(...kids) { this.children = []; this.append(...kids); }
  get textContent() { return this.text + this.children.map(textOf).join(""); }
  set textContent(value) { this.text = String(value); this.children = []; }
  addEventListener(type, f) { (this.listeners[type] = this.listeners[type] || []).push(f); }
  // Calls the listeners of `type` (and the `on<type>` handler) with `ev`.
  fire(type, ev) {
    for (const f of this.listeners[type] || []) f(ev);
    if (this["on" + type]) this["on" + type](ev);
  }
  getBoundingClientRect() { return { left: 0, top: 0, width: this.clientWidth, height: 320 }; }
  getContext() { return this.context || (this.context = new FakeContext()); }
  // Every element below this one, depth first.
  *all() {
    for (const k of this.children) if (k instanceof FakeElement) { yield k; yield* k.all(); }
  }
  // The elements below this one with tag `tag`.
  byTag(tag) { return [...this.all()].filter(e => e.tagName === tag.toUpperCase()); }
}

function textOf(node) { return node instanceof FakeElement ? node.textContent : node.text; }

// A 2D context: remembers the texts drawn (`texts`) and ignores the rest.
class FakeContext {
  constructor() { this.texts = []; }
  fillText(text, x, y) { this.texts.push(text); }
  measureText(text) { return { width: 6 * text.length }; }
}
for (const m of ["setTransform", "clearRect", "fillRect", "strokeRect", "save", "restore", "beginPath",
  "rect", "clip", "moveTo", "lineTo", "stroke", "setLineDash", "arc", "fill"]) {
  FakeContext.prototype[m] = function () {};
}

// The globals of a page whose data is `data`: `document` (with page.html's #job, #runs, #compare, #tip
// and #gmh-data), `window` and `performance`.
function fakePage(data) {
  const body = new FakeElement("body");
  const make = (tag, id) => { const e = new FakeElement(tag); e.setAttribute("id", id); body.append(e); return e; };
  make("section", "job").hidden = true;
  make("main", "runs");
  make("section", "compare").hidden = true;
  make("div", "tip").hidden = true;
  make("script", "gmh-data").textContent = JSON.stringify(data || { runs: [] });
  const document = {
    body,
    createElement: tag => new FakeElement(tag),
    getElementById: id => [...body.all()].find(e => e.id === id) || null,
  };
  const window = new FakeElement("window");
  Object.assign(window, { devicePixelRatio: 1, innerWidth: 1400 });
  return { document, window, performance: { now: () => 42 } };
}

module.exports = { FakeElement, FakeContext, fakePage };
