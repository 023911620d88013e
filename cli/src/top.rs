//! `gpumemhook top`: the `ls` view refreshed live in the terminal, sortable, like nvidia-smi but
//! exact, per process, and with peaks. Without a terminal (or with `--once` / `--iterations`), it
//! prints plain frames instead, as `top -b` does, so it can be logged and tested. Processes in
//! groups (`docs/groups.md`) bring a row per group and device under the process table: members,
//! the group's `used`, its exact joint peak and its ceiling.
//!
//! Above the table, NVML's view (`crate::devices`), for what is outside the hook: a line per
//! device (total, used by every process, free, utilisation) and under it the compute processes
//! NVML lists there that are not hooked, with their memory as NVML sees it. NVML names processes by
//! their pids on the node: inside a pid namespace of its own (a pod), those cannot be matched to
//! the pids the reader sees, so they are shown as node pids, every one, and matched to nothing.

use anyhow::Result;
use gpumemhook_reader::module_label;
use gpumemhook_reader::{format_size, DeviceStats, Snapshot};
use gpumemhook_reader::{own_pid_namespace, INITIAL_PID_NAMESPACE};
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Color, Modifier, Style as TuiStyle};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Cell, Paragraph, Row, Table, TableState};
use std::io::IsTerminal;
use std::time::{Duration, Instant};

use crate::devices::{DeviceUsage, Nvml, NvmlProcess};
use crate::groups::GroupRow;
use crate::processes::{command_cell, gather, nothing_message, scopes_cell, table, Listing};
use crate::style::{count, size_or_dash, Painter};

#[derive(clap::Args, Debug)]
#[command(after_help = "\
Keys: q or Esc quits; s (or Tab) changes the sort column, r reverses it; u, p, l, i, c sort by
used, peak, limit, pid, command; a shows idle hooked processes too; Up/Down select a process;
z resets the peaks of the selected process; m shows who holds the selected process's memory (the
shared object that asked for it, per device); w shows where (the lines of Python that asked for
it, when the process runs with GPUMEMHOOK_STACKS=python:<min bytes>).

Examples:
  gpumemhook top
  gpumemhook top --sort peak --interval 0.5
  gpumemhook top --once            # one plain frame, for scripts
  gpumemhook top -n 10 > log.txt   # ten frames, one per interval
  gpumemhook top --once --by-module  # and who holds the memory
  gpumemhook top --once --by-site    # and which lines of Python")]
pub struct TopArgs {
    /// Seconds between refreshes.
    #[arg(long, short = 'd', default_value_t = 1.0, value_name = "SECONDS")]
    pub interval: f64,
    /// Sort by this column (largest first, pid and command ascending).
    #[arg(long, value_enum, default_value_t = SortKey::Used)]
    pub sort: SortKey,
    /// Include hooked processes that have not used the GPU yet.
    #[arg(long, short)]
    pub all: bool,
    /// Print this many plain frames (at least 1), then stop (without -n: until interrupted, plain
    /// frames when stdout is not a terminal).
    #[arg(long, short = 'n', value_name = "N")]
    pub iterations: Option<u64>,
    /// Print one plain frame and stop (`-n 1`).
    #[arg(long)]
    pub once: bool,
    /// Show the breakdown by module (the `m` key): under each plain frame, every process's; live,
    /// the selected process's.
    #[arg(long)]
    pub by_module: bool,
    /// Show the breakdown by Python call site (the `w` key), for processes run with
    /// GPUMEMHOOK_STACKS=python:<min bytes>: under each plain frame, every process's; live, the
    /// selected process's.
    #[arg(long)]
    pub by_site: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SortKey {
    Used,
    Peak,
    Limit,
    Pid,
    Command,
}

impl SortKey {
    const ALL: [SortKey; 5] = [
        SortKey::Used,
        SortKey::Peak,
        SortKey::Limit,
        SortKey::Pid,
        SortKey::Command,
    ];

    fn next(self) -> SortKey {
        let i = SortKey::ALL.iter().position(|&k| k == self).unwrap_or(0);
        SortKey::ALL[(i + 1) % SortKey::ALL.len()]
    }

    fn name(self) -> &'static str {
        match self {
            SortKey::Used => "USED",
            SortKey::Peak => "PEAK",
            SortKey::Limit => "LIMIT",
            SortKey::Pid => "PID",
            SortKey::Command => "COMMAND",
        }
    }
}

