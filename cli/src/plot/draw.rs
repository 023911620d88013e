//! Drawing the plot on a [`Canvas`]: the axes (grid, tick labels, frame), the title and its facts,
//! the legend, the scope bars and their labels, the ceilings, the curves with their peaks, peak
//! restarts, and refused or failed allocations, each cut to the window drawn.

use gpumemhook_reader::format_size;
use gpumemhook_reader::EventKind;
use gpumemhook_timeline::{MarkKind, Timeline};

use super::axes::{decimals, nice_step};
use super::layout::{place_labels, Bar, CeilingLine, Layout, Window};
use super::palette::{device_color, FAILED_COLOR, GRID, INK, LIMIT_COLOR, MUTED, SCOPE_COLORS};
use crate::canvas::{Anchor, Canvas, Fonts, Rgba};
use gpumemhook_timeline::DeviceReplay;

/// A scope's span: name, start and end (µs), and whether it was still open at exit.
pub(super) type Span = (String, f64, f64, bool);

/// The points of a curve from `t0` to `t1`: `used` at `t0` (when anything was held before), then
/// the changes up to `t1`.
pub(super) fn clip(points: &[(f64, u64)], t0: f64, t1: f64) -> Vec<(f64, u64)> {
    let start = points.partition_point(|p| p.0 < t0);
    let before = start.checked_sub(1).map(|i| (t0, points[i].1));
    before
        .into_iter()
        .chain(points[start..].iter().copied().take_while(|p| p.0 <= t1))
        .collect()
}

/// The curve of one device reduced to pixel columns (see the module header of `plot`).
pub(super) fn curve(
    points: &[(f64, u64)],
    column_x: impl Fn(f64) -> f32,
    end_x: f32,
    y: impl Fn(u64) -> f32,
) -> Vec<(f32, f32)> {
    let mut out: Vec<(f32, f32)> = Vec::new();
    let Some(&(first_ts, _)) = points.first() else {
        return out;
    };
    // Nothing was held before the first event of a device.
    let mut column = column_x(first_ts);
    let mut entry = 0u64;
    let (mut low, mut high, mut last) = (0u64, 0u64, 0u64);
    let flush = |out: &mut Vec<(f32, f32)>, col: f32, entry: u64, low, high, last| {
        out.push((col, y(entry)));
        out.push((col, y(high)));
        out.push((col, y(low)));
        out.push((col, y(last)));
    };
    for &(ts, used) in points {
        let c = column_x(ts);
        if c != column {
            flush(&mut out, column, entry, low, high, last);
            column = c;
            entry = last;
            low = last;
            high = last;
        }
        low = low.min(used);
        high = high.max(used);
        last = used;
    }
    flush(&mut out, column, entry, low, high, last);
    out.push((end_x.max(column), y(last)));
    // Collinear repeats add nothing to draw.
    out.dedup();
    out
}

