//! `gpumemhook cards`: the cards `--emulate` and `GPUMEMHOOK_EMULATE` know, from the reader's one
//! table (`gpumemhook_reader::CARDS`).

use anyhow::Result;
use gpumemhook_reader::{Basis, CARDS};

use crate::style::{Cell, Painter, Style, Table};

#[derive(clap::Args, Debug)]
#[command(after_help = "\
Examples:
  gpumemhook cards
  gpumemhook cards --json | jq -r '.[] | select(.total >= 16e9) | .name'
  gpumemhook run --emulate t4 -- python train.py     # behave like a T4, context included
  GPUMEMHOOK_EMULATE=a100-40gb python train.py      # the same, with the hook already preloaded

A size (12GiB) is accepted wherever a card name is. docs/emulation.md says where each figure comes
from and what emulation cannot model (bandwidth, speed, compute capability).

JSON: [{\"name\", \"total\" (bytes), \"source\" (nvidia-smi or nominal), \"aliases\", \"full_name\"}, ...].")]
pub struct CardsArgs {
    /// Print JSON (the total in bytes) instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Where a card's total comes from, as the table's SOURCE column and the JSON's `source` say it.
fn source(basis: Basis) -> &'static str {
    match basis {
        Basis::NvidiaSmi => "nvidia-smi",
        Basis::Nominal => "nominal",
    }
}

/// Prints the presets, smallest first.
pub fn cards(args: CardsArgs, painter: Painter) -> Result<i32> {
    if args.json {
        let list: Vec<serde_json::Value> = CARDS
            .iter()
            .map(|c| {
                serde_json::json!({
                    "name": c.name,
                    "total": c.total_bytes(),
                    "source": source(c.basis),
                    "aliases": c.aliases,
                    "full_name": c.full_name,
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(0);
    }
    let mut t = Table::new(&[
        ("CARD", false),
        ("TOTAL", true),
        ("SOURCE", false),
        ("ALSO", false),
        ("NAME", false),
    ]);
    for c in CARDS {
        t.push(vec![
            Cell::left(c.name).styled(Style::Name),
            Cell::right(format!("{} MiB", c.total_mib)),
            Cell::left(source(c.basis)).styled(match c.basis {
                Basis::NvidiaSmi => Style::Plain,
                Basis::Nominal => Style::Dim,
            }),
            Cell::left(c.aliases.join(", ")).styled(Style::Dim),
            Cell::left(c.full_name),
        ]);
    }
    print!("{}", t.render(painter));
    Ok(0)
}
