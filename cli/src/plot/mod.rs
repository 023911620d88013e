//! `gpumemhook plot TRACE -o FILE.png|FILE.svg`: memory used over time, one line per device, with
//! each device's peak marked, the ceiling as a dashed step line (it may change during the run),
//! refused and failed allocations marked on the curve, and scopes as labelled spans. Scope labels
//! never overlap: a name goes inside its bar, else into the free room after it, elided with "…"
//! when the room is short, else it is left out (the bar and its band still show the span).
//!
//! The time drawn is a window of the timeline: `--from`/`--to` (seconds since the first event, or
//! around the peak, [`TimePoint`]); by default all of it but the idle start-up (before the first
//! scope; without scopes, the first 1 % of the peak), which is left out and said so in the subtitle
//! ([`layout::default_start`]). Peak restarts (`reset_peak`) are drawn as dashed lines, and the
//! ceiling in force at the end is named in the legend, however short its last step.
//!
//! A trace may hold millions of events; the curve is reduced to at most four points per pixel
//! column (the value entering the column, its highest, its lowest and the last), so every spike
//! stays visible at any zoom while the files stay small. A recording of more than
//! [`gpumemhook_timeline::REDUCE_ABOVE_EVENTS`] events is reduced already as it is read, in a
//! second pass over the file once the first has given the window and the plot area:
//! [`layout::COLUMNS_PER_PIXEL`] columns of time per pixel column, so that memory stays bounded
//! at any length and the image is the one the whole curve would give.
//!
//! With `--by-module`, one device's memory is stacked under its curve by the shared object that
//! asked for it ([`stack`]).
//!
//! Split by job, each using only those before it: [`timepoint`] (a moment given to `--from`/`--to`),
//! [`palette`] (the colours), [`axes`] (scales and ticks), [`layout`] (where things go), [`draw`]
//! (the axes and the content), [`stack`] (the bands by module); this file holds the command and the
//! order the parts are drawn in.

use anyhow::{bail, Context, Result};
use gpumemhook_timeline::{Keep, Reduction, Timeline};
use std::path::{Path, PathBuf};

use crate::canvas::{Canvas, Fonts, Raster, Svg};
use gpumemhook_timeline::replay;

mod axes;
mod draw;
mod layout;
mod palette;
mod stack;
mod timepoint;

use layout::{ceiling_lines, lanes, Layout, Window};
use timepoint::TimePoint;

#[derive(clap::Args, Debug)]
#[command(after_help = "\
Examples:
  gpumemhook run --trace mem.trace -- python train.py
  gpumemhook plot mem.trace -o mem.png
  gpumemhook plot mem.trace -o mem.svg --width 1600 --height 700
  gpumemhook plot mem.trace -o mem.png --by-module   # who holds it, stacked
  gpumemhook plot mem.trace -o mem.png --from 12 --to 14.5  # seconds since the first event
  gpumemhook plot mem.trace -o mem.png --from peak±2s       # 2 s either side of the peak
  gpumemhook plot mem.trace -o mem.png --from 0             # with the idle start-up

For event-level detail, `gpumemhook export mem.trace --perfetto mem.pftrace` writes it for
the Perfetto UI.")]
pub struct PlotArgs {
    /// A timeline written by GPUMEMHOOK_TRACE / `gpumemhook run --trace`.
    pub trace: PathBuf,
    /// The image to write: .png or .svg (or a device, a FIFO, /dev/stdout with --format).
    #[arg(short, long, value_name = "FILE")]
    pub output: PathBuf,
    /// The image format when the file name does not end in .png or .svg (`-o /dev/stdout`).
    #[arg(long, value_parser = ["png", "svg"])]
    pub format: Option<String>,
    /// Width in pixels.
    #[arg(long, default_value_t = 1200, value_parser = clap::value_parser!(u32).range(320..=8000))]
    pub width: u32,
    /// Height in pixels.
    #[arg(long, default_value_t = 600, value_parser = clap::value_parser!(u32).range(240..=8000))]
    pub height: u32,
    /// Title (default: the command and pid of the traced process).
    #[arg(long)]
    pub title: Option<String>,
    /// Stack one device's memory by the shared object that asked for it (the device with the
    /// highest peak, or --device).
    #[arg(long)]
    pub by_module: bool,
    /// The device whose memory --by-module stacks.
    #[arg(long, value_name = "N", requires = "by_module")]
    pub device: Option<u32>,
    /// Start of the time drawn: seconds since the first event (`12`, `12.5s`, `800ms`), or around
    /// the peak (`peak-2s`, `peak+1.5s`, or `peak±2s` for 2 s either side without --to). By
    /// default the idle start-up, before the first scope (without scopes, before the first 1 % of
    /// the peak), is left out, as the subtitle says (`--from 0` draws it).
    #[arg(long, value_name = "T", value_parser = TimePoint::parse, allow_hyphen_values = true)]
    pub from: Option<TimePoint>,
    /// End of the time drawn, as --from (default: the end of the timeline).
    #[arg(long, value_name = "T", value_parser = TimePoint::parse, allow_hyphen_values = true)]
    pub to: Option<TimePoint>,
}

