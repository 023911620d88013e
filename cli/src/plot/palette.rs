//! The plot's colours: one per device, the ceiling's, failed allocations', the scopes', and the ink,
//! muted text and grid lines.

use crate::canvas::Rgba;

/// Line colours of devices 0, 1, ... (the usual ten-colour palette, minus red, kept for ceilings).
const DEVICE_COLORS: [u32; 8] = [
    0x1f77b4, 0xff7f0e, 0x2ca02c, 0x9467bd, 0x8c564b, 0xe377c2, 0x17becf, 0xbcbd22,
];
pub(super) const LIMIT_COLOR: Rgba = Rgba::rgb(0xd62728);
/// Allocations the driver failed (refusals by the ceiling take the ceiling's colour).
pub(super) const FAILED_COLOR: Rgba = Rgba::rgb(0x7b2d8e);
pub(super) const SCOPE_COLORS: [u32; 5] = [0xe6a000, 0x3a9a9a, 0x9a6ac8, 0x6a9a3a, 0xc86a8a];
pub(super) const INK: Rgba = Rgba::rgb(0x222222);
pub(super) const MUTED: Rgba = Rgba::rgb(0x666666);
pub(super) const GRID: Rgba = Rgba::rgb(0xe4e4e4);

pub(super) fn device_color(device: u32) -> Rgba {
    Rgba::rgb(DEVICE_COLORS[device as usize % DEVICE_COLORS.len()])
}
