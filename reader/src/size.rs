//! Byte sizes as people write them (`8GiB`, `8G`, `8000MB`, `1.5 GiB`, `4096B`) and as we print them,
//! and counts (the depth of `GPUMEMHOOK_STACKS`): the one parser of each, for the hook, the CLI and Python.
//!
//! Convention: a suffix with `i` (`KiB`, `MiB`, `GiB`, `TiB`) or a bare letter (`K`, `M`, `G`, `T`,
//! as docker and the JVM read them) is a power of 1024; a suffix ending in `B` without `i` (`KB`,
//! `MB`, `GB`, `TB`) is a power of 1000; `B` is bytes. Letters are case-insensitive. A size must
//! carry its unit: a bare number (`8`) is refused, because `--limit 8` meant 8 GiB to every user
//! who wrote it and 8 bytes to the parser. Zero alone is the one exception (`0` is nothing in any
//! unit), for amounts such as a leak budget.

use std::fmt;

/// Why a size could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SizeError {
    pub input: String,
    pub reason: &'static str,
}

impl fmt::Display for SizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let number = self.input.trim();
        match self.reason {
            // The one line that shows the fix, with the user's own number in it.
            NO_UNIT => write!(
                f,
                "{number} what? write {number}GiB, or {number}B for bytes"
            ),
            SPACED => write!(
                f,
                "write {} (no space)",
                number.split_whitespace().collect::<String>()
            ),
            reason => write!(
                f,
                "{:?} is not a size ({reason}); examples: 8GiB, 8G (= 8GiB), 8000MB, 8000MiB, \
                 8589934592B",
                self.input
            ),
        }
    }
}

impl SizeError {
    /// Whether the size was refused for being a bare number, with no unit (`8`).
    pub fn is_missing_unit(&self) -> bool {
        self.reason == NO_UNIT
    }
}

impl std::error::Error for SizeError {}

/// The largest size [`parse_size`] accepts: one byte below `u64::MAX`, which the segment keeps as
/// its "no ceiling" sentinel (`layout::NO_LIMIT`). A larger value could not be stored and then shown
/// as it was given, so it is refused.
pub const MAX_SIZE: u64 = u64::MAX - 1;

/// The reason [`parse_size`] and [`check_limit`] give for zero: one wording everywhere a ceiling is
/// read (hook configuration, CLI, Python).
const ZERO: &str = "a ceiling of zero bytes would refuse every allocation";
const TOO_LARGE: &str = "too large: sizes must be below 16 EiB (18446744073709551615 bytes)";

/// Checks a ceiling given in bytes (Python's `set_limit(int)`, for one): strictly positive and
/// below the segment's "no ceiling" sentinel, with the same messages as [`parse_size`] gives for
/// the same bytes written as a size (`0B`).
pub fn check_limit(bytes: u64) -> Result<u64, SizeError> {
    let err = |reason| SizeError {
        input: format!("{bytes}B"),
        reason,
    };
    match bytes {
        0 => Err(err(ZERO)),
        b if b > MAX_SIZE => Err(err(TOO_LARGE)),
        b => Ok(b),
    }
}

/// The reason for a bare number (`8`): its message is the fix, `8 what? write 8GiB, or 8B for bytes`.
const NO_UNIT: &str = "no unit";
/// The reason for a number and its unit given as two words on a command line (`--limit 8 GiB`).
const SPACED: &str = "a space between the number and its unit";

/// Parses a strictly positive, whole number of bytes with its unit, at most [`MAX_SIZE`]. The number may have a
/// decimal point (`1.5GiB`, `2.5KB`) when the bytes it makes are whole: `0.5` and `0.1GiB` are
/// refused, as is an exponent (`1e3`), which says nothing a unit does not say better. Space around
/// the size and between the number and the unit is ignored (`" 1.5 GiB "`); nothing else is.
pub fn parse_size(input: &str) -> Result<u64, SizeError> {
    let bytes = parse_amount(input)?;
    check_limit(bytes).map_err(|e| SizeError {
        input: input.to_string(),
        reason: e.reason,
    })
}