/// Sorts processes by `key` (sizes summed over devices), ties by pid.
pub fn sort(processes: &mut [Snapshot], key: SortKey, reverse: bool) {
    let total = |s: &Snapshot, f: fn(&gpumemhook_reader::DeviceStats) -> u64| -> u64 {
        s.devices.iter().map(f).sum()
    };
    processes.sort_by(|a, b| {
        let order = match key {
            SortKey::Used => total(b, |d| d.used).cmp(&total(a, |d| d.used)),
            SortKey::Peak => total(b, |d| d.peak).cmp(&total(a, |d| d.peak)),
            SortKey::Limit => {
                total(b, |d| d.limit.unwrap_or(0)).cmp(&total(a, |d| d.limit.unwrap_or(0)))
            }
            SortKey::Pid => a.pid.cmp(&b.pid),
            SortKey::Command => a.command.cmp(&b.command),
        };
        let order = order.then(a.pid.cmp(&b.pid));
        if reverse {
            order.reverse()
        } else {
            order
        }
    });
}

/// The line above the table: totals over every listed process.
fn headline(listing: &Listing) -> String {
    let used: u64 = listing
        .processes
        .iter()
        .flat_map(|s| &s.devices)
        .map(|d| d.used)
        .sum();
    let peak: u64 = listing
        .processes
        .iter()
        .flat_map(|s| &s.devices)
        .map(|d| d.peak)
        .sum();
    let n = listing.processes.len();
    let mut line = format!(
        "{n} process{}, {} used now, peaks add up to {}",
        if n == 1 { "" } else { "es" },
        format_size(used),
        format_size(peak)
    );
    if !listing.idle_hidden.is_empty() {
        line.push_str(&format!(", {} idle not shown", listing.idle_hidden.len()));
    }
    line
}

/// The lines of NVML's view under the headline: per device, its figures and then the processes
/// NVML lists on it that are not among the hooked ones of `listing` (idle ones included); one line
/// saying why where there is no NVML, or that it has no device.
fn nvml_lines(nvml: &Result<Nvml, String>, listing: &Listing) -> Vec<String> {
    let devices = match nvml.as_ref().map_err(String::clone).and_then(Nvml::usage) {
        Ok(devices) if devices.is_empty() => return vec!["NVML: no device".to_string()],
        Ok(devices) => devices,
        Err(why) => {
            return vec![format!(
                "NVML: not available ({why}): no device totals, nor processes outside the hook"
            )]
        }
    };
    // NVML's pids are the node's; only a reader in the node's pid namespace sees them as its own.
    let on_node = own_pid_namespace() == Some(INITIAL_PID_NAMESPACE);
    let hooked = |pid: u32| {
        listing.processes.iter().any(|s| s.pid == pid) || listing.idle_hidden.contains(&pid)
    };
    let mut lines = Vec::new();
    for device in &devices {
        lines.push(device_line(device));
        for process in &device.processes {
            if !on_node {
                lines.push(node_process_line(process));
            } else if !hooked(process.pid) {
                lines.push(unhooked_process_line(process));
            }
        }
    }
    lines
}

/// A device's line: NVML's total, used by all, free and utilisation ("n/a" where it has none).
fn device_line(device: &DeviceUsage) -> String {
    let utilisation = device
        .utilisation
        .map_or_else(|| "n/a".to_string(), |percent| format!("{percent}%"));
    format!(
        "device {} (NVML): {} total, {} used by all, {} free, utilisation {utilisation}",
        device.index,
        format_size(device.total),
        format_size(device.used),
        format_size(device.free)
    )
}

/// NVML's bytes of a process, "n/a" where it does not say.
fn nvml_used(process: &NvmlProcess) -> String {
    process.used.map_or_else(|| "n/a".to_string(), format_size)
}

/// A process NVML lists that no hooked process is (the reader on the node), with its command.
fn unhooked_process_line(process: &NvmlProcess) -> String {
    let command = gpumemhook_reader::command_line(process.pid).unwrap_or_default();
    format!(
        "  pid {:<8} {:>10}  (not hooked)  {command}",
        process.pid,
        nvml_used(process)
    )
    .trim_end()
    .to_string()
}

/// A process NVML lists, seen from inside a pid namespace of its own: a node pid, matched to none
/// of the reader's (its own process of the same number is another process).
fn node_process_line(process: &NvmlProcess) -> String {
    format!(
        "  node pid {:<8} {:>10}  (NVML's pid on the node, not this pid namespace's)",
        process.pid,
        nvml_used(process)
    )
}

