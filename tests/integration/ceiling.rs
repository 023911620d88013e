//! The allocation ceiling.
