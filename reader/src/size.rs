//! Byte sizes as people write them (`8GiB`, `8G`, `8000MB`, `1.5 GiB`, `123456`) and as we print them.
//!
//! Convention: a suffix with `i` (`KiB`, `MiB`, `GiB`, `TiB`) or a bare letter (`K`, `M`, `G`, `T`,
//! as docker and the JVM read them) is a power of 1024; a suffix ending in `B` without `i` (`KB`,
//! `MB`, `GB`, `TB`) is a power of 1000. Letters are case-insensitive; a plain number is bytes.

use std::fmt;

/// Why a size could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SizeError {
    pub input: String,
    pub reason: &'static str,
}

impl fmt::Display for SizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} is not a size ({}); examples: 8GiB, 8G (= 8GiB), 8000MB, 8000MiB, 8589934592",
            self.input, self.reason
        )
    }
}

impl std::error::Error for SizeError {}

/// Parses a strictly positive size in bytes.
pub fn parse_size(input: &str) -> Result<u64, SizeError> {
    let err = |reason| SizeError {
        input: input.to_string(),
        reason,
    };
    let text = input.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    if number.is_empty() {
        return Err(err(if text.starts_with('-') {
            "sizes are positive"
        } else {
            "no number"
        }));
    }
    let multiplier: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => return Err(err("unknown unit")),
    };
    let bytes = if number.contains('.') {
        let value: f64 = number.parse().map_err(|_| err("malformed number"))?;
        let bytes = (value * multiplier as f64).round();
        if !bytes.is_finite() || bytes >= u64::MAX as f64 {
            return Err(err("too large"));
        }
        bytes as u64
    } else {
        let value: u64 = number.parse().map_err(|_| err("too large"))?;
        value
            .checked_mul(multiplier)
            .ok_or_else(|| err("too large"))?
    };
    if bytes == 0 {
        return Err(err("a ceiling of zero bytes"));
    }
    Ok(bytes)
}

/// Formats bytes for people: `0 B`, `512 B`, `1.50 KiB`, `64.0 MiB`, `8.00 GiB`.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    let digits = if value >= 100.0 { 1 } else { 2 };
    format!("{value:.digits$} {}", UNITS[unit])
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
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("1b"), Ok(1));
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
            "99999999999999999999",
        ] {
            let e = parse_size(bad).unwrap_err();
            assert!(e.to_string().contains("examples"), "{e}");
        }
        assert_eq!(parse_size("-1G").unwrap_err().reason, "sizes are positive");
    }

    #[test]
    fn human_format() {
        assert_eq!(format_size(0), "0 B");
        assert_eq!(format_size(1536), "1.50 KiB");
        assert_eq!(format_size(64 << 20), "64.00 MiB");
        assert_eq!(format_size(200 << 30), "200.0 GiB");
    }
}