fn batch(args: &TopArgs, frames: u64, painter: Painter) -> Result<i32> {
    let interval = Duration::from_secs_f64(args.interval.max(0.05));
    let mut said: Option<String> = None;
    let nvml = Nvml::open("top");
    for i in 0..frames {
        if i > 0 {
            std::thread::sleep(interval);
            println!();
        }
        let mut listing = gather(&[], args.all)?;
        sort(&mut listing.processes, args.sort, false);
        let now = chrono_free_time();
        println!("gpumemhook top  {now}  {}", headline(&listing));
        for line in nvml_lines(&nvml, &listing) {
            println!("{line}");
        }
        if listing.processes.is_empty() {
            // On stderr, as `ls` says it, and once until something is listed again: frames for a
            // log or a pipe stay frames.
            let message = nothing_message(&listing);
            if said.as_ref() != Some(&message) {
                sayln!("gpumemhook: {message}");
                said = Some(message);
            }
        } else {
            said = None;
            print!("{}", table(&listing.processes, painter));
            let groups = crate::groups::rows_of(&listing.processes);
            print!("{}", crate::groups::rows_table(&groups, painter));
        }
        if args.by_module {
            for s in &listing.processes {
                let modules = crate::attribution::module_table(s, painter, 2);
                if !modules.is_empty() {
                    println!("pid {}:", s.pid);
                    print!("{modules}");
                }
            }
        }
        if args.by_site {
            let with_sites: Vec<&Snapshot> = listing
                .processes
                .iter()
                .filter(|s| s.by_site.is_some())
                .collect();
            for s in &with_sites {
                println!("pid {}:", s.pid);
                print!("{}", crate::attribution::site_table(s, painter, 2));
            }
            if with_sites.is_empty() && !listing.processes.is_empty() {
                println!(
                    "{}",
                    painter.paint(
                        &format!(
                            "no process records Python call sites (run it with {})",
                            crate::attribution::stacks_setting()
                        ),
                        crate::style::Style::Dim
                    )
                );
            }
        }
    }
    Ok(0)
}

/// Local wall-clock time as `HH:MM:SS`, from libc (no date crate for one field).
fn chrono_free_time() -> String {
    // SAFETY: time(NULL) and localtime_r with valid pointers to local plain-data values.
    unsafe {
        let now = libc::time(std::ptr::null_mut());
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&now, &mut tm).is_null() {
            return String::new();
        }
        format!("{:02}:{:02}:{:02}", tm.tm_hour, tm.tm_min, tm.tm_sec)
    }
}

/// What the interactive view remembers between frames.
struct View {
    sort: SortKey,
    reverse: bool,
    all: bool,
    listing: Listing,
    table: TableState,
    /// Pid of the selected process, kept across refreshes as rows move.
    selected: Option<u32>,
    message: String,
    color: bool,
    /// The breakdown shown under the table for the selected process.
    pane: Pane,
    /// The groups the listed processes count in, per device.
    groups: Vec<GroupRow>,
    /// NVML, opened once for the session, or why it cannot be.
    nvml: Result<Nvml, String>,
    /// NVML's view at the last refresh ([`nvml_lines`]).
    nvml_lines: Vec<String>,
}

/// What the pane under the table shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pane {
    Nothing,
    /// Who asked, by module and device (`m`).
    Modules,
    /// Which lines of Python asked (`w`).
    Sites,
}

impl Pane {
    /// `self` after the key of `pane`: that pane, or nothing when it is the one shown.
    fn toggled(self, pane: Pane) -> Pane {
        if self == pane {
            Pane::Nothing
        } else {
            pane
        }
    }

    fn of(args: &TopArgs) -> Pane {
        match (args.by_module, args.by_site) {
            (true, _) => Pane::Modules,
            (false, true) => Pane::Sites,
            (false, false) => Pane::Nothing,
        }
    }
}

impl View {
    fn refresh(&mut self) {
        match gather(&[], self.all) {
            Ok(mut listing) => {
                sort(&mut listing.processes, self.sort, self.reverse);
                self.groups = crate::groups::rows_of(&listing.processes);
                self.nvml_lines = nvml_lines(&self.nvml, &listing);
                self.listing = listing;
            }
            Err(e) => self.message = format!("{e:#}"),
        }
        let pids: Vec<u32> = self.listing.processes.iter().map(|s| s.pid).collect();
        let index = self
            .selected
            .and_then(|p| pids.iter().position(|&q| q == p))
            .or((!pids.is_empty()).then_some(0));
        self.selected = index.map(|i| pids[i]);
        // Rows are per device: select the first row of the selected process.
        let row = index.map(|i| {
            self.listing.processes[..i]
                .iter()
                .map(|s| s.devices.len().max(1))
                .sum()
        });
        self.table.select(row);
    }