/// The title, and under it the facts of the run: the highest peak (since its restart, as the exit
/// report counts it), the events, refusals, failures, dropped events, and the window drawn when it
/// is not the whole timeline.
pub(super) fn draw_title(
    c: &mut dyn Canvas,
    fonts: &Fonts,
    l: &Layout,
    t: &Timeline,
    devices: &[DeviceReplay],
    title: &str,
    window: &Window,
) {
    let (t0, t1) = (l.t0, l.t1);
    c.text(
        l.left,
        30.0,
        &fonts.fit(title, 18.0, true, l.w - l.left - 20.0),
        18.0,
        INK,
        Anchor::Start,
        true,
    );
    let mut facts = Vec::new();
    if let Some(d) = devices.iter().max_by_key(|d| d.peak) {
        let (tu, tn) = l.time_unit();
        let places = decimals(nice_step((t1 - t0) / tu, 50.0));
        let mut fact = format!(
            "peak {} on device {} at {:.*} {tn}",
            format_size(d.peak),
            d.device,
            places,
            (d.peak_ts - l.origin) / tu
        );
        if let Some(at) = d.restarted {
            fact.push_str(&format!(
                " (since reset_peak at {:.*} {tn})",
                places,
                (at - l.origin) / tu
            ));
        }
        facts.push(fact);
    }
    facts.push(format!(
        "{} events",
        t.events.max(t.used.values().map(|v| v.len() as u64).sum())
    ));
    let (denied, failed) = mark_counts(t);
    if denied > 0 {
        facts.push(format!(
            "{denied} allocation{} refused by the ceiling",
            if denied == 1 { "" } else { "s" }
        ));
    }
    if failed > 0 {
        facts.push(format!(
            "{failed} allocation{} failed in the driver",
            if failed == 1 { "" } else { "s" }
        ));
    }
    if t.marks_left_out > 0 {
        facts.push(format!(
            "the first and last {} of them drawn",
            gpumemhook_timeline::MARKS_KEPT
        ));
    }
    if t.dropped > 0 {
        facts.push(format!(
            "{} events dropped: the curve is incomplete",
            t.dropped
        ));
    }
    facts.extend(window.note.clone());
    c.text(
        l.left,
        52.0,
        &fonts.fit(&facts.join("  ·  "), 13.0, false, l.w - l.left - 20.0),
        13.0,
        if t.dropped > 0 { LIMIT_COLOR } else { MUTED },
        Anchor::Start,
        false,
    );
}

/// The numbers of refused and of failed allocations (all of them: a long recording's `marks` holds
/// only the first and last [`gpumemhook_timeline::MARKS_KEPT`]).
fn mark_counts(t: &Timeline) -> (u64, u64) {
    let count = |kind: EventKind| t.counts.get(kind.category()).copied().unwrap_or(0);
    (count(EventKind::Denied), count(EventKind::Failed))
}

/// One legend entry per device, then the ceiling (naming the one in force at the end, however short
/// its last step), refusals, failures and scopes when there are any; the scope swatch shows the
/// colours the scope bars and bands use.
pub(super) fn draw_legend(
    c: &mut dyn Canvas,
    fonts: &Fonts,
    l: &Layout,
    t: &Timeline,
    devices: &[DeviceReplay],
    ceilings: &[CeilingLine],
    scope_count: usize,
) {
    let legend_y = l.legend_y;
    let (denied, failed) = mark_counts(t);
    let mut lx = l.left;
    for d in devices {
        let color = device_color(d.device);
        c.line(
            &[(lx, legend_y - 4.0), (lx + 22.0, legend_y - 4.0)],
            color,
            2.5,
            None,
        );
        let since = if d.restarted.is_some() {
            " since reset_peak"
        } else {
            ""
        };
        let text = format!("device {} (peak {}{since})", d.device, format_size(d.peak));
        lx = legend_text(c, fonts, l, lx, &text);
    }
    if !ceilings.is_empty() {
        c.line(
            &[(lx, legend_y - 4.0), (lx + 22.0, legend_y - 4.0)],
            LIMIT_COLOR,
            1.5,
            Some(5.0),
        );
        let text = match ceilings {
            [(_, steps)] => match steps.last() {
                Some((_, Some(limit))) => format!("ceiling, {} at the end", format_size(*limit)),
                _ => "ceiling, none at the end".to_string(),
            },
            _ => "ceiling".to_string(),
        };
        lx = legend_text(c, fonts, l, lx, &text);
    }
    for (count, color, name) in [
        (denied, LIMIT_COLOR, "refused"),
        (failed, FAILED_COLOR, "failed"),
    ] {
        if count > 0 {
            cross(c, lx + 11.0, legend_y - 4.0, color);
            lx = legend_text(c, fonts, l, lx, name);
        }
    }
    if scope_count > 0 {
        // One stripe per colour the bars take in turn.
        let colours = scope_count.min(SCOPE_COLORS.len());
        let stripe = 22.0 / colours as f32;
        for k in 0..colours {
            c.rect(
                lx + k as f32 * stripe,
                legend_y - 10.0,
                stripe,
                10.0,
                scope_color(k).alpha(SCOPE_BAR_ALPHA),
            );
        }
        legend_text(c, fonts, l, lx, "scope");
    }
}

