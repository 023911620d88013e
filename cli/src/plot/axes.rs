//! The arithmetic of the plot's axes: round steps for the ticks and the byte and time units (pure
//! functions: the layout and the drawing use them; `draw::draw_axes` draws the grid with them).

use gpumemhook_reader::binary_unit;

/// A round step that splits `range` into about `target` parts: 1, 2, 2.5 or 5 times a power of ten.
pub(super) fn nice_step(range: f64, target: f64) -> f64 {
    let raw = (range / target).max(f64::MIN_POSITIVE);
    let magnitude = 10f64.powf(raw.log10().floor());
    let norm = raw / magnitude;
    let step = if norm <= 1.0 {
        1.0
    } else if norm <= 2.0 {
        2.0
    } else if norm <= 2.5 {
        2.5
    } else if norm <= 5.0 {
        5.0
    } else {
        10.0
    };
    step * magnitude
}

/// Decimals needed to print multiples of `step` exactly.
pub(super) fn decimals(step: f64) -> usize {
    (0..6)
        .find(|&d| {
            let scaled = step * 10f64.powi(d as i32);
            (scaled - scaled.round()).abs() < 1e-6 * scaled.max(1.0)
        })
        .unwrap_or(6)
}

/// The binary unit for a byte range: (divisor, name), from the table `format_size` prints with.
pub(super) fn byte_unit(max: f64) -> (f64, &'static str) {
    binary_unit(max)
}

/// The time unit for a span in µs: (µs per unit, name).
pub(super) fn time_unit(span_us: f64) -> (f64, &'static str) {
    if span_us < 2_000.0 {
        (1.0, "µs")
    } else if span_us < 2_000_000.0 {
        (1_000.0, "ms")
    } else if span_us < 300_000_000.0 {
        (1_000_000.0, "s")
    } else if span_us < 10_800_000_000.0 {
        (60_000_000.0, "min")
    } else {
        (3_600_000_000.0, "h")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_and_units() {
        assert_eq!(nice_step(10.0, 5.0), 2.0);
        assert_eq!(nice_step(12.0, 5.0), 2.5);
        assert_eq!(nice_step(0.7, 5.0), 0.2);
        assert_eq!(decimals(2.0), 0);
        assert_eq!(decimals(0.25), 2);
        assert_eq!(byte_unit(3e9).1, "GiB");
        assert_eq!(byte_unit(500.0).1, "B");
        assert_eq!(time_unit(5_000_000.0).1, "s");
    }
}
