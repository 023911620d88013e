//! Terminal output: colour (only on a terminal, never with `NO_COLOR`), and aligned text tables.
//!
//! Colour is decided once per stream, so a pipe (`gpumemhook ls | grep`) or a file gets plain text
//! with no escape codes, while the same command on a terminal is easier to scan.

use std::io::IsTerminal;

/// `--color` as given on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ColorChoice {
    /// Colour when the output is a terminal and `NO_COLOR` is unset.
    Auto,
    /// Colour even into a pipe or a file.
    Always,
    /// No colour at all.
    Never,
}

/// Whether a stream gets colour.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Painter {
    pub color: bool,
}

impl Painter {
    /// For stdout (`stderr == false`) or stderr.
    pub fn new(choice: ColorChoice, stderr: bool) -> Painter {
        let color = match choice {
            ColorChoice::Always => true,
            ColorChoice::Never => false,
            ColorChoice::Auto => {
                // The NO_COLOR convention: any non-empty value turns colour off.
                let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
                let terminal = if stderr {
                    std::io::stderr().is_terminal()
                } else {
                    std::io::stdout().is_terminal()
                };
                terminal && !no_color
            }
        };
        Painter { color }
    }

    pub fn paint(&self, text: &str, style: Style) -> String {
        if !self.color || style == Style::Plain || text.is_empty() {
            return text.to_string();
        }
        format!("\x1b[{}m{text}\x1b[0m", style.sgr())
    }
}

/// The few styles the CLI uses, by meaning rather than by colour.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Style {
    Plain,
    /// Column headings and titles.
    Heading,
    /// Less important figures (zeroes, "-").
    Dim,
    /// Peaks: the figure people came for.
    Peak,
    /// Something went wrong.
    Bad,
    /// Close to a ceiling.
    Warn,
    /// Names (commands, scopes).
    Name,
}

impl Style {
    fn sgr(self) -> &'static str {
        match self {
            Style::Plain => "0",
            Style::Heading => "1",
            Style::Dim => "2",
            Style::Peak => "1;35",
            Style::Bad => "1;31",
            Style::Warn => "33",
            Style::Name => "36",
        }
    }
}

/// A cell: text and how to show it.
#[derive(Clone, Debug)]
pub struct Cell {
    pub text: String,
    pub style: Style,
    pub right: bool,
}

impl Cell {
    pub fn left(text: impl Into<String>) -> Cell {
        Cell {
            text: text.into(),
            style: Style::Plain,
            right: false,
        }
    }

    pub fn right(text: impl Into<String>) -> Cell {
        Cell {
            text: text.into(),
            style: Style::Plain,
            right: true,
        }
    }

    pub fn styled(mut self, style: Style) -> Cell {
        self.style = style;
        self
    }
}

/// A table printed with columns aligned on the widest cell (widths counted in characters, before
/// any escape codes are added, so colour never breaks the alignment).
#[derive(Clone, Debug, Default)]
pub struct Table {
    pub header: Vec<Cell>,
    pub rows: Vec<Vec<Cell>>,
    /// Spaces before each line.
    pub indent: usize,
}

impl Table {
    pub fn new(header: &[(&str, bool)]) -> Table {
        Table {
            header: header
                .iter()
                .map(|&(h, right)| Cell {
                    text: h.to_string(),
                    style: Style::Heading,
                    right,
                })
                .collect(),
            rows: Vec::new(),
            indent: 0,
        }
    }

    pub fn indent(mut self, n: usize) -> Table {
        self.indent = n;
        self
    }

    pub fn push(&mut self, row: Vec<Cell>) {
        self.rows.push(row);
    }

    pub fn render(&self, painter: Painter) -> String {
        let columns = self.header.len();
        let mut widths = vec![0usize; columns];
        for row in std::iter::once(&self.header).chain(&self.rows) {
            for (i, cell) in row.iter().enumerate().take(columns) {
                widths[i] = widths[i].max(cell.text.chars().count());
            }
        }
        let mut out = String::new();
        for row in std::iter::once(&self.header).chain(&self.rows) {
            let mut line = " ".repeat(self.indent);
            for (i, cell) in row.iter().enumerate().take(columns) {
                let pad = widths[i] - cell.text.chars().count();
                // The header's alignment decides the column's, so headings sit over their figures.
                let right = self.header[i].right;
                let last = i + 1 == columns;
                if right {
                    line.push_str(&" ".repeat(pad));
                }
                line.push_str(&painter.paint(&cell.text, cell.style));
                if !right && !last {
                    line.push_str(&" ".repeat(pad));
                }
                if !last {
                    line.push_str("  ");
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// `1234567` as `1,234,567`: counts of allocations get large.
pub fn count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A count with its noun in the right number: `1 allocation`, `4,431 allocations`, `0 frees`.
pub fn counted(n: u64, one: &str, many: &str) -> String {
    format!("{} {}", count(n), if n == 1 { one } else { many })
}

/// A size, or `-` for none.
pub fn size_or_dash(bytes: Option<u64>) -> String {
    bytes.map_or_else(|| "-".to_string(), gpumemhook_reader::format_size)
}

/// Seconds for people: `40 µs`, `850 ms`, `12.4 s`, `3 min 05 s`, `2 h 01 min`.
pub fn duration(seconds: f64) -> String {
    if seconds < 0.001 {
        format!("{:.0} µs", seconds * 1e6)
    } else if seconds < 1.0 {
        format!("{:.0} ms", seconds * 1000.0)
    } else if seconds < 60.0 {
        format!("{seconds:.1} s")
    } else if seconds < 3600.0 {
        let s = seconds.round() as u64;
        format!("{} min {:02} s", s / 60, s % 60)
    } else {
        let m = (seconds / 60.0).round() as u64;
        format!("{} h {:02} min", m / 60, m % 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_durations() {
        assert_eq!(count(0), "0");
        assert_eq!(count(999), "999");
        assert_eq!(count(1000), "1,000");
        assert_eq!(count(1234567), "1,234,567");
        assert_eq!(duration(0.25), "250 ms");
        assert_eq!(duration(12.44), "12.4 s");
        assert_eq!(duration(185.0), "3 min 05 s");
    }

    #[test]
    fn tables_align_without_counting_escape_codes() {
        let mut t = Table::new(&[("NAME", false), ("SIZE", true)]);
        t.push(vec![
            Cell::left("a"),
            Cell::right("1 B").styled(Style::Peak),
        ]);
        t.push(vec![Cell::left("long name"), Cell::right("10.00 GiB")]);
        let plain = t.render(Painter { color: false });
        assert_eq!(
            plain,
            "NAME            SIZE\na                1 B\nlong name  10.00 GiB\n"
        );
        let coloured = t.render(Painter { color: true });
        assert!(coloured.contains("\x1b[1;35m1 B\x1b[0m"));
        let strip = |s: &str| {
            s.replace("\x1b[1;35m", "")
                .replace("\x1b[1m", "")
                .replace("\x1b[0m", "")
        };
        assert_eq!(strip(&coloured), plain);
    }
}
