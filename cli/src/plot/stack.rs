//! `plot --by-module`: under a device's curve, its memory stacked by the shared object that asked
//! for it, one band per module (the largest peaks get their own colour, the rest share one band),
//! with a legend of the bands in the top-left corner of the plot area.
//!
//! The bands are sampled once per pixel column, at the column's last event: the device's own curve,
//! drawn over them as before, still shows every spike inside a column.

use gpumemhook_reader::format_size;
use gpumemhook_timeline::Timeline;

use super::layout::Layout;
use crate::canvas::{Anchor, Canvas, Fonts, Rgba};

/// Modules with a band of their own; the others are summed into one.
pub(super) const BANDS: usize = 7;
const BAND_COLORS: [u32; BANDS + 1] = [
    0x4e79a7, 0xf28e2b, 0x59a14f, 0xb07aa1, 0x76b7b2, 0xedc948, 0x9c755f, 0xbab0ac,
];
const REST: &str = "other modules";

/// One band: a module (or the rest) and its bytes at each sampled column.
pub(super) struct Band {
    pub name: String,
    pub peak: u64,
    pub color: Rgba,
    /// Bytes held at the end of each column, columns in order.
    pub held: Vec<u64>,
}

/// The bands of `device`, sampled at the end of the pixel columns `xs` (increasing; a change at
/// `ts` is in column `column_x(ts)`), largest peak first.
pub(super) fn bands(
    t: &Timeline,
    device: u32,
    xs: &[f32],
    column_x: &dyn Fn(f64) -> f32,
) -> Vec<Band> {
    let Some(modules) = t.module_used.get(&device) else {
        return Vec::new();
    };
    let mut series: Vec<(&String, u64, Vec<u64>)> = modules
        .iter()
        .map(|(name, points)| {
            let peak = points.iter().map(|p| p.1).max().unwrap_or(0);
            (name, peak, sample(points, xs, column_x))
        })
        .collect();
    series.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
    let mut out: Vec<Band> = Vec::new();
    for (i, (name, peak, held)) in series.into_iter().enumerate() {
        if i < BANDS {
            out.push(Band {
                name: name.clone(),
                peak,
                color: Rgba::rgb(BAND_COLORS[i]),
                held,
            });
        } else if let Some(rest) = out.get_mut(BANDS).filter(|b| b.name == REST) {
            rest.peak = rest.peak.max(peak);
            rest.held.iter_mut().zip(held).for_each(|(a, b)| *a += b);
        } else {
            out.push(Band {
                name: REST.to_string(),
                peak,
                color: Rgba::rgb(BAND_COLORS[BANDS]),
                held,
            });
        }
    }
    out
}

/// The value of a step series at the end of each pixel column.
fn sample(points: &[(f64, u64)], xs: &[f32], column_x: &dyn Fn(f64) -> f32) -> Vec<u64> {
    let mut out = Vec::with_capacity(xs.len());
    let (mut i, mut value) = (0, 0);
    for &x in xs {
        while i < points.len() && column_x(points[i].0) <= x {
            value = points[i].1;
            i += 1;
        }
        out.push(value);
    }
    out
}

/// The device whose modules are stacked: the one asked for, else the one with the highest peak.
pub(super) fn device_to_stack(t: &Timeline, asked: Option<u32>) -> Option<u32> {
    if let Some(d) = asked {
        return Some(d);
    }
    t.used
        .iter()
        .max_by_key(|(_, points)| points.iter().map(|p| p.1).max().unwrap_or(0))
        .map(|(&d, _)| d)
}

/// Draws the bands of `device` stacked from the bottom of the plot, and their legend.
pub(super) fn draw_stack(c: &mut dyn Canvas, fonts: &Fonts, l: &Layout, t: &Timeline, device: u32) {
    let first = l.left.floor() as i64;
    let last = l.right.ceil() as i64;
    let xs: Vec<f32> = (first..=last).map(|x| x as f32).collect();
    let bands = bands(t, device, &xs, &|ts| l.column_x(ts));
    let mut below = vec![0u64; xs.len()];
    for band in &bands {
        let above: Vec<u64> = below.iter().zip(&band.held).map(|(a, b)| a + b).collect();
        let mut outline: Vec<(f32, f32)> =
            xs.iter().zip(&above).map(|(&x, &v)| (x, l.y(v))).collect();
        outline.extend(xs.iter().zip(&below).rev().map(|(&x, &v)| (x, l.y(v))));
        c.polygon(&outline, band.color.alpha(150));
        below = above;
    }
    let size = l.label_size;
    let mut y = l.top + size + 4.0;
    for band in &bands {
        c.rect(
            l.left + 8.0,
            y - size * 0.8,
            size * 0.8,
            size * 0.8,
            band.color,
        );
        let label = format!("{}  peak {}", band.name, format_size(band.peak));
        c.text(
            l.left + 8.0 + size * 1.2,
            y,
            &fonts.fit(&label, size, false, l.plot_w / 2.0),
            size,
            Rgba::rgb(0x222222),
            Anchor::Start,
            false,
        );
        y += size * 1.4;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bands_sample_steps_and_sum_the_modules_past_the_largest() {
        let mut t = Timeline::default();
        let modules = t.module_used.entry(0).or_default();
        for i in 0..(BANDS + 2) {
            let name = format!("lib{i}.so");
            let bytes = 100 * (i as u64 + 1);
            modules.insert(name, vec![(10.0, bytes), (20.0, 0)]);
        }
        let column_x = |ts: f64| (ts / 10.0).round() as f32;
        let b = bands(&t, 0, &[0.0, 1.0, 2.0], &column_x);
        assert_eq!(b.len(), BANDS + 1);
        assert_eq!(b[0].name, format!("lib{}.so", BANDS + 1));
        assert_eq!(b[0].held, vec![0, 100 * (BANDS as u64 + 2), 0]);
        let rest = &b[BANDS];
        assert_eq!(rest.name, REST);
        assert_eq!(rest.held, vec![0, 100 + 200, 0]);
        assert!(bands(&t, 1, &[0.0], &column_x).is_empty());
    }
}
