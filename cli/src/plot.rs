//! `gpumemhook plot TRACE -o FILE.png|FILE.svg`: memory used over time, one line per device, with
//! each device's peak marked, the ceiling as a dashed step line (it may change during the run),
//! refused and failed allocations marked on the curve, and scopes as labelled spans. Scope labels
//! never overlap: a name goes inside its bar, else into the free room after it, elided with "…"
//! when the room is short, else it is left out (the bar and its band still show the span).
//!
//! A trace may hold millions of events; the curve is reduced to at most four points per pixel
//! column (the value entering the column, its highest, its lowest and the last), so every spike
//! stays visible at any zoom while the files stay small.

use anyhow::{bail, Context, Result};
use gpumemhook_reader::format_size;
use gpumemhook_reader::trace::{read_chrome_trace, MarkKind, Timeline};
use std::path::{Path, PathBuf};

use crate::canvas::{Anchor, Canvas, Fonts, Raster, Rgba, Svg};
use crate::summary::{replay, time_span};

#[derive(clap::Args, Debug)]
#[command(after_help = "\
Examples:
  gpumemhook run --trace mem.trace.json -- python train.py
  gpumemhook plot mem.trace.json -o mem.png
  gpumemhook plot mem.trace.json -o mem.svg --width 1600 --height 700

The same trace opens in https://ui.perfetto.dev (or chrome://tracing) for event-level detail.")]
pub struct PlotArgs {
    /// A timeline written by GPUMEMHOOK_TRACE / `gpumemhook run --trace`.
    pub trace: PathBuf,
    /// The image to write: .png or .svg.
    #[arg(short, long, value_name = "FILE")]
    pub output: PathBuf,
    /// Width in pixels.
    #[arg(long, default_value_t = 1200, value_parser = clap::value_parser!(u32).range(320..=8000))]
    pub width: u32,
    /// Height in pixels.
    #[arg(long, default_value_t = 600, value_parser = clap::value_parser!(u32).range(240..=8000))]
    pub height: u32,
    /// Title (default: the command and pid of the traced process).
    #[arg(long)]
    pub title: Option<String>,
}

/// Line colours of devices 0, 1, ... (the usual ten-colour palette, minus red, kept for ceilings).
const DEVICE_COLORS: [u32; 8] = [
    0x1f77b4, 0xff7f0e, 0x2ca02c, 0x9467bd, 0x8c564b, 0xe377c2, 0x17becf, 0xbcbd22,
];
const LIMIT_COLOR: Rgba = Rgba::rgb(0xd62728);
/// Allocations the driver failed (refusals by the ceiling take the ceiling's colour).
const FAILED_COLOR: Rgba = Rgba::rgb(0x7b2d8e);
const SCOPE_COLORS: [u32; 5] = [0xe6a000, 0x3a9a9a, 0x9a6ac8, 0x6a9a3a, 0xc86a8a];
const INK: Rgba = Rgba::rgb(0x222222);
const MUTED: Rgba = Rgba::rgb(0x666666);
const GRID: Rgba = Rgba::rgb(0xe4e4e4);

fn device_color(device: u32) -> Rgba {
    Rgba::rgb(DEVICE_COLORS[device as usize % DEVICE_COLORS.len()])
}

