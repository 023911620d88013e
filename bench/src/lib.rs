//! Shared pieces of gpumemhook's benchmark programs (`overhead`, `reader_latency`): statistics,
//! a deterministic random stream, argument parsing, and the plain-text tables they print.
//!
//! The programs are run by `scripts/bench/cpu`; what they measure and why is in `BENCHMARKS.md`.

use std::collections::BTreeMap;
use std::path::PathBuf;

/// The median of `values` (the mean of the two middle ones for an even count); NaN when empty.
pub fn median(values: &[f64]) -> f64 {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The `q`-quantile (0..=1) of `values` by nearest rank; NaN when empty.
pub fn quantile(values: &[f64], q: f64) -> f64 {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let rank = (q.clamp(0.0, 1.0) * (v.len() - 1) as f64).round() as usize;
    v[rank]
}

/// xorshift64: a deterministic stream, cheap enough (three shifts) not to weigh on a loop whose
/// whole cost is tens of nanoseconds, and identical in the hooked and un-hooked runs.
#[derive(Clone, Copy, Debug)]
pub struct XorShift(u64);

impl XorShift {
    pub fn new(seed: u64) -> XorShift {
        XorShift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    #[inline(always)]
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// A uniform index below `n` (multiply-high: no division on the hot loop).
    #[inline(always)]
    pub fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }
}

/// Command-line words as `--name value` pairs and bare `--flag`s.
#[derive(Debug, Default)]
pub struct Args {
    values: BTreeMap<String, String>,
    flags: Vec<String>,
}

impl Args {
    /// Parses `std::env::args()`: `--name value`, `--name=value`, or `--flag` (followed by another
    /// `--` word or nothing). Anything else is an error.
    pub fn parse() -> Result<Args, String> {
        Args::from_words(std::env::args().skip(1))
    }

    pub fn from_words(words: impl IntoIterator<Item = String>) -> Result<Args, String> {
        let mut args = Args::default();
        let mut words = words.into_iter().peekable();
        while let Some(w) = words.next() {
            let Some(name) = w.strip_prefix("--") else {
                return Err(format!("unexpected argument {w:?}"));
            };
            if let Some((n, v)) = name.split_once('=') {
                args.values.insert(n.to_string(), v.to_string());
            } else if words.peek().is_some_and(|next| !next.starts_with("--")) {
                let v = words.next().unwrap_or_default();
                args.values.insert(name.to_string(), v);
            } else {
                args.flags.push(name.to_string());
            }
        }
        Ok(args)
    }

    pub fn flag(&self, name: &str) -> bool {
        self.flags.iter().any(|f| f == name)
    }

    pub fn string(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str)
    }

    pub fn path(&self, name: &str, default: &str) -> PathBuf {
        PathBuf::from(self.string(name).unwrap_or(default))
    }

    /// A number, with `_` separators and `k`/`m` suffixes (`100k`, `1m`) allowed.
    pub fn number(&self, name: &str, default: u64) -> Result<u64, String> {
        match self.string(name) {
            None => Ok(default),
            Some(s) => parse_count(s).ok_or_else(|| format!("--{name}: not a count: {s:?}")),
        }
    }

    /// A comma-separated list of counts.
    pub fn list(&self, name: &str, default: &[u64]) -> Result<Vec<u64>, String> {
        match self.string(name) {
            None => Ok(default.to_vec()),
            Some(s) => s
                .split(',')
                .map(|w| parse_count(w).ok_or_else(|| format!("--{name}: not a count: {w:?}")))
                .collect(),
        }
    }
}

/// `1000`, `1_000`, `100k`, `1m`.
pub fn parse_count(s: &str) -> Option<u64> {
    let s = s.trim().replace('_', "").to_ascii_lowercase();
    let (digits, scale) = match s.as_bytes().last()? {
        b'k' => (&s[..s.len() - 1], 1_000),
        b'm' => (&s[..s.len() - 1], 1_000_000),
        _ => (&s[..], 1),
    };
    digits.parse::<u64>().ok()?.checked_mul(scale)
}

/// A count as people write it: `1k`, `100k`, `1M`.
pub fn short_count(n: u64) -> String {
    match n {
        n if n >= 1_000_000 && n % 1_000_000 == 0 => format!("{}M", n / 1_000_000),
        n if n >= 1_000 && n % 1_000 == 0 => format!("{}k", n / 1_000),
        n => n.to_string(),
    }
}

/// A table printed as aligned plain text (also valid Markdown: `|`-separated with a rule).
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(header: &[&str]) -> Table {
        Table {
            header: header.iter().map(|s| s.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// Markdown, columns padded so that it also reads well as plain text.
    pub fn render(&self) -> String {
        let columns = self.header.len();
        let mut width = vec![3usize; columns];
        for row in std::iter::once(&self.header).chain(&self.rows) {
            for (i, cell) in row.iter().enumerate().take(columns) {
                width[i] = width[i].max(cell.chars().count());
            }
        }
        let line = |cells: &[String]| {
            let mut s = String::from("|");
            for (i, w) in width.iter().enumerate() {
                let cell = cells.get(i).map_or("", String::as_str);
                s.push_str(&format!(" {cell:<w$} |"));
            }
            s.push('\n');
            s
        };
        let mut out = line(&self.header);
        out.push('|');
        for w in &width {
            out.push_str(&format!("{}|", "-".repeat(w + 2)));
        }
        out.push('\n');
        for row in &self.rows {
            out.push_str(&line(row));
        }
        out
    }
}

/// Nanoseconds with one decimal, or `-` for NaN.
pub fn ns(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.1}")
    } else {
        "-".to_string()
    }
}

/// The CPU model and logical CPU count of this machine, for the record.
pub fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|l| l.split_once(':'))
        .map_or("unknown CPU", |(_, m)| m.trim())
        .to_string();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    format!("{model}, {cpus} logical CPUs")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statistics() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
        assert_eq!(quantile(&[1.0, 2.0, 3.0, 4.0, 5.0], 0.25), 2.0);
    }

    #[test]
    fn counts_and_args() {
        assert_eq!(parse_count("100k"), Some(100_000));
        assert_eq!(parse_count("1M"), Some(1_000_000));
        assert_eq!(parse_count("1_000"), Some(1_000));
        assert_eq!(parse_count("x"), None);
        assert_eq!(short_count(1_000_000), "1M");
        assert_eq!(short_count(100_000), "100k");
        let words = ["--live", "1k,1m", "--quick", "--pairs=5"].map(String::from);
        let a = Args::from_words(words).unwrap();
        assert_eq!(a.list("live", &[]).unwrap(), vec![1_000, 1_000_000]);
        assert!(a.flag("quick"));
        assert_eq!(a.number("pairs", 0).unwrap(), 5);
    }

    #[test]
    fn random_indices_stay_in_range() {
        let mut r = XorShift::new(7);
        assert!((0..10_000).all(|_| r.below(13) < 13));
    }
}
