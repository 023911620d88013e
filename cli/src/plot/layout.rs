//! Where everything of the plot goes: the time window drawn ([`Window`]), the plot area, its scales
//! and the mapping from time and bytes to pixels ([`Layout`]), the scope lanes and where each scope's label fits, and the ceilings
//! grouped into lines.

use gpumemhook_timeline::Timeline;

use super::axes::{byte_unit, decimals, nice_step, time_unit};
use super::timepoint::TimePoint;
use crate::canvas::Fonts;
use crate::style::duration;
use gpumemhook_timeline::{replay, time_span, Columns, DeviceReplay};

/// The time drawn, µs of the trace clock, and where the time axis counts from.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Window {
    pub t0: f64,
    pub t1: f64,
    /// The timeline's first event: the axis says time since then.
    pub origin: f64,
    /// What the subtitle says about the window: the start-up left out, or the window asked for.
    pub note: Option<String>,
}

/// Columns of time per pixel column of the plot area that a long recording's curves are reduced to
/// as it is read ([`Layout::pixel_columns`]).
pub(super) const COLUMNS_PER_PIXEL: u32 = 4;

/// Idle start-up shorter than this share of the timeline is drawn anyway.
const TRIM_AT_LEAST: f64 = 0.05;
/// Room kept before the first activity when the start-up is left out, as a share of what follows.
const TRIM_MARGIN: f64 = 0.02;
/// The share of the peak that counts as activity.
const ACTIVE_SHARE: u64 = 100;

impl Window {
    /// The window of `t` for --from and --to (seconds since the first event or around the peak),
    /// by default the whole timeline less its idle start-up; an error names a window that is empty.
    pub fn of(
        t: &Timeline,
        from: Option<TimePoint>,
        to: Option<TimePoint>,
    ) -> Result<Window, String> {
        let (lo, hi) = time_span(t).unwrap_or((0.0, 1.0));
        let hi = if hi > lo { hi } else { lo + 1.0 };
        let (devices, _) = replay(t);
        let peak = devices
            .iter()
            .max_by_key(|d| d.peak)
            .map_or(lo, |d| d.peak_ts);
        let default_start = default_start(t, &devices, lo, hi);
        // A window asked for is drawn as asked: the start-up is left out only by default.
        let t0 = match (from, to) {
            (Some(p), _) => p.at(lo, peak, false).max(lo),
            (None, Some(_)) => lo,
            (None, None) => default_start.unwrap_or(lo),
        };
        let to = to.or(match from {
            Some(TimePoint::AroundPeak(s)) => Some(TimePoint::AroundPeak(s)),
            _ => None,
        });
        // A little room after the end, so that a change at the very end is not hidden by the frame.
        let end = hi + (hi - t0).max(0.0) * 0.03;
        let t1 = to.map_or(end, |p| p.at(lo, peak, true).min(end));
        if t1 <= t0 {
            return Err(format!(
                "--from/--to: nothing to draw between {} and {} (the timeline runs {} from its \
                 first event; its peak is at {})",
                duration((t0 - lo) / 1e6),
                duration((t1 - lo).max(0.0) / 1e6),
                duration((hi - lo) / 1e6),
                duration((peak - lo) / 1e6)
            ));
        }
        let note = if from.is_none() && to.is_none() {
            default_start.map(|start| {
                format!(
                    "the first {} (idle start-up) left out: --from 0 draws it",
                    duration((start - lo) / 1e6)
                )
            })
        } else {
            let start = if t0 <= lo {
                "the first event".to_string()
            } else {
                duration((t0 - lo) / 1e6)
            };
            Some(format!("from {start} to {}", duration((t1 - lo) / 1e6)))
        };
        Ok(Window {
            t0,
            t1,
            origin: lo,
            note,
        })
    }
}

/// Where the plot starts by default when the timeline begins with idle start-up: a little before
/// the first scope opened or, in a timeline without scopes, the first time any device held 1 % of
/// the highest peak (the scopes mark the work the program wants seen; without them, memory
/// does); `None` when the start-up is too short to be worth leaving out.
pub(super) fn default_start(
    t: &Timeline,
    devices: &[DeviceReplay],
    lo: f64,
    hi: f64,
) -> Option<f64> {
    let first_scope = t.scopes.iter().map(|s| s.1).reduce(f64::min);
    let active = first_scope.or_else(|| {
        let highest = devices.iter().map(|d| d.run_peak.0).max().unwrap_or(0);
        let busy = (highest / ACTIVE_SHARE).max(1);
        t.used
            .values()
            .filter_map(|points| points.iter().find(|p| p.1 >= busy).map(|p| p.0))
            .reduce(f64::min)
    })?;
    let start = (active - (hi - active) * TRIM_MARGIN).max(lo);
    (start - lo > (hi - lo) * TRIM_AT_LEAST).then_some(start)
}

/// The geometry of one plot, top to bottom: title, subtitle, legend, scope lanes, plot area, x axis.
pub(super) struct Layout {
    /// Width and height of the image.
    pub w: f32,
    pub h: f32,
    /// The time span drawn, µs (a little room after the last event).
    pub t0: f64,
    pub t1: f64,
    /// The timeline's first event, from which the time axis counts.
    pub origin: f64,
    /// The largest peak of any device, which ceilings are compared with.
    pub max_peak: u64,
    /// Bytes per unit of the y axis, and its name.
    pub unit: f64,
    pub unit_name: &'static str,
    /// The y axis in units: its top, its step and the label of each step.
    pub y_max: f64,
    pub y_step: f64,
    pub y_labels: Vec<String>,
    /// Edges of the plot area, in pixels.
    pub left: f32,
    pub right: f32,
    pub top: f32,
    pub bottom: f32,
    pub plot_w: f32,
    pub plot_h: f32,
    /// Baseline of the legend, top of the first scope lane, height of a lane.
    pub legend_y: f32,
    pub lanes_top: f32,
    pub lane_h: f32,
    /// Size of axis and legend text.
    pub label_size: f32,
}