/// Writes a legend entry's `text` after its swatch at `lx`; returns where the next entry starts.
fn legend_text(c: &mut dyn Canvas, fonts: &Fonts, l: &Layout, lx: f32, text: &str) -> f32 {
    c.text(
        lx + 28.0,
        l.legend_y,
        text,
        l.label_size,
        INK,
        Anchor::Start,
        false,
    );
    lx + 28.0 + fonts.width(text, l.label_size, false) + 22.0
}

/// Opacity of a scope's bar in its lane and in the legend, and of its band over the plot.
const SCOPE_BAR_ALPHA: u8 = 110;
const SCOPE_BAND_ALPHA: u8 = 22;

/// The colour of the `i`-th scope (the colours are taken in turn).
fn scope_color(i: usize) -> Rgba {
    Rgba::rgb(SCOPE_COLORS[i % SCOPE_COLORS.len()])
}

/// Scope spans: a bar in its lane, and a light band over the plot; then the names, placed so that
/// none overlaps another or lies over another scope's bar. A name its lane had no room for whole
/// goes at the foot of its band when it fits there.
pub(super) fn draw_scopes(
    c: &mut dyn Canvas,
    fonts: &Fonts,
    l: &Layout,
    spans: &[Span],
    lane_of: &[usize],
) {
    let bars: Vec<Bar> = spans
        .iter()
        .zip(lane_of)
        .map(|((_, start, end, _), &lane)| Bar {
            x0: l.x(*start),
            x1: l.x(*end).max(l.x(*start) + 2.0),
            lane,
        })
        .collect();
    draw_scope_bars(c, l, &bars);
    let labels: Vec<String> = spans
        .iter()
        .map(|(name, _, _, open)| {
            if *open {
                format!("{name} (open at exit)")
            } else {
                name.clone()
            }
        })
        .collect();
    let placed = place_labels(
        &bars,
        &labels,
        l.right,
        |text| fonts.width(text, 11.0, false),
        |text, max| fonts.fit(text, 11.0, false, max),
    );
    for ((bar, label), name) in bars.iter().zip(placed).zip(&labels) {
        let whole = match label {
            Some((lx, text)) => {
                let ly = l.lane_y(bar.lane);
                c.text(
                    lx,
                    ly + l.lane_h - 8.0,
                    &text,
                    11.0,
                    INK,
                    Anchor::Start,
                    false,
                );
                text == *name
            }
            None => false,
        };
        // Bands do not overlap within a lane; the first lane's are the ones at the foot.
        if !whole && bar.lane == 0 && fonts.width(name, 11.0, false) + 8.0 <= bar.x1 - bar.x0 {
            c.text(
                bar.x0 + 4.0,
                l.bottom - 6.0,
                name,
                11.0,
                MUTED,
                Anchor::Start,
                false,
            );
        }
    }
}

/// Each scope's bar in its lane and its light band over the plot, in the scopes' colours in turn.
fn draw_scope_bars(c: &mut dyn Canvas, l: &Layout, bars: &[Bar]) {
    for (i, bar) in bars.iter().enumerate() {
        let color = scope_color(i);
        let ly = l.lane_y(bar.lane);
        c.rect(
            bar.x0,
            l.top,
            bar.x1 - bar.x0,
            l.plot_h,
            color.alpha(SCOPE_BAND_ALPHA),
        );
        c.rect(
            bar.x0,
            ly,
            bar.x1 - bar.x0,
            l.lane_h - 4.0,
            color.alpha(SCOPE_BAR_ALPHA),
        );
    }
}

