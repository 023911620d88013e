//! Tests of the `gpumemhook` command (being written).