    fn move_selection(&mut self, by: isize) {
        let pids: Vec<u32> = self.listing.processes.iter().map(|s| s.pid).collect();
        if pids.is_empty() {
            return;
        }
        let i = self
            .selected
            .and_then(|p| pids.iter().position(|&q| q == p))
            .unwrap_or(0) as isize;
        let i = (i + by).clamp(0, pids.len() as isize - 1) as usize;
        self.selected = Some(pids[i]);
    }

    fn style(&self, fg: Color) -> TuiStyle {
        if self.color {
            TuiStyle::default().fg(fg)
        } else {
            TuiStyle::default()
        }
    }

    fn selected_process(&self) -> Option<&Snapshot> {
        self.selected
            .and_then(|p| self.listing.processes.iter().find(|s| s.pid == p))
    }

    /// Rows of the selected process's breakdown by Python call site (`w`).
    fn site_rows(&self) -> Vec<Row<'static>> {
        let Some(s) = self.selected_process() else {
            return Vec::new();
        };
        s.by_site
            .iter()
            .flatten()
            .map(|site| {
                Row::new(vec![
                    Cell::from(s.pid.to_string()),
                    Cell::from(format_size(site.used)),
                    Cell::from(format_size(site.peak)).style(self.style(Color::Magenta)),
                    Cell::from(count(site.live_allocs)),
                    Cell::from(site.site.clone()).style(self.style(Color::Cyan)),
                ])
            })
            .collect()
    }

    /// Rows of the selected process's breakdown by module (`m`).
    fn module_rows(&self) -> Vec<Row<'static>> {
        let Some(s) = self.selected_process() else {
            return Vec::new();
        };
        s.devices
            .iter()
            .flat_map(|d| d.by_module.iter().map(move |m| (d.device, m)))
            .map(|(device, m)| {
                Row::new(vec![
                    Cell::from(s.pid.to_string()),
                    Cell::from(device.to_string()),
                    Cell::from(format_size(m.used)),
                    Cell::from(format_size(m.peak)).style(self.style(Color::Magenta)),
                    Cell::from(count(m.live_allocs)),
                    Cell::from(module_label(&m.module, &m.path)).style(self.style(Color::Cyan)),
                ])
            })
            .collect()
    }

    fn draw(&mut self, frame: &mut ratatui::Frame) {
        let pane = self.pane_table();
        let pane_height = pane.as_ref().map_or(0, |&(_, rows)| {
            (rows.max(1) as u16 + 2).min(frame.area().height / 2)
        });
        let groups_height = match self.groups.len() {
            0 => 0,
            n => (n as u16 + 2).min(frame.area().height / 3),
        };
        let nvml_height = (self.nvml_lines.len() as u16).min(frame.area().height / 3);
        let [head, nvml_area, body, groups_area, pane_area, foot] = Layout::vertical([
            Constraint::Length(1),
            Constraint::Length(nvml_height),
            Constraint::Min(1),
            Constraint::Length(groups_height),
            Constraint::Length(pane_height),
            Constraint::Length(1),
        ])
        .areas(frame.area());
        if let Some((table, _)) = pane {
            frame.render_widget(table, pane_area);
        }
        if let Some(table) = self.groups_table() {
            frame.render_widget(table, groups_area);
        }
        frame.render_widget(Paragraph::new(self.title()), head);
        let nvml: Vec<Line> = self
            .nvml_lines
            .iter()
            .map(|l| Line::raw(l.clone()))
            .collect();
        frame.render_widget(Paragraph::new(nvml), nvml_area);
        let rows = self.process_rows();
        if rows.is_empty() {
            let text = vec![Line::raw(""), Line::raw(nothing_message(&self.listing))];
            frame.render_widget(Paragraph::new(text), body);
        } else {
            let table = Table::new(rows, self.process_widths())
                .header(self.process_header())
                .column_spacing(2)
                .row_highlight_style(TuiStyle::default().add_modifier(Modifier::REVERSED));
            frame.render_stateful_widget(table, body, &mut self.table);
        }
        let help = if self.message.is_empty() {
            "q quit  s sort  r reverse  a idle  ↑↓ select  z reset peaks  m by module  w by site"
                .to_string()
        } else {
            self.message.clone()
        };
        frame.render_widget(
            Paragraph::new(Line::styled(help, self.style(Color::DarkGray))),
            foot,
        );
    }

    /// The open pane (`m`, `w`) as a table, with how many rows it has; `None` while none is open.
    fn pane_table(&self) -> Option<(Table<'static>, usize)> {
        let no_sites = format!(
            "(no Python call site recorded: run the program with {})",
            crate::attribution::stacks_setting()
        );
        let (headers, widths, mut rows, none): (&[&str], &[u16], _, String) = match self.pane {
            Pane::Nothing => return None,
            Pane::Modules => (
                &["PID", "DEV", "USED", "PEAK", "LIVE", "MODULE (who asked)"],
                &[8, 3, 10, 10, 9],
                self.module_rows(),
                "(no device memory attributed to the selected process)".to_string(),
            ),
            Pane::Sites => (
                &[
                    "PID",
                    "USED",
                    "PEAK",
                    "LIVE",
                    "PYTHON CALL SITE (innermost first)",
                ],
                &[8, 10, 10, 9],
                self.site_rows(),
                no_sites,
            ),
        };
        let count = rows.len();
        // The fixed columns, then the last one takes the rest of the width.
        let widths: Vec<Constraint> = widths
            .iter()
            .map(|&w| Constraint::Length(w))
            .chain([Constraint::Fill(1)])
            .collect();
        let header = Row::new(
            headers
                .iter()
                .map(|&h| Cell::from(h).style(TuiStyle::default().add_modifier(Modifier::BOLD))),
        );
        if rows.is_empty() {
            // In the last (widest) column: the others are too narrow for a sentence.
            let blanks = (1..headers.len()).map(|_| Cell::from(""));
            rows.push(Row::new(blanks.chain([Cell::from(none)])));
        }
        let table = Table::new(rows, widths)
            .header(header)
            .column_spacing(2)
            .block(ratatui::widgets::Block::default().borders(ratatui::widgets::Borders::TOP));
        Some((table, count))
    }

    /// The groups of the listed processes, one row per group and device; `None` when none.
    fn groups_table(&self) -> Option<Table<'static>> {
        if self.groups.is_empty() {
            return None;
        }
        let bold = TuiStyle::default().add_modifier(Modifier::BOLD);
        let header = Row::new(crate::groups::ROW_HEADERS.map(|h| Cell::from(h).style(bold)));
        let rows = self.groups.iter().map(|g| {
            let cells = crate::groups::row_cells(g);
            Row::new(cells.into_iter().enumerate().map(|(i, text)| {
                // The joint peak in the process table's peak colour.
                let style = if i == 4 {
                    self.style(Color::Magenta)
                } else {
                    TuiStyle::default()
                };
                Cell::from(text).style(style)
            }))
        });
        let widths = [16, 3, 7, 10, 10, 10].map(Constraint::Length);
        Some(
            Table::new(rows, widths)
                .header(header)
                .column_spacing(2)
                .block(ratatui::widgets::Block::default().borders(ratatui::widgets::Borders::TOP)),
        )
    }

    /// The first line: the name, the headline figures and the sort order.
    fn title(&self) -> Line<'static> {
        Line::from(vec![
            Span::styled(
                "gpumemhook top  ",
                TuiStyle::default().add_modifier(Modifier::BOLD),
            ),
            Span::raw(headline(&self.listing)),
            Span::styled(
                format!(
                    "  sorted by {}{}",
                    self.sort.name(),
                    if self.reverse { " (reversed)" } else { "" }
                ),
                self.style(Color::DarkGray),
            ),
        ])
    }

    /// The process table's header, the sort column underlined.
    fn process_header(&self) -> Row<'static> {
        let headers = [
            "PID", "DEV", "USED", "PEAK", "LIMIT", "%LIMIT", "ALLOCS", "DENIED", "SCOPES",
            "COMMAND",
        ];
        Row::new(headers.iter().map(|h| {
            let mut style = TuiStyle::default().add_modifier(Modifier::BOLD);
            if *h == self.sort.name() {
                style = style.add_modifier(Modifier::UNDERLINED);
            }
            Cell::from(*h).style(style)
        }))
    }

    /// One row per device of each process (one of dashes for a process with none).
    fn process_rows(&self) -> Vec<Row<'static>> {
        let mut rows = Vec::new();
        for s in &self.listing.processes {
            if s.devices.is_empty() {
                let dashes = (0..7).map(|_| Cell::from("-"));
                rows.push(Row::new(
                    std::iter::once(Cell::from(s.pid.to_string()))
                        .chain(dashes)
                        .chain([
                            Cell::from(scopes_cell(s, None)),
                            Cell::from(command_cell(s)),
                        ]),
                ));
                continue;
            }
            for (i, d) in s.devices.iter().enumerate() {
                rows.push(self.device_row(s, i == 0, d));
            }
        }
        rows
    }

    /// The row of device `d` of process `s`; the pid and command on its `first` row only.
    fn device_row(&self, s: &Snapshot, first: bool, d: &DeviceStats) -> Row<'static> {
        let share = d.limit.map(|l| d.used as f64 / l.max(1) as f64);
        let share_style = match share {
            Some(x) if x >= 0.9 => self.style(Color::Red),
            Some(x) if x >= 0.7 => self.style(Color::Yellow),
            _ => TuiStyle::default(),
        };
        let first_only = |text: String| if first { text } else { String::new() };
        Row::new(vec![
            Cell::from(first_only(s.pid.to_string())),
            Cell::from(d.device.to_string()),
            Cell::from(format_size(d.used)),
            Cell::from(format_size(d.peak)).style(self.style(Color::Magenta)),
            Cell::from(size_or_dash(d.limit)),
            Cell::from(share.map_or("-".to_string(), |x| format!("{:.0}%", x * 100.0)))
                .style(share_style),
            Cell::from(count(d.allocs)),
            Cell::from(count(d.denied)).style(if d.denied > 0 {
                self.style(Color::Red)
            } else {
                TuiStyle::default()
            }),
            Cell::from(scopes_cell(s, Some(d.device))).style(self.style(Color::Cyan)),
            Cell::from(first_only(command_cell(s))),
        ])
    }

    /// The process table's column widths: scopes take the room their names need (up to a limit),
    /// the command the rest.
    fn process_widths(&self) -> [Constraint; 10] {
        let scopes_width = self
            .listing
            .processes
            .iter()
            .flat_map(|s| {
                let per_device = s.devices.iter().map(|d| scopes_cell(s, Some(d.device)));
                per_device.chain(std::iter::once(scopes_cell(s, None)))
            })
            .map(|c| c.chars().count())
            .fold("SCOPES".len(), usize::max)
            .min(48) as u16;
        [
            Constraint::Length(8),
            Constraint::Length(3),
            Constraint::Length(10),
            Constraint::Length(10),
            Constraint::Length(10),
            Constraint::Length(6),
            Constraint::Length(9),
            Constraint::Length(6),
            Constraint::Length(scopes_width),
            Constraint::Fill(1),
        ]
    }
}