/// Parses a size as [`parse_size`] does, zero included (`0`, `0B`): an amount such as a budget of
/// memory a test may leave behind, where nothing is a meaningful value, unlike for a ceiling.
pub fn parse_amount(input: &str) -> Result<u64, SizeError> {
    let err = |reason| SizeError {
        input: input.to_string(),
        reason,
    };
    let text = input.trim();
    let digits = text
        .bytes()
        .take_while(|c| c.is_ascii_digit() || *c == b'.')
        .count();
    let (number, unit) = text.split_at(digits);
    if number.is_empty() {
        return Err(err(if text.starts_with('-') {
            "sizes are positive"
        } else {
            "no number"
        }));
    }
    let unit = unit.trim_start();
    if unit.is_empty() && number.bytes().any(|c| c.is_ascii_digit() && c != b'0') {
        return Err(err(NO_UNIT));
    }
    let multiplier: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        u if u.starts_with(['e', 'E'])
            && u[1..]
                .trim_start_matches(['+', '-'])
                .starts_with(|c: char| c.is_ascii_digit()) =>
        {
            return Err(err(EXPONENT))
        }
        _ => return Err(err("unknown unit")),
    };
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() || fraction.contains('.') {
        return Err(err("malformed number"));
    }
    // Exact arithmetic in u128: `whole` and `fraction` are decimal digits, so the bytes are
    // (whole * 10^k + fraction) * multiplier / 10^k with k the fraction's length.
    let fraction = fraction.trim_end_matches('0');
    let parse = |digits: &str| -> Result<u128, SizeError> {
        match digits {
            "" => Ok(0),
            d if d.len() > 30 => Err(err(TOO_LARGE)),
            d => d.parse().map_err(|_| err("malformed number")),
        }
    };
    let scale = 10u128
        .checked_pow(fraction.len() as u32)
        .filter(|_| fraction.len() <= 30)
        .ok_or_else(|| err(NOT_WHOLE))?;
    let scaled = parse(whole)?
        .checked_mul(scale)
        .and_then(|w| w.checked_add(parse(fraction).ok()?))
        .and_then(|n| n.checked_mul(u128::from(multiplier)))
        .ok_or_else(|| err(TOO_LARGE))?;
    if scaled % scale != 0 {
        return Err(err(NOT_WHOLE));
    }
    u64::try_from(scaled / scale)
        .ok()
        .filter(|&b| b <= MAX_SIZE)
        .ok_or_else(|| err(TOO_LARGE))
}

/// Whether `word` alone is a unit [`parse_size`] reads (`GiB`, `mb`, `B`, `G`): how a command line
/// tells `--limit 8 GiB`, a size split in two words, from a number followed by a program.
pub fn is_unit(word: &str) -> bool {
    word.starts_with(|c: char| c.is_ascii_alphabetic()) && parse_amount(&format!("1{word}")).is_ok()
}

/// The refusal of a size written as two words, `number` then `unit` (`8`, `GiB`): `write 8GiB (no
/// space)`. `None` when they are not a bare number and a unit, so that the caller's own error
/// stands.
pub fn spaced_size(number: &str, unit: &str) -> Option<SizeError> {
    let bare = parse_amount(number).is_err_and(|e| e.is_missing_unit()) || number.trim() == "0";
    (bare && is_unit(unit)).then(|| SizeError {
        input: format!("{} {}", number.trim(), unit.trim()),
        reason: SPACED,
    })
}

const NOT_WHOLE: &str = "not a whole number of bytes";
const EXPONENT: &str = "exponents are not read: write 1000B, 1KB or 1KiB";

/// Why a count could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CountError {
    pub input: String,
    pub min: u64,
    pub max: u64,
}

