//! The cards gpumemhook can emulate (`GPUMEMHOOK_EMULATE`, `gpumemhook run --emulate`,
//! `gpumemhook cards`): the one home of each card's memory figure, shared by the hook, the CLI and
//! the Python package.
//!
//! Each figure is the total memory, in MiB, that `nvidia-smi` prints for the card; `docs/emulation.md`
//! says where each comes from and which ones are only the nominal size.

use crate::size::{format_size, parse_size, SizeError};
use std::fmt;

/// Where a preset's figure comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Basis {
    /// The total `nvidia-smi` prints on that card, as commonly published for it.
    NvidiaSmi,
    /// Only the nominal size is known: the card's GB taken as GiB (slightly generous: `nvidia-smi`
    /// shows a little less on every card whose figure we know).
    Nominal,
}

/// One card that can be emulated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Card {
    /// The preset name people type (lower case; matching ignores case, spaces, `-` and `_`).
    pub name: &'static str,
    /// Other accepted names.
    pub aliases: &'static [&'static str],
    /// What NVIDIA calls it.
    pub full_name: &'static str,
    /// Total memory as `nvidia-smi` shows it, in MiB.
    pub total_mib: u64,
    pub basis: Basis,
}

impl Card {
    /// Total memory in bytes.
    pub const fn total_bytes(&self) -> u64 {
        self.total_mib << 20
    }
}

const fn card(
    name: &'static str,
    aliases: &'static [&'static str],
    full_name: &'static str,
    total_mib: u64,
    basis: Basis,
) -> Card {
    Card {
        name,
        aliases,
        full_name,
        total_mib,
        basis,
    }
}

use Basis::{Nominal, NvidiaSmi};

/// Every preset, smallest first. Its index (plus one) is what the segment stores as the card.
#[rustfmt::skip]
pub const CARDS: &[Card] = &[
    card("rtx4060", &["4060"], "GeForce RTX 4060 (8 GB)", 8188, NvidiaSmi),
    card("rtx3050", &["3050"], "GeForce RTX 3050 (8 GB)", 8192, Nominal),
    card("rtx3070", &["3070"], "GeForce RTX 3070 (8 GB)", 8192, NvidiaSmi),
    card("rtx3080", &["3080"], "GeForce RTX 3080 (10 GB)", 10240, NvidiaSmi),
    card("rtx4070", &["4070"], "GeForce RTX 4070 (12 GB)", 12282, NvidiaSmi),
    card("rtx3060", &["3060"], "GeForce RTX 3060 (12 GB)", 12288, NvidiaSmi),
    card("t4", &["tesla-t4"], "T4 (16 GB)", 15360, NvidiaSmi),
    card("rtx4080", &["4080"], "GeForce RTX 4080 (16 GB)", 16376, NvidiaSmi),
    card("v100", &["v100-16gb"], "V100 (16 GB)", 16384, Nominal),
    card("a10g", &[], "A10G (24 GB)", 23028, NvidiaSmi),
    card("l4", &[], "L4 (24 GB)", 23034, NvidiaSmi),
    card("rtx4090", &["4090"], "GeForce RTX 4090 (24 GB)", 24564, NvidiaSmi),
    card("rtx3090", &["3090"], "GeForce RTX 3090 (24 GB)", 24576, NvidiaSmi),
    card("a100-40gb", &["a100-40", "a100"], "A100 (40 GB)", 40960, NvidiaSmi),
    card("l40s", &[], "L40S (48 GB)", 46068, NvidiaSmi),
    card("a6000", &["rtx-a6000"], "RTX A6000 (48 GB)", 49140, NvidiaSmi),
    card("h100", &["h100-80gb"], "H100 (80 GB HBM3)", 81559, NvidiaSmi),
    card("a100-80gb", &["a100-80"], "A100 (80 GB)", 81920, NvidiaSmi),
];

/// The card looked up by name: case, spaces, `-` and `_` are ignored, and a leading `nvidia`,
/// `geforce` or `tesla` too (`"NVIDIA A100-40GB"`, `"rtx_3090"`, `"T4"`).
pub fn find_card(name: &str) -> Option<(usize, &'static Card)> {
    let key = normalise(name);
    let key = ["nvidia", "geforce", "tesla"]
        .iter()
        .fold(key.as_str(), |k, prefix| {
            k.strip_prefix(prefix).unwrap_or(k)
        })
        .to_string();
    CARDS
        .iter()
        .enumerate()
        .find(|(_, c)| normalise(c.name) == key || c.aliases.iter().any(|a| normalise(a) == key))
}