/// A round step that splits `range` into about `target` parts: 1, 2, 2.5 or 5 times a power of ten.
fn nice_step(range: f64, target: f64) -> f64 {
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
fn decimals(step: f64) -> usize {
    (0..6)
        .find(|&d| {
            let scaled = step * 10f64.powi(d as i32);
            (scaled - scaled.round()).abs() < 1e-6 * scaled.max(1.0)
        })
        .unwrap_or(6)
}

/// The binary unit for a byte range: (divisor, name).
fn byte_unit(max: f64) -> (f64, &'static str) {
    const UNITS: [(f64, &str); 5] = [
        (1_099_511_627_776.0, "TiB"),
        (1_073_741_824.0, "GiB"),
        (1_048_576.0, "MiB"),
        (1024.0, "KiB"),
        (1.0, "B"),
    ];
    UNITS
        .into_iter()
        .find(|&(d, _)| max >= d)
        .unwrap_or((1.0, "B"))
}

/// The time unit for a span in µs: (µs per unit, name).
fn time_unit(span_us: f64) -> (f64, &'static str) {
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

/// The curve of one device reduced to pixel columns (see the module header).
fn curve(
    points: &[(f64, u64)],
    t_end: f64,
    x: impl Fn(f64) -> f32,
    y: impl Fn(u64) -> f32,
) -> Vec<(f32, f32)> {
    let mut out: Vec<(f32, f32)> = Vec::new();
    let Some(&(first_ts, _)) = points.first() else {
        return out;
    };
    // Nothing was held before the first event of a device.
    let mut column = x(first_ts).round();
    let mut entry = 0u64;
    let (mut low, mut high, mut last) = (0u64, 0u64, 0u64);
    let flush = |out: &mut Vec<(f32, f32)>, col: f32, entry: u64, low, high, last| {
        out.push((col, y(entry)));
        out.push((col, y(high)));
        out.push((col, y(low)));
        out.push((col, y(last)));
    };
    for &(ts, used) in points {
        let c = x(ts).round();
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
    out.push((x(t_end).max(column), y(last)));
    // Collinear repeats add nothing to draw.
    out.dedup();
    out
}

/// Scope spans packed into lanes so that overlapping scopes do not hide each other.
fn lanes(spans: &[(String, f64, f64, bool)], max_lanes: usize) -> Vec<usize> {
    let mut lane_end: Vec<f64> = Vec::new();
    spans
        .iter()
        .map(|&(_, start, end, _)| {
            match lane_end.iter().position(|&e| e <= start) {
                Some(i) => {
                    lane_end[i] = end;
                    i
                }
                None if lane_end.len() < max_lanes => {
                    lane_end.push(end);
                    lane_end.len() - 1
                }
                // Past the lanes there is room for: share the lane that frees first.
                None => {
                    let i = (0..lane_end.len())
                        .min_by(|&a, &b| lane_end[a].total_cmp(&lane_end[b]))
                        .unwrap_or(0);
                    lane_end[i] = lane_end[i].max(end);
                    i
                }
            }
        })
        .collect()
}

/// A scope's bar in its lane, in pixels.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Bar {
    x0: f32,
    x1: f32,
    lane: usize,
}

/// Gap between a label and what is next to it, in pixels.
const LABEL_PAD: f32 = 4.0;

/// Where each bar's label goes: `Some((x, text))`, `text` being the label or its beginning elided
/// with "…", or `None` when there is no room for even one letter of it. A label goes inside its
/// bar when it fits; else into the free room after the bar, up to the next bar or label of the
/// lane (or `right`), elided when short of room; else, elided, into the bar itself. No two labels
/// overlap, and a label never lies over another scope's bar, so the name over a bar is always
/// that bar's own. `width` measures text; `fit` elides text to a width (as [`Fonts::fit`]).
fn place_labels(
    bars: &[Bar],
    labels: &[String],
    right: f32,
    width: impl Fn(&str) -> f32,
    fit: impl Fn(&str, f32) -> String,
) -> Vec<Option<(f32, String)>> {
    let mut placed: Vec<Option<(f32, String)>> = vec![None; bars.len()];
    // Per lane, the spans of text already placed.
    let mut taken: Vec<Vec<(f32, f32)>> = Vec::new();
    let mut order: Vec<usize> = (0..bars.len()).collect();
    order.sort_by(|&a, &b| bars[a].x0.total_cmp(&bars[b].x0));
    for i in order {
        let bar = bars[i];
        if taken.len() <= bar.lane {
            taken.resize(bar.lane + 1, Vec::new());
        }
        // Everything in the lane a label must keep clear of: the other bars, the labels placed.
        let obstacles: Vec<(f32, f32)> = bars
            .iter()
            .enumerate()
            .filter(|&(j, b)| j != i && b.lane == bar.lane)
            .map(|(_, b)| (b.x0, b.x1))
            .chain(taken[bar.lane].iter().copied())
            .collect();
        // The free room from `from` rightwards, up to `limit`.
        let room = |from: f32, limit: f32| -> f32 {
            if obstacles.iter().any(|&(a, b)| a <= from && from < b) {
                return 0.0;
            }
            let end = obstacles
                .iter()
                .filter(|&&(a, _)| a >= from)
                .map(|&(a, _)| a - LABEL_PAD)
                .fold(limit, f32::min);
            (end - from).max(0.0)
        };
        let label = &labels[i];
        let inside_from = bar.x0 + LABEL_PAD;
        let inside = room(inside_from, bar.x1 - LABEL_PAD);
        let outside_from = bar.x1 + LABEL_PAD;
        let outside = room(outside_from, right);
        let full = width(label);
        let (x, max) = if full <= inside {
            (inside_from, inside)
        } else if full <= outside || outside >= inside {
            (outside_from, outside)
        } else {
            (inside_from, inside)
        };
        let text = fit(label, max);
        // An ellipsis alone names nothing.
        if text.is_empty() || text == "…" {
            continue;
        }
        taken[bar.lane].push((x, x + width(&text)));
        placed[i] = Some((x, text));
    }
    placed
}

/// One dashed ceiling line: the devices it applies to and its steps, `(ts, ceiling)`.
type CeilingLine = (Vec<u32>, Vec<(f64, Option<u64>)>);

/// The ceilings of `t` grouped: devices whose ceilings changed identically share one line.
fn ceiling_lines(t: &Timeline) -> Vec<CeilingLine> {
    let mut lines: Vec<CeilingLine> = Vec::new();
    for (&d, steps) in &t.ceilings {
        let same = |a: &[(f64, Option<u64>)]| {
            a.len() == steps.len()
                && a.iter()
                    .zip(steps)
                    .all(|(p, q)| p.1 == q.1 && (p.0 - q.0).abs() < 1e3)
        };
        match lines.iter_mut().find(|(_, s)| same(s)) {
            Some((ds, _)) => ds.push(d),
            None => lines.push((vec![d], steps.clone())),
        }
    }
    lines.retain(|(_, steps)| steps.iter().any(|s| s.1.is_some()));
    lines
}

/// Draws the plot of `t` on `c`.
pub fn draw(c: &mut dyn Canvas, fonts: &Fonts, t: &Timeline, width: u32, height: u32, title: &str) {
    let (w, h) = (width as f32, height as f32);
    let (devices, _) = replay(t);
    let (t0, t1) = time_span(t).unwrap_or((0.0, 1.0));
    let t1 = if t1 > t0 { t1 } else { t0 + 1.0 };
    // A little room after the last event, so a change at the very end is not hidden by the frame.
    let t1 = t1 + (t1 - t0) * 0.03;
    let max_peak = devices.iter().map(|d| d.peak).max().unwrap_or(0);

    // Ceilings far above the curve would flatten it: those are named, not drawn to scale.
    let limit_in_range = |l: u64| max_peak == 0 || l <= max_peak.saturating_mul(3);
    let ceilings = ceiling_lines(t);
    let top_value = ceilings
        .iter()
        .flat_map(|(_, steps)| steps.iter().filter_map(|s| s.1))
        .filter(|&l| limit_in_range(l))
        .chain(std::iter::once(max_peak))
        .max()
        .unwrap_or(0)
        .max(1024) as f64;
    let (unit, unit_name) = byte_unit(top_value);
    let y_step = nice_step(top_value * 1.08 / unit, 5.0);
    let y_max = (top_value * 1.08 / unit / y_step).ceil() * y_step;
    let y_decimals = decimals(y_step);
    let y_labels: Vec<String> = (0..=((y_max / y_step).round() as usize))
        .map(|i| format!("{:.*}", y_decimals, i as f64 * y_step))
        .collect();

    // Scopes: spans in lanes above the plot.
    let spans: Vec<(String, f64, f64, bool)> = t
        .scopes
        .iter()
        .map(|(name, open, close)| (name.clone(), *open, close.unwrap_or(t1), close.is_none()))
        .collect();
    let lane_of = lanes(&spans, 4);
    let lane_count = lane_of.iter().max().map_or(0, |m| m + 1);

    // Layout, top to bottom: title, subtitle, legend, scope lanes, plot, x axis.
    let label_size = 12.0;
    let left = 24.0
        + y_labels
            .iter()
            .map(|l| fonts.width(l, label_size, false))
            .fold(fonts.width(unit_name, label_size, true), f32::max);
    let right = w - 28.0;
    let lane_h = 18.0;
    let legend_y = 76.0;
    let lanes_top = legend_y + 14.0;
    let top = lanes_top + lane_count as f32 * lane_h + 22.0;
    let bottom = h - 48.0;
    let (plot_w, plot_h) = (right - left, (bottom - top).max(40.0));
    let bottom = top + plot_h;

    let x = |ts: f64| left + ((ts - t0) / (t1 - t0)) as f32 * plot_w;
    let y = |bytes: u64| bottom - (bytes as f64 / unit / y_max) as f32 * plot_h;

    // Title and subtitle.
    c.text(
        left,
        30.0,
        &fonts.fit(title, 18.0, true, w - left - 20.0),
        18.0,
        INK,
        Anchor::Start,
        true,
    );
    let mut facts = Vec::new();
    if let Some(d) = devices.iter().max_by_key(|d| d.peak) {
        let (tu, tn) = time_unit(t1 - t0);
        facts.push(format!(
            "peak {} on device {} at {:.*} {tn}",
            format_size(d.peak),
            d.device,
            decimals(nice_step((t1 - t0) / tu, 50.0)),
            (d.peak_ts - t0) / tu
        ));
    }
    facts.push(format!(
        "{} events",
        t.events.max(t.used.values().map(|v| v.len() as u64).sum())
    ));
    let marks_of = |kind| t.marks.iter().filter(|m| m.kind == kind).count();
    let (denied, failed) = (marks_of(MarkKind::Denied), marks_of(MarkKind::Failed));
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
    if t.dropped > 0 {
        facts.push(format!(
            "{} events dropped: the curve is incomplete",
            t.dropped
        ));
    }
    c.text(
        left,
        52.0,
        &fonts.fit(&facts.join("  ·  "), 13.0, false, w - left - 20.0),
        13.0,
        if t.dropped > 0 { LIMIT_COLOR } else { MUTED },
        Anchor::Start,
        false,
    );

    // Legend.
    let mut lx = left;
    for d in &devices {
        let color = device_color(d.device);
        c.line(
            &[(lx, legend_y - 4.0), (lx + 22.0, legend_y - 4.0)],
            color,
            2.5,
            None,
        );
        let text = format!("device {} (peak {})", d.device, format_size(d.peak));
        c.text(
            lx + 28.0,
            legend_y,
            &text,
            label_size,
            INK,
            Anchor::Start,
            false,
        );
        lx += 28.0 + fonts.width(&text, label_size, false) + 22.0;
    }
    if !ceilings.is_empty() {
        c.line(
            &[(lx, legend_y - 4.0), (lx + 22.0, legend_y - 4.0)],
            LIMIT_COLOR,
            1.5,
            Some(5.0),
        );
        c.text(
            lx + 28.0,
            legend_y,
            "ceiling",
            label_size,
            INK,
            Anchor::Start,
            false,
        );
        lx += 28.0 + fonts.width("ceiling", label_size, false) + 22.0;
    }
    for (count, color, name) in [
        (denied, LIMIT_COLOR, "refused"),
        (failed, FAILED_COLOR, "failed"),
    ] {
        if count > 0 {
            cross(c, lx + 11.0, legend_y - 4.0, color);
            c.text(
                lx + 28.0,
                legend_y,
                name,
                label_size,
                INK,
                Anchor::Start,
                false,
            );
            lx += 28.0 + fonts.width(name, label_size, false) + 22.0;
        }
    }
    if !spans.is_empty() {
        c.rect(
            lx,
            legend_y - 10.0,
            22.0,
            10.0,
            Rgba::rgb(SCOPE_COLORS[0]).alpha(110),
        );
        c.text(
            lx + 28.0,
            legend_y,
            "scope",
            label_size,
            INK,
            Anchor::Start,
            false,
        );
    }

    // Scope spans: a bar in its lane, and a light band over the plot; then the names, placed so
    // that none overlaps another or lies over another scope's bar.
    let bars: Vec<Bar> = spans
        .iter()
        .zip(&lane_of)
        .map(|((_, start, end, _), &lane)| Bar {
            x0: x(*start),
            x1: x(*end).max(x(*start) + 2.0),
            lane,
        })
        .collect();
    for (i, bar) in bars.iter().enumerate() {
        let color = Rgba::rgb(SCOPE_COLORS[i % SCOPE_COLORS.len()]);
        let ly = lanes_top + bar.lane as f32 * lane_h;
        c.rect(bar.x0, top, bar.x1 - bar.x0, plot_h, color.alpha(22));
        c.rect(bar.x0, ly, bar.x1 - bar.x0, lane_h - 4.0, color.alpha(110));
    }
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
        right,
        |text| fonts.width(text, 11.0, false),
        |text, max| fonts.fit(text, 11.0, false, max),
    );
    for (bar, label) in bars.iter().zip(placed) {
        if let Some((lx, text)) = label {
            let ly = lanes_top + bar.lane as f32 * lane_h;
            c.text(
                lx,
                ly + lane_h - 8.0,
                &text,
                11.0,
                INK,
                Anchor::Start,
                false,
            );
        }
    }

    // Grid and axes.
    for (i, label) in y_labels.iter().enumerate() {
        let yy = bottom - (i as f64 * y_step / y_max) as f32 * plot_h;
        if i > 0 {
            c.line(&[(left, yy), (right, yy)], GRID, 1.0, None);
        }
        c.text(
            left - 8.0,
            yy + 4.0,
            label,
            label_size,
            INK,
            Anchor::End,
            false,
        );
    }
    c.text(
        left - 8.0,
        top - 8.0,
        unit_name,
        label_size,
        INK,
        Anchor::End,
        true,
    );
    let (tu, tn) = time_unit(t1 - t0);
    let span_units = (t1 - t0) / tu;
    let x_step = nice_step(span_units, (plot_w / 110.0).max(2.0) as f64);
    let x_decimals = decimals(x_step);
    let mut k = 0.0;
    while k <= span_units + 1e-9 {
        let xx = left + (k / span_units) as f32 * plot_w;
        if k > 0.0 {
            c.line(&[(xx, top), (xx, bottom)], GRID, 1.0, None);
        }
        c.line(&[(xx, bottom), (xx, bottom + 5.0)], INK, 1.0, None);
        c.text(
            xx,
            bottom + 19.0,
            &format!("{k:.x_decimals$}"),
            label_size,
            INK,
            Anchor::Middle,
            false,
        );
        k += x_step;
    }
    c.text(
        left + plot_w / 2.0,
        h - 10.0,
        &format!("time since the first event ({tn})"),
        label_size,
        MUTED,
        Anchor::Middle,
        false,
    );
    c.line(
        &[(left, top), (left, bottom), (right, bottom)],
        INK,
        1.0,
        None,
    );

    // Ceilings: a dashed step line per group of devices that shared them, from each change to the
    // next (no line while there was none). A ceiling far above the curve runs along the top edge,
    // named "above the plot", so that the curve keeps its scale.
    let single = devices.len() <= 1 || ceilings.len() == 1;
    let mut ceiling_labels: Vec<(f32, f32)> = Vec::new();
    for (ds, steps) in &ceilings {
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
            let end = steps.get(k + 1).map_or(t1, |next| next.0);
            (x(ts).max(left), x(end).min(right), limit)
        });
        for (x0, x1, limit) in segments {
            let Some(l) = limit else {
                // No ceiling from here: end the line drawn so far.
                if path.len() > 1 {
                    c.line(&path, LIMIT_COLOR, 1.5, Some(6.0));
                }
                path.clear();
                continue;
            };
            let (yy, text) = if limit_in_range(l) {
                (y(l), format!("ceiling {}{which}", format_size(l)))
            } else {
                (
                    top,
                    format!("ceiling {}{which} (above the plot)", format_size(l)),
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

    // The curves, filled lightly beneath, then each peak marked.
    for d in &devices {
        let color = device_color(d.device);
        let points = curve(&t.used[&d.device], t1, x, y);
        if let (Some(first), Some(last)) = (points.first(), points.last()) {
            let mut area = points.clone();
            area.push((last.0, bottom));
            area.push((first.0, bottom));
            c.polygon(&area, color.alpha(34));
        }
        c.line(&points, color, 2.0, None);
    }
    for d in &devices {
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
        let lw = fonts.width(&label, label_size, true);
        let (lx, anchor) = if px + 8.0 + lw <= right {
            (px + 8.0, Anchor::Start)
        } else {
            (px - 8.0, Anchor::End)
        };
        c.text(
            lx,
            (py - 6.0).max(top + 12.0),
            &label,
            label_size,
            color,
            anchor,
            true,
        );
    }

    // Refused and failed allocations, each a cross on the curve where it happened.
    for m in &t.marks {
        let color = match m.kind {
            MarkKind::Denied => LIMIT_COLOR,
            MarkKind::Failed => FAILED_COLOR,
        };
        cross(c, x(m.ts), y(m.used), color);
    }
}

/// An "×" of 9 pixels centred on (`cx`, `cy`).
fn cross(c: &mut dyn Canvas, cx: f32, cy: f32, color: Rgba) {
    let r = 4.5;
    c.line(&[(cx - r, cy - r), (cx + r, cy + r)], color, 2.0, None);
    c.line(&[(cx - r, cy + r), (cx + r, cy - r)], color, 2.0, None);
}

/// The command with its program's directory left out: the arguments say more in a title.
fn short_command(command: &str) -> String {
    let (program, rest) = command.split_once(' ').unwrap_or((command, ""));
    let program = Path::new(program)
        .file_name()
        .map_or(program.into(), |n| n.to_string_lossy());
    match (program.is_empty(), rest.is_empty()) {
        (true, _) => "(unknown command)".to_string(),
        (false, true) => program.into_owned(),
        (false, false) => format!("{program} {rest}"),
    }
}

/// Reads a trace file, with errors that say what is wrong with it.
pub fn load(path: &Path) -> Result<Timeline> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the trace {}", path.display()))?;
    read_chrome_trace(&text)
        .with_context(|| format!("{} is not a gpumemhook timeline", path.display()))
}

pub fn plot(args: PlotArgs) -> Result<i32> {
    let format = args
        .output
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    if !matches!(format.as_deref(), Some("png" | "svg")) {
        return Err(crate::UsageError(format!(
            "-o {}: the image must end in .png or .svg",
            args.output.display()
        ))
        .into());
    }
    let t = load(&args.trace)?;
    if t.used.is_empty() {
        bail!(
            "{} holds no memory events: the process allocated no device memory while it was \
             recorded, so there is nothing to plot",
            args.trace.display()
        );
    }
    let title = args.title.clone().unwrap_or_else(|| {
        format!(
            "GPU memory used: {} (pid {})",
            short_command(&t.command),
            t.pid
        )
    });
    let fonts = Fonts::load()?;
    let bytes = if format.as_deref() == Some("svg") {
        let mut svg = Svg::new(args.width, args.height);
        draw(&mut svg, &fonts, &t, args.width, args.height, &title);
        svg.finish().into_bytes()
    } else {
        let mut raster = Raster::new(args.width, args.height, &fonts)?;
        draw(&mut raster, &fonts, &t, args.width, args.height, &title);
        raster.png()?
    };
    std::fs::write(&args.output, bytes)
        .with_context(|| format!("cannot write {}", args.output.display()))?;
    println!("{}", args.output.display());
    Ok(0)
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

    #[test]
    fn curves_keep_spikes_inside_one_pixel() {
        // A spike to 1000 and back within one column must still reach the top.
        let points = [(0.0, 10), (0.1, 1000), (0.2, 10), (10.0, 20)];
        let c = curve(&points, 10.0, |t| t as f32, |b| -(b as f32));
        assert!(c.iter().any(|p| p.1 == -1000.0), "{c:?}");
        assert_eq!(c.last(), Some(&(10.0, -20.0)));
    }

    #[test]
    fn titles_leave_out_the_program_directory() {
        assert_eq!(
            short_command("/usr/bin/python3 train.py --x"),
            "python3 train.py --x"
        );
        assert_eq!(short_command("simrun"), "simrun");
        assert_eq!(short_command(""), "(unknown command)");
    }

    /// Ten pixels a character; elision keeps the first characters and adds "…" (one character).
    fn place(bars: &[Bar], labels: &[&str], right: f32) -> Vec<Option<(f32, String)>> {
        let labels: Vec<String> = labels.iter().map(|l| l.to_string()).collect();
        let width = |t: &str| t.chars().count() as f32 * 10.0;
        let fit = |t: &str, max: f32| {
            if width(t) <= max {
                return t.to_string();
            }
            let keep = ((max / 10.0) as usize).saturating_sub(1);
            if keep == 0 {
                return String::new();
            }
            t.chars().take(keep).collect::<String>() + "…"
        };
        place_labels(bars, &labels, right, width, fit)
    }

    fn bar(x0: f32, x1: f32, lane: usize) -> Bar {
        Bar { x0, x1, lane }
    }

    /// Checks the promises of `place_labels`: no overlap, nothing over another bar, names true.
    fn check_placement(bars: &[Bar], labels: &[&str], placed: &[Option<(f32, String)>]) {
        let spans: Vec<(usize, f32, f32)> = placed
            .iter()
            .enumerate()
            .filter_map(|(i, p)| {
                p.as_ref()
                    .map(|(x, t)| (i, *x, *x + t.chars().count() as f32 * 10.0))
            })
            .collect();
        for &(i, a0, a1) in &spans {
            let text = &placed[i].as_ref().unwrap().1;
            let stem = text.trim_end_matches('…');
            assert!(
                labels[i].starts_with(stem),
                "{text:?} is not {:?}",
                labels[i]
            );
            for &(j, b0, b1) in &spans {
                if i != j && bars[i].lane == bars[j].lane {
                    assert!(a1 <= b0 || b1 <= a0, "labels {i} and {j} overlap");
                }
            }
            for (j, b) in bars.iter().enumerate() {
                if i != j && b.lane == bars[i].lane {
                    assert!(a1 <= b.x0 || b.x1 <= a0, "label {i} lies over bar {j}");
                }
            }
        }
    }

    #[test]
    fn scope_labels_never_overlap_nor_cover_another_bar() {
        // Short adjacent scopes (as in the demo) and a long one right after them.
        let bars = [
            bar(100.0, 104.0, 0),
            bar(105.0, 109.0, 0),
            bar(110.0, 400.0, 0),
            bar(402.0, 404.0, 0),
        ];
        let labels = ["alpha", "beta", "GPUMemTrace", "tail-scope"];
        let placed = place(&bars, &labels, 1000.0);
        check_placement(&bars, &labels, &placed);
        // The long bar shows its own name, whole, inside.
        assert_eq!(placed[2], Some((114.0, "GPUMemTrace".to_string())));
        // The short ones had no room for a letter: left out rather than drawn over a neighbour.
        assert_eq!(placed[0], None);
        assert_eq!(placed[1], None);
        // The last has the free room after it.
        assert_eq!(placed[3], Some((408.0, "tail-scope".to_string())));
    }

    #[test]
    fn scope_labels_are_elided_to_the_room_they_have() {
        let bars = [bar(0.0, 10.0, 0), bar(90.0, 300.0, 0), bar(0.0, 10.0, 1)];
        let labels = ["forward-pass", "backward", "other lane"];
        let placed = place(&bars, &labels, 1000.0);
        check_placement(&bars, &labels, &placed);
        // 14 to 86 free after the first bar: 7 characters, "forwar…".
        assert_eq!(placed[0], Some((14.0, "forwar…".to_string())));
        // A bar of another lane is no obstacle.
        assert_eq!(placed[2], Some((14.0, "other lane".to_string())));
        // Many random layouts keep the promises.
        let mut seed = 12345u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % 1000) as f32
        };
        for _ in 0..200 {
            let bars: Vec<Bar> = (0..12)
                .map(|k| {
                    let x0 = next();
                    bar(x0, x0 + next() / 8.0 + 2.0, k % 3)
                })
                .collect();
            let labels = ["a", "bb", "scope", "GPUMemTrace", "x y z", "step 12"];
            let labels: Vec<&str> = (0..12).map(|k| labels[k % labels.len()]).collect();
            let placed = place(&bars, &labels, 1100.0);
            check_placement(&bars, &labels, &placed);
        }
    }

    #[test]
    fn overlapping_scopes_get_their_own_lanes() {
        let s = |a: f64, b: f64| (String::new(), a, b, false);
        assert_eq!(
            lanes(&[s(0.0, 5.0), s(1.0, 2.0), s(6.0, 7.0)], 4),
            vec![0, 1, 0]
        );
    }
}
