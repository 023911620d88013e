//! gpumemhook benchmarks (being written).
