//! The `gpumemhook` command (being written).

fn main() {}
