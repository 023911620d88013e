//! A moment given to `plot --from`/`--to`: seconds since the first event, or a time around the
//! peak, and where it falls on the trace clock.

/// A moment given to --from or --to.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum TimePoint {
    /// Seconds since the first event.
    Since(f64),
    /// Seconds after (negative: before) the peak.
    Peak(f64),
    /// Seconds either side of the peak: the start with --from, the end with --to.
    AroundPeak(f64),
}

impl TimePoint {
    /// Parses `12`, `12.5s`, `800ms`, `peak`, `peak-2s`, `peak+1.5s`, `peak±2s` (or `peak+-2s`).
    pub fn parse(text: &str) -> Result<TimePoint, String> {
        let text = text.trim();
        let bad = || {
            format!(
                "{text:?}: write seconds since the first event (12, 12.5s, 800ms) or a time \
                 around the peak (peak-2s, peak+1.5s, peak±2s)"
            )
        };
        let Some(rest) = text.strip_prefix("peak") else {
            return seconds(text).map(TimePoint::Since).ok_or_else(bad);
        };
        let rest = rest.trim_start();
        if rest.is_empty() {
            return Ok(TimePoint::Peak(0.0));
        }
        if let Some(d) = rest.strip_prefix('±').or_else(|| rest.strip_prefix("+-")) {
            return seconds(d.trim()).map(TimePoint::AroundPeak).ok_or_else(bad);
        }
        if let Some(d) = rest.strip_prefix('+') {
            return seconds(d.trim()).map(TimePoint::Peak).ok_or_else(bad);
        }
        if let Some(d) = rest.strip_prefix('-') {
            return seconds(d.trim())
                .map(|s| TimePoint::Peak(-s))
                .ok_or_else(bad);
        }
        Err(bad())
    }

    /// The moment in µs of the trace clock, for a timeline starting at `origin` whose peak was at
    /// `peak`; `end` picks the side of [`TimePoint::AroundPeak`].
    pub(super) fn at(self, origin: f64, peak: f64, end: bool) -> f64 {
        match self {
            TimePoint::Since(s) => origin + s * 1e6,
            TimePoint::Peak(s) => peak + s * 1e6,
            TimePoint::AroundPeak(s) if end => peak + s * 1e6,
            TimePoint::AroundPeak(s) => peak - s * 1e6,
        }
    }
}

/// A duration in seconds: a number of seconds, bare or with `s`, or of milliseconds with `ms`;
/// `None` unless finite and not negative.
fn seconds(text: &str) -> Option<f64> {
    let (number, scale) = if let Some(n) = text.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = text.strip_suffix('s') {
        (n, 1.0)
    } else {
        (text, 1.0)
    };
    let value: f64 = number.trim().parse().ok()?;
    (value.is_finite() && value >= 0.0).then_some(value * scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_seconds_or_around_the_peak() {
        use TimePoint::*;
        let ok = |t: &str| TimePoint::parse(t).unwrap();
        assert_eq!(ok("12"), Since(12.0));
        assert_eq!(ok("12.5s"), Since(12.5));
        assert_eq!(ok("800ms"), Since(0.8));
        assert_eq!(ok("peak"), Peak(0.0));
        assert_eq!(ok("peak-2s"), Peak(-2.0));
        assert_eq!(ok("peak+1.5s"), Peak(1.5));
        assert_eq!(ok("peak±2s"), AroundPeak(2.0));
        assert_eq!(ok("peak+-2"), AroundPeak(2.0));
        for bad in [
            "", "-1", "soon", "peak*2", "peak-", "inf", "2 GiB", "peak±x",
        ] {
            assert!(TimePoint::parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(AroundPeak(2.0).at(0.0, 5e6, false), 3e6);
        assert_eq!(AroundPeak(2.0).at(0.0, 5e6, true), 7e6);
        assert_eq!(Since(1.0).at(10.0, 5e6, true), 1_000_010.0);
    }
}
