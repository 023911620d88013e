// format.js: numbers as the page writes them. Sizes follow the rule of reader/src/size.rs, which
// the page's data carries (`sizes`, a `SizeRule`): no unit or threshold is written here.

// The size formatter of `rule`: `size(bytes)` is what Rust's `format_size(bytes)` writes.
function sizeFormatter(rule) {
  return function size(bytes) {
    let unit = 0, perUnit = 1;
    while (unit + 1 < rule.units.length && bytes >= perUnit * rule.step) { perUnit *= rule.step; unit++; }
    if (unit === 0) return bytes + " " + rule.units[0];
    const value = bytes / perUnit;
    return fixed(value, value < rule.fine_below ? rule.fine_digits : rule.coarse_digits) + " " + rule.units[unit];
  };
}

// `value` (at least 1) with `digits` decimals as Rust's `{:.N}` writes it: the nearest, and an
// exact tie to the even digit, where `toFixed` takes the larger (1.125: Rust "1.12", toFixed "1.13").
function fixed(value, digits) {
  const text = value.toFixed(digits), scaled = value * Math.pow(10, digits);
  // A tie's scaled value is exact (k + 0.5 is a double), so only those come near 0.5.
  if (Math.abs(scaled - Math.floor(scaled) - 0.5) > 1e-6) return text;
  const exact = value.toFixed(100);  // every decimal of the double: a tie is 5 and zeros after them
  if (!/^50*$/.test(exact.slice(exact.indexOf(".") + 1 + digits))) return text;
  const last = +text[text.length - 1];
  return last % 2 === 0 ? text : text.slice(0, -1) + (last - 1);
}

// A duration in µs, as `12 µs`, `3.40 ms`, `12.5 s` or `2.0 min`.
function dur(us) {
  const a = Math.abs(us);
  if (a < 1000) return us.toFixed(0) + " µs";
  if (a < 1e6) return (us / 1e3).toFixed(a < 1e4 ? 2 : 1) + " ms";
  if (a < 6e7) return (us / 1e6).toFixed(a < 1e7 ? 2 : 1) + " s";
  return (us / 6e7).toFixed(1) + " min";
}

// `part` as a percentage of `whole`, `-` when there is no whole.
function share(part, whole) { return whole > 0 ? (100 * part / whole).toFixed(1) + " %" : "-"; }

// The innermost frame of a call site (`file:line in f < caller < ...`).
function innermost(site) { return site ? site.split(" < ")[0] : "no Python call site"; }