/// Ceilings: a dashed step line per group of devices that shared them, from each change to the
/// next (no line while there was none). A ceiling far above the curve runs along the top edge,
/// named "above the plot", so that the curve keeps its scale.
pub(super) fn draw_ceilings(
    c: &mut dyn Canvas,
    fonts: &Fonts,
    l: &Layout,
    ceilings: &[CeilingLine],
    device_count: usize,
) {
    let (top, left, right, label_size) = (l.top, l.left, l.right, l.label_size);
    let single = device_count <= 1 || ceilings.len() == 1;
    let mut ceiling_labels: Vec<(f32, f32)> = Vec::new();
    for (ds, steps) in ceilings {
        let which = if single {
            String::new()
        } else {
            format!(
                " (device{} {})",
                if ds.len() > 1 { "s" } else { "" },
                ds.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
            )
        };
        let mut path: Vec<(f32, f32)> = Vec::new();
        let segments = steps.iter().enumerate().map(|(k, &(ts, limit))| {
            let end = steps.get(k + 1).map_or(l.t1, |next| next.0);
            (l.x(ts).max(left), l.x(end).min(right), limit)
        });
        for (x0, x1, limit) in segments {
            if x1 <= x0 {
                // Outside the window.
                continue;
            }
            let Some(lim) = limit else {
                // No ceiling from here: end the line drawn so far.
                if path.len() > 1 {
                    c.line(&path, LIMIT_COLOR, 1.5, Some(6.0));
                }
                path.clear();
                continue;
            };
            let (yy, text) = if l.limit_in_range(lim) {
                (l.y(lim), format!("ceiling {}{which}", format_size(lim)))
            } else {
                (
                    top,
                    format!("ceiling {}{which} (above the plot)", format_size(lim)),
                )
            };
            path.push((x0, yy));
            path.push((x1, yy));
            // Each step is named at its left end when its text fits above it, clear of others.
            let tw = fonts.width(&text, label_size, false);
            let tx = x0 + 4.0;
            let ty = if yy - 5.0 < top + 12.0 {
                yy + 14.0
            } else {
                yy - 5.0
            };
            let clear = ceiling_labels
                .iter()
                .all(|&(ax, ay)| (ay - ty).abs() >= 14.0 || tx + tw < ax || tx > ax + tw);
            if tw + 8.0 <= x1 - x0 && clear {
                c.text(tx, ty, &text, label_size, LIMIT_COLOR, Anchor::Start, false);
                ceiling_labels.push((tx, ty));
            }
        }
        if path.len() > 1 {
            c.line(&path, LIMIT_COLOR, 1.5, Some(6.0));
        }
    }
}

/// The curves, filled lightly beneath, then each peak marked.
pub(super) fn draw_curves(
    c: &mut dyn Canvas,
    fonts: &Fonts,
    l: &Layout,
    t: &Timeline,
    devices: &[DeviceReplay],
) {
    let (x, y) = (|ts| l.x(ts), |bytes| l.y(bytes));
    for d in devices {
        let color = device_color(d.device);
        let points = curve(
            &clip(&t.used[&d.device], l.t0, l.t1),
            |ts| l.column_x(ts),
            l.x(l.t1),
            y,
        );
        if let (Some(first), Some(last)) = (points.first(), points.last()) {
            let mut area = points.clone();
            area.push((last.0, l.bottom));
            area.push((first.0, l.bottom));
            c.polygon(&area, color.alpha(34));
        }
        c.line(&points, color, 2.0, None);
    }
    for d in devices
        .iter()
        .filter(|d| (l.t0..=l.t1).contains(&d.peak_ts))
    {
        let color = device_color(d.device);
        let (px, py) = (x(d.peak_ts), y(d.peak));
        c.polygon(
            &[
                (px, py - 5.0),
                (px + 5.0, py),
                (px, py + 5.0),
                (px - 5.0, py),
            ],
            color,
        );
        let label = format!("peak {}", format_size(d.peak));
        let lw = fonts.width(&label, l.label_size, true);
        let (lx, anchor) = if px + 8.0 + lw <= l.right {
            (px + 8.0, Anchor::Start)
        } else {
            (px - 8.0, Anchor::End)
        };
        c.text(
            lx,
            (py - 6.0).max(l.top + 12.0),
            &label,
            l.label_size,
            color,
            anchor,
            true,
        );
    }
}