/// What a plot of a timeline lays out before drawing: each device's replayed figures, the ceiling
/// lines, the scopes cut to the window with their lanes, and the geometry.
struct Frame {
    devices: Vec<gpumemhook_timeline::DeviceReplay>,
    ceilings: Vec<layout::CeilingLine>,
    spans: Vec<draw::Span>,
    lane_of: Vec<usize>,
    layout: Layout,
}

impl Frame {
    fn of(fonts: &Fonts, t: &Timeline, size: (u32, u32), window: &Window) -> Frame {
        let (devices, _) = replay(t);
        let ceilings = ceiling_lines(t);
        // Scopes: spans in lanes above the plot, cut to the window; one still open at exit runs to
        // the end.
        let spans: Vec<draw::Span> = t
            .scopes
            .iter()
            .filter_map(|(name, open, close)| {
                let end = close.unwrap_or(window.t1);
                (end >= window.t0 && *open <= window.t1).then(|| {
                    let (start, end) = (open.max(window.t0), end.min(window.t1));
                    (name.clone(), start, end, close.is_none())
                })
            })
            .collect();
        let lane_of = lanes(&spans, 4);
        let lane_count = lane_of.iter().max().map_or(0, |m| m + 1);
        let layout = Layout::new(
            fonts, window, &devices, &ceilings, lane_count, size.0, size.1,
        );
        Frame {
            devices,
            ceilings,
            spans,
            lane_of,
            layout,
        }
    }
}

/// Draws the plot of `t` on `c`, part after part, each over the ones before.
fn draw(
    c: &mut dyn Canvas,
    fonts: &Fonts,
    t: &Timeline,
    size: (u32, u32),
    title: &str,
    stacked: Option<u32>,
    window: &Window,
) {
    let frame = Frame::of(fonts, t, size, window);
    let (l, devices, ceilings) = (&frame.layout, &frame.devices, &frame.ceilings);
    draw::draw_title(c, fonts, l, t, devices, title, window);
    draw::draw_legend(c, fonts, l, t, devices, ceilings, frame.spans.len());
    draw::draw_scopes(c, fonts, l, &frame.spans, &frame.lane_of);
    draw::draw_axes(c, l);
    if let Some(device) = stacked {
        stack::draw_stack(c, fonts, l, t, device);
    }
    draw::draw_ceilings(c, fonts, l, ceilings, devices.len());
    draw::draw_curves(c, fonts, l, t, devices);
    draw::draw_restarts(c, fonts, l, devices);
    draw::draw_marks(c, l, t);
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

/// `plot`'s checked plan: the timeline read, and what to draw of it, how and where.
struct PlotPlan {
    timeline: Timeline,
    svg: bool,
    title: String,
    /// The device whose memory is stacked by module (`--by-module`).
    stacked: Option<u32>,
    window: Window,
    size: (u32, u32),
    output: PathBuf,
}

pub fn plot(args: PlotArgs) -> Result<i32> {
    let plan = plan(args)?;
    let image = execute(&plan)?;
    present(&plan, &image)?;
    Ok(0)
}

/// The plan of `args`: a usage error for an image format it cannot tell or a window outside the
/// timeline, an error for a timeline with nothing to draw or a device with nothing to stack.
fn plan(args: PlotArgs) -> Result<PlotPlan> {
    let format = args.format.clone().or_else(|| {
        args.output
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase)
    });
    if !matches!(format.as_deref(), Some("png" | "svg")) {
        return Err(crate::usage::UsageError(format!(
            "-o {}: the image must end in .png or .svg, or --format must say which",
            args.output.display()
        ))
        .into());
    }
    let (t, window) = read(&args)?;
    let title = args.title.clone().unwrap_or_else(|| {
        format!(
            "GPU memory used: {} (pid {})",
            short_command(&t.command),
            t.pid
        )
    });
    let stacked = if args.by_module {
        let device = stack::device_to_stack(&t, args.device);
        match device {
            Some(d) if t.module_used.contains_key(&d) => Some(d),
            Some(d) => bail!(
                "{}: device {d} has no events that name their module (timelines from gpumemhook                  before 0.x, or no device memory on device {d}), so there is nothing to stack",
                args.trace.display()
            ),
            None => None,
        }
    } else {
        None
    };
    Ok(PlotPlan {
        svg: format.as_deref() == Some("svg"),
        title,
        stacked,
        window,
        size: (args.width, args.height),
        output: args.output,
        timeline: t,
    })
}

