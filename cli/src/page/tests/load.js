// load.js: the page's modules (../js) for their unit tests, run as the page runs them: in the
// order of html.rs's SCRIPTS, inside one strict function, so that they share one scope. The
// size rule is Rust's, from sizes.json (which a Rust test keeps equal to reader/src/size.rs).
"use strict";
const fs = require("node:fs");
const path = require("node:path");
const vm = require("node:vm");
const { fakePage } = require("./fake_dom.js");

const PAGE = path.join(__dirname, "..");
const SIZES = JSON.parse(fs.readFileSync(path.join(__dirname, "sizes.json"), "utf8"));

// The page's modules, in the order html.rs puts them in the page.
function order() {
  const html = fs.readFileSync(path.join(PAGE, "html.rs"), "utf8");
  const names = [...html.matchAll(/include_str!\("js\/([\w.-]+)"\)/g)].map(m => m[1]);
  if (names.length < 2) throw new Error("html.rs lists no modules of js/ (include_str!(\"js/...\"))");
  return names;
}

// Runs the modules `names` (every one, main.js included, when null) in the page's order with
// `globals` in scope (by default those of an empty fake page), and returns a lookup of what they
// define: `$("size")`, `$("TimelineView")`. Without main.js, `size` is Rust's rule's formatter.
function load(names, globals) {
  const all = order(), wanted = names || all;
  for (const n of wanted) if (!all.includes(n)) throw new Error(n + " is not a module of the page");
  let source = all.filter(n => wanted.includes(n))
    .map(n => "// ---- js/" + n + " ----\n" + fs.readFileSync(path.join(PAGE, "js", n), "utf8")).join("\n");
  if (wanted.includes("format.js") && !wanted.includes("main.js")) {
    source += "\nconst size = sizeFormatter(" + JSON.stringify(SIZES.rule) + ");";
  }
  const scope = globals || fakePage();
  const params = Object.keys(scope);
  const run = vm.compileFunction('"use strict";\n' + source + "\nreturn name => eval(name);", params,
    { filename: "page.js (" + wanted.join(", ") + ")" });
  return run(...params.map(p => scope[p]));
}

module.exports = { load, order, SIZES };