fn normalise(name: &str) -> String {
    name.chars()
        .filter(|c| !matches!(c, ' ' | '-' | '_'))
        .flat_map(char::to_lowercase)
        .collect()
}

/// What `GPUMEMHOOK_EMULATE` asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Emulation {
    /// The preset, `None` for a bare size.
    pub card: Option<&'static Card>,
    /// Index in [`CARDS`] plus one, 0 for a bare size: what the segment stores.
    pub card_code: u32,
    /// The emulated card's total memory in bytes.
    pub total: u64,
}

impl Emulation {
    /// The card's name for people: the preset name, or the size (`"12.00 GiB"`).
    pub fn label(&self) -> String {
        card_label(self.card_code, self.total)
    }
}

/// The name of an emulated card as stored in a segment: the preset for `card_code` (index + 1), or
/// the size when it is 0 (or unknown to this release).
pub fn card_label(card_code: u32, total: u64) -> String {
    match (card_code as usize)
        .checked_sub(1)
        .and_then(|i| CARDS.get(i))
    {
        Some(c) => c.name.to_string(),
        None => format_size(total),
    }
}

/// Why an emulation value was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmulateError {
    pub input: String,
    /// Set when the input was a bare number (`12`): the size's own one-line fix is the message.
    pub missing_unit: Option<SizeError>,
}

impl fmt::Display for EmulateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(e) = &self.missing_unit {
            return e.fmt(f);
        }
        write!(
            f,
            "{:?} is neither a known card nor a positive size (as in 12GiB); cards: {}",
            self.input,
            card_names().join(", ")
        )
    }
}

impl std::error::Error for EmulateError {}

/// Every preset name, in table order.
pub fn card_names() -> Vec<&'static str> {
    CARDS.iter().map(|c| c.name).collect()
}

/// Reads a card name or a size (`t4`, `A100-80GB`, `12GiB`). A size must be positive.
pub fn parse_card(input: &str) -> Result<Emulation, EmulateError> {
    if let Some((index, card)) = find_card(input) {
        return Ok(Emulation {
            card: Some(card),
            card_code: index as u32 + 1,
            total: card.total_bytes(),
        });
    }
    match parse_size(input) {
        Ok(total) => Ok(Emulation {
            card: None,
            card_code: 0,
            total,
        }),
        Err(e) => Err(EmulateError {
            input: input.to_string(),
            missing_unit: e.is_missing_unit().then_some(e),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_loosely_and_sizes_are_accepted() {
        let t4 = parse_card("T4").unwrap();
        assert_eq!((t4.total, t4.card_code), (15360 << 20, 7));
        assert_eq!(t4.label(), "t4");
        for spelling in ["NVIDIA A100-80GB", "a100_80gb", "A100 80GB", "a100-80"] {
            assert_eq!(
                parse_card(spelling).unwrap().card.unwrap().name,
                "a100-80gb"
            );
        }
        assert_eq!(parse_card("GeForce RTX 3090").unwrap().total, 24576 << 20);
        let sized = parse_card("12GiB").unwrap();
        assert_eq!(
            (sized.card, sized.card_code, sized.total),
            (None, 0, 12 << 30)
        );
        assert_eq!(sized.label(), "12.00 GiB");
    }

    #[test]
    fn unknown_names_and_zero_are_refused_listing_the_cards() {
        for bad in ["t5", "0", "0GiB", "", "-1G", "biggest"] {
            let e = parse_card(bad).unwrap_err().to_string();
            assert!(e.contains("t4") && e.contains("a100-80gb"), "{e}");
        }
        // A bare number is a size without its unit: the size's one-line fix, not the card list.
        assert_eq!(
            parse_card("12").unwrap_err().to_string(),
            "12 what? write 12GiB, or 12B for bytes"
        );
    }

    #[test]
    fn the_table_is_consistent() {
        let mut seen = std::collections::HashSet::new();
        for c in CARDS {
            assert!(c.total_mib >= 1024, "{}", c.name);
            for n in std::iter::once(c.name).chain(c.aliases.iter().copied()) {
                assert!(seen.insert(normalise(n)), "{n} names two cards");
                assert_eq!(find_card(n).unwrap().1, c, "{n}");
            }
        }
        // Smallest first, as `gpumemhook cards` lists them.
        assert!(CARDS.windows(2).all(|w| w[0].total_mib <= w[1].total_mib));
    }
}