/// The timeline `args` draws and its window: a long recording reduced as it is read, to columns of
/// the window its first reading gives (`crate::snapshots::load_bounded`); an error for a timeline
/// with nothing to draw, a usage error for a window outside it.
fn read(args: &PlotArgs) -> Result<(Timeline, Window)> {
    let mut window = None;
    let mut reduce = |mut first: Timeline| {
        gpumemhook_timeline::fill_overwritten(&mut first);
        let drawn = Window::of(&first, args.from, args.to).map_err(crate::usage::UsageError)?;
        let size = (args.width, args.height);
        let columns = Frame::of(&Fonts::load()?, &first, size, &drawn)
            .layout
            .pixel_columns();
        let (drawn_t0, drawn_t1) = (drawn.t0, drawn.t1);
        window = Some(drawn);
        Ok(Reduction {
            columns,
            modules: args.by_module,
            moments: None,
            // Changes before the window are not drawn, nor after it: its edges cut columns too.
            cuts: vec![drawn_t0, drawn_t1.next_up()],
        })
    };
    let keep = if args.by_module {
        Keep::Modules
    } else {
        Keep::Figures
    };
    let mut t = crate::snapshots::load_bounded(&args.trace, keep, Some(&mut reduce))?;
    gpumemhook_timeline::fill_overwritten(&mut t);
    if t.used.is_empty() {
        bail!(
            "{} holds no memory events: the process allocated no device memory while it was \
             recorded, so there is nothing to plot",
            args.trace.display()
        );
    }
    let window = match window {
        Some(window) => window,
        None => Window::of(&t, args.from, args.to).map_err(crate::usage::UsageError)?,
    };
    Ok((t, window))
}

/// The image of the plan, as the bytes of its file.
fn execute(plan: &PlotPlan) -> Result<Vec<u8>> {
    let (width, height) = plan.size;
    let fonts = Fonts::load()?;
    let (t, title, window) = (&plan.timeline, &plan.title, &plan.window);
    Ok(if plan.svg {
        let mut svg = Svg::new(width, height);
        draw(&mut svg, &fonts, t, plan.size, title, plan.stacked, window);
        svg.finish().into_bytes()
    } else {
        let mut raster = Raster::new(width, height, &fonts)?;
        draw(
            &mut raster,
            &fonts,
            t,
            plan.size,
            title,
            plan.stacked,
            window,
        );
        raster.png()?
    })
}

/// Writes the image, and prints its path for a file (never after the image itself on a terminal
/// or a pipe).
fn present(plan: &PlotPlan, image: &[u8]) -> Result<()> {
    let output = &plan.output;
    gpumemhook_reader::write_file(output, |out| out.write_all(image))
        .with_context(|| format!("cannot write {}", output.display()))?;
    if matches!(
        gpumemhook_reader::output_target(output),
        Ok(gpumemhook_reader::OutputTarget::Replace(_))
    ) {
        println!("{}", output.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn titles_leave_out_the_program_directory() {
        assert_eq!(
            short_command("/usr/bin/python3 train.py --x"),
            "python3 train.py --x"
        );
        assert_eq!(short_command("simrun"), "simrun");
        assert_eq!(short_command(""), "(unknown command)");
    }
}