impl fmt::Display for CountError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} is not a whole number from {} to {}",
            self.input, self.min, self.max
        )
    }
}

impl std::error::Error for CountError {}

/// Parses a count (of events, of trials): decimal digits only, from `min` to `max`. Space around
/// it is ignored, as for sizes; a sign, a point, an exponent or a unit is refused.
pub fn parse_count(input: &str, min: u64, max: u64) -> Result<u64, CountError> {
    let text = input.trim();
    text.bytes()
        .all(|c| c.is_ascii_digit())
        .then(|| text.parse::<u64>().ok())
        .flatten()
        .filter(|n| (min..=max).contains(n))
        .ok_or_else(|| CountError {
            input: input.to_string(),
            min,
            max,
        })
}

/// How [`format_size`] writes bytes for people, as data: the one rule, which the page of `view`
/// carries in its data (`sizes`) for its script to apply (`cli/src/page/js/format.js`), so that
/// the page writes every size as the terminal does without a copy of the rule. A size under one
/// `step` is written whole (`512 B`); a larger one in the largest unit not above it, with
/// `fine_digits` decimals under `fine_below` of that unit and `coarse_digits` from it on. The
/// decimals are rounded to the nearest, an exact tie to the even digit (`1152 B` is `1.12 KiB`), as
/// Rust's `{:.N}` does.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct SizeRule {
    /// The units, smallest first: bytes, then each `step` times the one before.
    pub units: [&'static str; 6],
    pub step: u32,
    pub fine_below: f64,
    pub fine_digits: usize,
    pub coarse_digits: usize,
}

/// The rule of [`format_size`] and [`binary_unit`]: binary units up to PiB, `1.50 KiB` and
/// `200.0 GiB`.
pub const SIZE_RULE: SizeRule = SizeRule {
    units: ["B", "KiB", "MiB", "GiB", "TiB", "PiB"],
    step: 1024,
    fine_below: 100.0,
    fine_digits: 2,
    coarse_digits: 1,
};

/// Formats bytes for people: `0 B`, `512 B`, `1.50 KiB`, `64.00 MiB`, `200.0 GiB` ([`SIZE_RULE`]).
pub fn format_size(bytes: u64) -> String {
    let rule = &SIZE_RULE;
    let (per_unit, unit) = binary_unit(bytes as f64);
    if unit == rule.units[0] {
        return format!("{bytes} {unit}");
    }
    // Division by a power of two is exact: the same value as dividing by 1024 step by step.
    let value = bytes as f64 / per_unit;
    let digits = if value < rule.fine_below {
        rule.fine_digits
    } else {
        rule.coarse_digits
    };
    format!("{value:.digits$} {unit}")
}