fn interactive(args: &TopArgs, painter: Painter) -> Result<i32> {
    let interval = Duration::from_secs_f64(args.interval.max(0.05));
    let mut view = View {
        sort: args.sort,
        reverse: false,
        all: args.all,
        listing: Listing {
            processes: Vec::new(),
            idle_hidden: Vec::new(),
            skipped: Vec::new(),
        },
        table: TableState::default(),
        selected: None,
        message: String::new(),
        color: painter.color,
        pane: Pane::of(args),
        groups: Vec::new(),
        nvml: Nvml::open("top"),
        nvml_lines: Vec::new(),
    };
    let mut terminal = ratatui::try_init()?;
    let outcome = (|| -> Result<()> {
        let mut next = Instant::now();
        loop {
            if Instant::now() >= next {
                view.refresh();
                next = Instant::now() + interval;
            }
            terminal.draw(|f| view.draw(f))?;
            let wait = next.saturating_duration_since(Instant::now());
            if !event::poll(wait)? {
                continue;
            }
            let Event::Key(key) = event::read()? else {
                continue;
            };
            if key.kind != KeyEventKind::Press {
                continue;
            }
            view.message.clear();
            let ctrl_c =
                key.code == KeyCode::Char('c') && key.modifiers.contains(KeyModifiers::CONTROL);
            match key.code {
                _ if ctrl_c => return Ok(()),
                KeyCode::Char('q') | KeyCode::Esc => return Ok(()),
                KeyCode::Char('s') | KeyCode::Tab => view.sort = view.sort.next(),
                KeyCode::Char('r') => view.reverse = !view.reverse,
                KeyCode::Char('u') => view.sort = SortKey::Used,
                KeyCode::Char('p') => view.sort = SortKey::Peak,
                KeyCode::Char('l') => view.sort = SortKey::Limit,
                KeyCode::Char('i') => view.sort = SortKey::Pid,
                KeyCode::Char('c') => view.sort = SortKey::Command,
                KeyCode::Char('a') => view.all = !view.all,
                KeyCode::Char('m') => view.pane = view.pane.toggled(Pane::Modules),
                KeyCode::Char('w') => view.pane = view.pane.toggled(Pane::Sites),
                KeyCode::Up | KeyCode::Char('k') => view.move_selection(-1),
                KeyCode::Down | KeyCode::Char('j') => view.move_selection(1),
                KeyCode::Char('z') => {
                    if let Some(pid) = view.selected {
                        view.message = match crate::processes::attach(pid)
                            .and_then(|p| p.reset_peak(None).map_err(Into::into))
                        {
                            Ok(()) => format!("peaks of process {pid} reset to what it uses now"),
                            Err(e) => format!("{e:#}"),
                        };
                    }
                }
                _ => continue,
            }
            // Show the effect of a key at once, not at the next refresh.
            next = Instant::now();
        }
    })();
    ratatui::restore();
    outcome.map(|()| 0)
}