impl Layout {
    /// Lays out a plot of `window` of `width` × `height` pixels with `lane_count` scope lanes.
    pub fn new(
        fonts: &Fonts,
        window: &Window,
        devices: &[DeviceReplay],
        ceilings: &[CeilingLine],
        lane_count: usize,
        width: u32,
        height: u32,
    ) -> Layout {
        let (w, h) = (width as f32, height as f32);
        let (t0, t1) = (window.t0, window.t1);
        // The whole run's: a peak restart must not cut off the curve before it.
        let max_peak = devices.iter().map(|d| d.run_peak.0).max().unwrap_or(0);
        let in_range = |l: u64| limit_in_range(max_peak, l);
        let top_value = ceilings
            .iter()
            .flat_map(|(_, steps)| steps.iter().filter_map(|s| s.1))
            .filter(|&l| in_range(l))
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
        Layout {
            w,
            h,
            t0,
            t1,
            origin: window.origin,
            max_peak,
            unit,
            unit_name,
            y_max,
            y_step,
            y_labels,
            left,
            right,
            top,
            bottom,
            plot_w,
            plot_h,
            legend_y,
            lanes_top,
            lane_h,
            label_size,
        }
    }

    /// The unit of the time axis (µs per unit, name): the one the latest time drawn reads best in,
    /// so that a window late in a run says 11.20 s rather than 11200 ms.
    pub fn time_unit(&self) -> (f64, &'static str) {
        time_unit(self.t1 - self.origin)
    }

    /// The x pixel of time `ts` (µs).
    pub fn x(&self, ts: f64) -> f32 {
        self.left + ((ts - self.t0) / (self.t1 - self.t0)) as f32 * self.plot_w
    }

    /// Columns of time that split each pixel column of the plot area (`x` from `c - 0.5` to
    /// `c + 0.5`) into [`COLUMNS_PER_PIXEL`]: a long recording's curves are reduced to them as it
    /// is read, and every curve's changes are put in pixel columns by them ([`Layout::column_x`]),
    /// so that a reduced curve keeps each pixel column's entering, highest, lowest and last points.
    pub fn pixel_columns(&self) -> Columns {
        let per_pixel = (self.t1 - self.t0) / f64::from(self.plot_w);
        let first = f64::from(self.left.round()) - 0.5;
        let pixels = (f64::from(self.right) - first).ceil() as u32 + 1;
        let from = self.t0 + (first - f64::from(self.left)) * per_pixel;
        Columns {
            from,
            to: from + per_pixel * f64::from(pixels),
            count: pixels * COLUMNS_PER_PIXEL,
        }
    }

    /// The x of the middle of the pixel column that a change at `ts` is drawn in.
    pub fn column_x(&self, ts: f64) -> f32 {
        let pixel = self
            .pixel_columns()
            .column(ts)
            .div_euclid(i64::from(COLUMNS_PER_PIXEL));
        (self.left.round() as i64 + pixel) as f32
    }

    /// The y pixel of `bytes`.
    pub fn y(&self, bytes: u64) -> f32 {
        self.bottom - (bytes as f64 / self.unit / self.y_max) as f32 * self.plot_h
    }

    /// Whether ceiling `limit` is drawn to scale: ceilings far above the curve would flatten it,
    /// so those are named, not drawn to scale.
    pub fn limit_in_range(&self, limit: u64) -> bool {
        limit_in_range(self.max_peak, limit)
    }

    /// The top edge of scope lane `lane`.
    pub fn lane_y(&self, lane: usize) -> f32 {
        self.lanes_top + lane as f32 * self.lane_h
    }
}

fn limit_in_range(max_peak: u64, limit: u64) -> bool {
    max_peak == 0 || limit <= max_peak.saturating_mul(3)
}

/// Scope spans packed into lanes so that overlapping scopes do not hide each other.
pub(super) fn lanes(spans: &[(String, f64, f64, bool)], max_lanes: usize) -> Vec<usize> {
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
pub(super) struct Bar {
    pub x0: f32,
    pub x1: f32,
    pub lane: usize,
}

/// Gap between a label and what is next to it, in pixels.
const LABEL_PAD: f32 = 4.0;

/// Where each bar's label goes: `Some((x, text))`, `text` being the label or its beginning elided
/// with "…", or `None` when there is no room for even one letter of it. A label goes inside its
/// bar when it fits; else into the free room after the bar, up to the next bar or label of the
/// lane (or `right`), elided when short of room; else, elided, into the bar itself. No two labels
/// overlap, and a label never lies over another scope's bar, so the name over a bar is always
/// that bar's own. `width` measures text; `fit` elides text to a width (as [`Fonts::fit`]).
pub(super) fn place_labels(
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
pub(super) type CeilingLine = (Vec<u32>, Vec<(f64, Option<u64>)>);

/// The ceilings of `t` grouped: devices whose ceilings changed identically share one line.
pub(super) fn ceiling_lines(t: &Timeline) -> Vec<CeilingLine> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