/// Each device's last peak restart in the window: a dashed line in the device's colour, named.
pub(super) fn draw_restarts(
    c: &mut dyn Canvas,
    fonts: &Fonts,
    l: &Layout,
    devices: &[DeviceReplay],
) {
    for d in devices {
        let Some(at) = d.restarted.filter(|at| (l.t0..=l.t1).contains(at)) else {
            continue;
        };
        let color = device_color(d.device);
        let xx = l.x(at);
        c.line(&[(xx, l.top), (xx, l.bottom)], color, 1.2, Some(3.0));
        let label = "peak reset";
        let (lx, anchor) = if xx + 4.0 + fonts.width(label, 11.0, false) <= l.right {
            (xx + 4.0, Anchor::Start)
        } else {
            (xx - 4.0, Anchor::End)
        };
        c.text(lx, l.top + 12.0, label, 11.0, color, anchor, false);
    }
}

/// Refused and failed allocations, each a cross on the curve where it happened.
pub(super) fn draw_marks(c: &mut dyn Canvas, l: &Layout, t: &Timeline) {
    for m in t.marks.iter().filter(|m| (l.t0..=l.t1).contains(&m.ts)) {
        let color = match m.kind {
            MarkKind::Denied => LIMIT_COLOR,
            MarkKind::Failed => FAILED_COLOR,
        };
        cross(c, l.x(m.ts), l.y(m.used), color);
    }
}

/// An "×" of 9 pixels centred on (`cx`, `cy`).
fn cross(c: &mut dyn Canvas, cx: f32, cy: f32, color: Rgba) {
    let r = 4.5;
    c.line(&[(cx - r, cy - r), (cx + r, cy + r)], color, 2.0, None);
    c.line(&[(cx - r, cy + r), (cx + r, cy - r)], color, 2.0, None);
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
    // Ticks at round times since the first event, whatever the window's start.
    let (tu, tn) = l.time_unit();
    let span_units = (l.t1 - l.t0) / tu;
    let x_step = nice_step(span_units, (l.plot_w / 110.0).max(2.0) as f64);
    let x_decimals = decimals(x_step);
    let (first, last) = ((l.t0 - l.origin) / tu, (l.t1 - l.origin) / tu);
    let mut k = (first / x_step - 1e-9).ceil() * x_step;
    while k <= last + 1e-9 {
        let xx = l.x(l.origin + k * tu);
        if xx > l.left + 0.5 {
            c.line(&[(xx, l.top), (xx, l.bottom)], GRID, 1.0, None);
        }
        c.line(&[(xx, l.bottom), (xx, l.bottom + 5.0)], INK, 1.0, None);
        c.text(
            xx,
            l.bottom + 19.0,
            // `+ 0.0` turns a -0.0 from the rounding of the first tick into 0.
            &format!("{:.x_decimals$}", k + 0.0),
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
    fn curves_keep_spikes_inside_one_pixel() {
        // A spike to 1000 and back within one column must still reach the top.
        let points = [(0.0, 10), (0.1, 1000), (0.2, 10), (10.0, 20)];
        let c = curve(&points, |t| t.round() as f32, 10.0, |b| -(b as f32));
        assert!(c.iter().any(|p| p.1 == -1000.0), "{c:?}");
        assert_eq!(c.last(), Some(&(10.0, -20.0)));
    }

    #[test]
    fn curves_are_cut_to_the_window() {
        let points = [(1.0, 10), (2.0, 30), (3.0, 20), (4.0, 50)];
        assert_eq!(clip(&points, 2.5, 3.5), vec![(2.5, 30), (3.0, 20)]);
        assert_eq!(clip(&points, 0.0, 2.0), vec![(1.0, 10), (2.0, 30)]);
        assert_eq!(clip(&points, 5.0, 6.0), vec![(5.0, 50)]);
    }
}