pub fn top(args: TopArgs, painter: Painter) -> Result<i32> {
    if !(args.interval.is_finite() && args.interval > 0.0) {
        return Err(crate::usage::UsageError(
            "--interval must be a positive number of seconds".into(),
        )
        .into());
    }
    if args.iterations == Some(0) {
        return Err(crate::usage::UsageError(
            "-n 0: the number of frames must be at least 1 (--once prints one)".into(),
        )
        .into());
    }
    let frames = if args.once { Some(1) } else { args.iterations };
    match frames {
        Some(n) => batch(&args, n, painter),
        None if !std::io::stdout().is_terminal() => batch(&args, u64::MAX, painter),
        None => interactive(&args, painter),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpumemhook_reader::DeviceStats;

    fn snap(pid: u32, used: u64, peak: u64, command: &str) -> Snapshot {
        Snapshot {
            pid,
            command: command.into(),
            devices: vec![DeviceStats {
                used,
                peak,
                ..DeviceStats::default()
            }],
            ..Snapshot::default()
        }
    }

    #[test]
    fn sorting() {
        let mut v = vec![
            snap(1, 10, 50, "b"),
            snap(2, 30, 40, "a"),
            snap(3, 20, 60, "c"),
        ];
        let pids = |v: &[Snapshot]| v.iter().map(|s| s.pid).collect::<Vec<_>>();
        sort(&mut v, SortKey::Used, false);
        assert_eq!(pids(&v), [2, 3, 1]);
        sort(&mut v, SortKey::Peak, false);
        assert_eq!(pids(&v), [3, 1, 2]);
        sort(&mut v, SortKey::Command, false);
        assert_eq!(pids(&v), [2, 1, 3]);
        sort(&mut v, SortKey::Pid, true);
        assert_eq!(pids(&v), [3, 2, 1]);
    }

    /// Draws a view of `processes` on a test terminal of `width` × `height`; returns the screen.
    fn draw_view(
        processes: Vec<Snapshot>,
        groups: Vec<GroupRow>,
        idle_hidden: Vec<u32>,
        selected: Option<u32>,
        pane: Pane,
        nvml_lines: Vec<String>,
        (width, height): (u16, u16),
    ) -> String {
        let backend = ratatui::backend::TestBackend::new(width, height);
        let mut terminal = ratatui::Terminal::new(backend).unwrap();
        let mut view = View {
            sort: SortKey::Used,
            reverse: false,
            all: false,
            listing: Listing {
                processes,
                idle_hidden,
                skipped: Vec::new(),
            },
            table: TableState::default(),
            selected,
            message: String::new(),
            color: false,
            pane,
            groups,
            nvml: Err("not opened in unit tests".into()),
            nvml_lines,
        };
        terminal.draw(|f| view.draw(f)).unwrap();
        terminal
            .backend()
            .buffer()
            .content()
            .iter()
            .map(|c| c.symbol())
            .collect()
    }

    #[test]
    fn the_m_key_pane_shows_the_selected_process_breakdown() {
        let mut s = snap(4242, 3 << 30, 6 << 30, "python train.py");
        s.devices[0].by_module = vec![gpumemhook_reader::ModuleStats {
            module: "libc10_cuda.so".into(),
            path: "/site-packages/torch/lib/libc10_cuda.so".into(),
            used: 3 << 30,
            peak: 6 << 30,
            live_allocs: 7,
        }];
        let screen = draw_view(
            vec![s],
            Vec::new(),
            Vec::new(),
            Some(4242),
            Pane::Modules,
            Vec::new(),
            (120, 14),
        );
        for want in ["MODULE (who asked)", "libc10_cuda.so", "m by module"] {
            assert!(screen.contains(want), "{want:?} missing from:\n{screen}");
        }
    }

    #[test]
    fn the_w_key_pane_shows_the_selected_process_python_lines() {
        let mut s = snap(4242, 3 << 30, 6 << 30, "python train.py");
        let screen = draw_view(
            vec![s.clone()],
            Vec::new(),
            Vec::new(),
            Some(4242),
            Pane::Sites,
            Vec::new(),
            (140, 14),
        );
        assert!(screen.contains("no Python call site recorded"), "{screen}");
        s.by_site = Some(vec![gpumemhook_reader::SiteStats {
            site: "train.py:42 in step < train.py:80 in main".into(),
            used: 3 << 30,
            peak: 5 << 30,
            live_allocs: 12,
        }]);
        let screen = draw_view(
            vec![s],
            Vec::new(),
            Vec::new(),
            Some(4242),
            Pane::Sites,
            Vec::new(),
            (140, 14),
        );
        for want in [
            "PYTHON CALL SITE",
            "train.py:42 in step < train.py:80 in main",
            "5.00 GiB",
            "w by site",
        ] {
            assert!(screen.contains(want), "{want:?} missing from:\n{screen}");
        }
        assert_eq!(Pane::Sites.toggled(Pane::Sites), Pane::Nothing);
        assert_eq!(Pane::Modules.toggled(Pane::Sites), Pane::Sites);
    }

    #[test]
    fn the_live_view_draws_rows_and_headline() {
        let processes = vec![snap(4242, 3 << 30, 6 << 30, "python train.py")];
        let screen = draw_view(
            processes,
            Vec::new(),
            vec![4243],
            None,
            Pane::Nothing,
            Vec::new(),
            (140, 8),
        );
        for want in [
            "1 process, 3.00 GiB used now",
            "4242",
            "6.00 GiB",
            "python train.py",
            "q quit",
        ] {
            assert!(screen.contains(want), "{want:?} missing from:\n{screen}");
        }
    }

    #[test]
    fn the_live_view_shows_each_groups_joint_peak() {
        let processes = vec![snap(4242, 1 << 30, 2 << 30, "python a.py")];
        let group = GroupRow {
            name: "job".into(),
            device: 0,
            stats: gpumemhook_reader::GroupStats {
                used: 3 << 30,
                peak: 5 << 30,
                limit: Some(8 << 30),
                members: vec![gpumemhook_reader::MemberStats::default(); 2],
                ..Default::default()
            },
        };
        let screen = draw_view(
            processes,
            vec![group],
            Vec::new(),
            None,
            Pane::Nothing,
            Vec::new(),
            (140, 12),
        );
        for want in [
            "GROUP", "MEMBERS", "job", "3.00 GiB", "5.00 GiB", "8.00 GiB",
        ] {
            assert!(screen.contains(want), "{want:?} missing from:\n{screen}");
        }
    }

    /// The live view shows NVML's lines (a device's figures, a process outside the hook) between
    /// the title and the process table.
    #[test]
    fn the_live_view_shows_nvmls_lines_under_the_title() {
        let lines = vec![
            "device 0 (NVML): 80.00 GiB total, 9.00 GiB used by all, 71.00 GiB free, utilisation 37%"
                .to_string(),
            "  pid 4242       6.00 GiB  (not hooked)  python other.py".to_string(),
        ];
        let processes = vec![snap(7, 3 << 30, 3 << 30, "python train.py")];
        let screen = draw_view(
            processes,
            Vec::new(),
            Vec::new(),
            None,
            Pane::Nothing,
            lines.clone(),
            (140, 10),
        );
        let rows: Vec<String> = screen
            .as_bytes()
            .chunks(140)
            .map(|r| String::from_utf8_lossy(r).trim_end().to_string())
            .collect();
        assert!(rows[0].starts_with("gpumemhook top"), "{rows:#?}");
        assert_eq!(rows[1..3], lines, "{rows:#?}");
        assert!(rows[3].trim_start().starts_with("PID"), "{rows:#?}");
    }
}
