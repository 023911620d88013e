//! The axes of the plot: round steps for the ticks, the byte and time units, and drawing the grid,
//! the tick labels and the frame.

use gpumemhook_reader::binary_unit;

use super::layout::Layout;
use super::{GRID, INK, MUTED};
use crate::canvas::{Anchor, Canvas};

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

/// The grid, the labels of both axes, their units and the frame of the plot area.
pub(super) fn draw_axes(c: &mut dyn Canvas, l: &Layout) {
    let label_size = l.label_size;
    for (i, label) in l.y_labels.iter().enumerate() {
        let yy = l.bottom - (i as f64 * l.y_step / l.y_max) as f32 * l.plot_h;
        if i > 0 {
            c.line(&[(l.left, yy), (l.right, yy)], GRID, 1.0, None);
        }
        c.text(
            l.left - 8.0,
            yy + 4.0,
            label,
            label_size,
            INK,
            Anchor::End,
            false,
        );
    }
    c.text(
        l.left - 8.0,
        l.top - 8.0,
        l.unit_name,
        label_size,
        INK,
        Anchor::End,
        true,
    );
    let (tu, tn) = time_unit(l.t1 - l.t0);
    let span_units = (l.t1 - l.t0) / tu;
    let x_step = nice_step(span_units, (l.plot_w / 110.0).max(2.0) as f64);
    let x_decimals = decimals(x_step);
    let mut k = 0.0;
    while k <= span_units + 1e-9 {
        let xx = l.left + (k / span_units) as f32 * l.plot_w;
        if k > 0.0 {
            c.line(&[(xx, l.top), (xx, l.bottom)], GRID, 1.0, None);
        }
        c.line(&[(xx, l.bottom), (xx, l.bottom + 5.0)], INK, 1.0, None);
        c.text(
            xx,
            l.bottom + 19.0,
            &format!("{k:.x_decimals$}"),
            label_size,
            INK,
            Anchor::Middle,
            false,
        );
        k += x_step;
    }
    c.text(
        l.left + l.plot_w / 2.0,
        l.h - 10.0,
        &format!("time since the first event ({tn})"),
        label_size,
        MUTED,
        Anchor::Middle,
        false,
    );
    c.line(
        &[(l.left, l.top), (l.left, l.bottom), (l.right, l.bottom)],
        INK,
        1.0,
        None,
    );
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