/// The unit [`format_size`] writes `bytes` in, as `(bytes per unit, name)`: the largest of `B`,
/// `KiB`, `MiB`, `GiB`, `TiB`, `PiB` that is not above `bytes` (`B` below 1 KiB). The one table
/// of binary units ([`SIZE_RULE`]); the plot's axis takes its unit from it too.
pub fn binary_unit(bytes: f64) -> (f64, &'static str) {
    let units = &SIZE_RULE.units;
    let step = f64::from(SIZE_RULE.step);
    let mut per_unit = 1.0;
    let mut unit = 0;
    while unit + 1 < units.len() && bytes >= per_unit * step {
        per_unit *= step;
        unit += 1;
    }
    (per_unit, units[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_and_decimal_units() {
        assert_eq!(parse_size("8GiB"), Ok(8 << 30));
        assert_eq!(parse_size("8G"), Ok(8 << 30));
        assert_eq!(parse_size("8g"), Ok(8 << 30));
        assert_eq!(parse_size("8GB"), Ok(8_000_000_000));
        assert_eq!(parse_size("8000MB"), Ok(8_000_000_000));
        assert_eq!(parse_size("8000MiB"), Ok(8000 << 20));
        assert_eq!(parse_size(" 1.5 GiB "), Ok(3 << 29));
        assert_eq!(parse_size("4096B"), Ok(4096));
        assert_eq!(parse_size("1b"), Ok(1));
    }

    #[test]
    fn a_bare_number_is_refused_with_the_fix() {
        for (bare, line) in [
            ("8", "8 what? write 8GiB, or 8B for bytes"),
            (" 4096 ", "4096 what? write 4096GiB, or 4096B for bytes"),
            ("1.5", "1.5 what? write 1.5GiB, or 1.5B for bytes"),
            ("99999999999999999999", "99999999999999999999 what? write 99999999999999999999GiB, or 99999999999999999999B for bytes"),
        ] {
            let e = parse_size(bare).unwrap_err();
            assert!(e.is_missing_unit(), "{bare}");
            assert_eq!(e.to_string(), line);
            assert_eq!(parse_amount(bare).unwrap_err(), e);
        }
        // Zero is nothing in every unit: an amount, never a ceiling.
        assert_eq!(parse_amount("0"), Ok(0));
        assert_eq!(parse_size("0").unwrap_err().reason, ZERO);
    }

    #[test]
    fn a_size_split_in_two_words_is_refused_with_the_joined_spelling() {
        for unit in ["GiB", "gib", "G", "MB", "B", "KiB"] {
            assert!(is_unit(unit), "{unit}");
            let e = spaced_size("8", unit).unwrap();
            assert_eq!(e.to_string(), format!("write 8{unit} (no space)"));
        }
        for not_unit in ["", "true", "python3", "e3", "8GiB", "GiBs", "--"] {
            assert!(!is_unit(not_unit), "{not_unit}");
            assert_eq!(spaced_size("8", not_unit), None);
        }
        // A number that already has its unit, or no number: not a split size.
        assert_eq!(spaced_size("8GiB", "GiB"), None);
        assert_eq!(spaced_size("eight", "GiB"), None);
    }

    #[test]
    fn refusals_say_why() {
        for bad in [
            "",
            "0",
            "0GiB",
            "-1G",
            "eight",
            "8 parsecs",
            "1.2.3G",
            "99999999999999999999GiB",
        ] {
            let e = parse_size(bad).unwrap_err();
            assert!(e.to_string().contains("examples"), "{e}");
        }
        assert_eq!(parse_size("-1G").unwrap_err().reason, "sizes are positive");
        assert_eq!(parse_size("0").unwrap_err().reason, ZERO);
    }

    #[test]
    fn only_whole_numbers_of_bytes_are_sizes() {
        assert_eq!(parse_size("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_size("2.5KB"), Ok(2500));
        assert_eq!(parse_size("2.50000KB"), Ok(2500));
        assert_eq!(parse_size(".5K"), Ok(512));
        assert_eq!(parse_size("7.B"), Ok(7));
        assert_eq!(parse_size("\t8 GiB\n"), Ok(8 << 30));
        for fractional in ["0.5B", "1.5b", "0.1GiB", "1.0000000001KB", "0.0001B"] {
            assert_eq!(
                parse_size(fractional).unwrap_err().reason,
                NOT_WHOLE,
                "{fractional}"
            );
        }
        for exponent in ["1e3", "1.5e3MB", "2E+1GiB", "1e-3GiB", "1e3B"] {
            assert_eq!(
                parse_size(exponent).unwrap_err().reason,
                EXPONENT,
                "{exponent}"
            );
        }
        // An `e` without digits stays part of the unit: still a unit error.
        assert_eq!(parse_size("8eGiB").unwrap_err().reason, "unknown unit");
        assert_eq!(parse_size(".").unwrap_err().reason, "malformed number");
        assert_eq!(parse_size("1 000").unwrap_err().reason, "unknown unit");
    }

    #[test]
    fn amounts_take_zero_and_refuse_the_rest_as_sizes_do() {
        assert_eq!(parse_amount("0"), Ok(0));
        assert_eq!(parse_amount("0B"), Ok(0));
        assert_eq!(parse_amount("1.5GiB"), Ok(3 << 29));
        for bad in [
            "",
            "-1G",
            "8 parsecs",
            "99999999999999999999B",
            "16EiB",
            "0.5B",
            "1e3",
            "8",
        ] {
            assert_eq!(parse_amount(bad).unwrap_err(), parse_size(bad).unwrap_err());
        }
    }

    #[test]
    fn counts_are_digits_within_their_range() {
        assert_eq!(parse_count(" 1000 ", 1, 1 << 32), Ok(1000));
        assert_eq!(parse_count("1", 1, 1), Ok(1));
        for bad in [
            "0",
            "",
            "-1",
            "+5",
            "1e3",
            "1.0",
            "10k",
            "99999999999999",
            "abc",
        ] {
            let e = parse_count(bad, 1, 1 << 32).unwrap_err();
            assert!(e.to_string().contains("from 1 to 4294967296"), "{e}");
        }
    }

    #[test]
    fn sizes_that_do_not_fit_below_the_no_limit_sentinel_are_too_large() {
        for big in [
            "184467440737095516150000000000000000GiB",
            "18446744073709551615B",
            "18446744073709551616B",
            "99999999999999999999B",
            "16777216TiB",
            "17179869184GiB",
            "18446744073709551615.0B",
        ] {
            let e = parse_size(big).unwrap_err();
            assert_eq!(e.reason, TOO_LARGE, "{big}");
            assert!(e.to_string().contains("too large"), "{e}");
        }
        assert_eq!(parse_size("18446744073709551614B"), Ok(MAX_SIZE));
        assert_eq!(parse_size("16777215TiB"), Ok(16_777_215 << 40));
        assert_eq!(check_limit(u64::MAX).unwrap_err().reason, TOO_LARGE);
        assert_eq!(check_limit(0).unwrap_err().reason, ZERO);
        assert_eq!(check_limit(MAX_SIZE), Ok(MAX_SIZE));
        // The same words for a number of bytes and for a size string.
        assert_eq!(
            check_limit(0).unwrap_err().to_string(),
            parse_size("0B").unwrap_err().to_string()
        );
    }

    #[test]
    fn human_format() {
        assert_eq!(format_size(0), "0 B");
        assert_eq!(format_size(1536), "1.50 KiB");
        assert_eq!(format_size(64 << 20), "64.00 MiB");
        assert_eq!(format_size(200 << 30), "200.0 GiB");
        // Edges of each unit, and the largest sizes (PiB is the last unit).
        assert_eq!(format_size(1023), "1023 B");
        assert_eq!(format_size(1024), "1.00 KiB");
        assert_eq!(format_size((1 << 20) - 1), "1024.0 KiB");
        assert_eq!(format_size(1 << 50), "1.00 PiB");
        assert_eq!(format_size(u64::MAX), "16384.0 PiB");
        // An exact tie goes to the even digit (the page's script does the same).
        assert_eq!(format_size(1152), "1.12 KiB");
        assert_eq!(format_size(1408), "1.38 KiB");
        assert_eq!(format_size(401 << 18), "100.2 MiB");
    }

    #[test]
    fn binary_units_are_the_largest_not_above_the_value() {
        assert_eq!(binary_unit(0.0), (1.0, "B"));
        assert_eq!(binary_unit(1023.9), (1.0, "B"));
        assert_eq!(binary_unit(1024.0), (1024.0, "KiB"));
        assert_eq!(binary_unit(3e9), (1_073_741_824.0, "GiB"));
        assert_eq!(binary_unit(1.2e15).1, "PiB");
        assert_eq!(binary_unit(1e30).1, "PiB");
        assert_eq!(binary_unit(f64::NAN).1, "B");
    }
}
