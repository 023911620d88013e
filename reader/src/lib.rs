//! gpumemhook's reader: the one definition of the shared-memory segment the hook writes, and the API
//! to read it, from the process itself or from another one.
//!
//! Modules: [`layout`] (the segment and its atomic operations), [`shm`] (segment files),
//! [`snapshot`] (plain-data copies, also the exit report format), [`size`] (parsing and printing
//! sizes), [`process`] (process identity from `/proc`), [`error`] (typed errors).

pub mod error;
pub mod layout;
pub mod process;
pub mod shm;
pub mod size;
pub mod snapshot;

pub use error::{Error, Result};
pub use layout::{MemKind, Segment, MAX_DEVICES, MAX_SCOPES};
pub use size::{format_size, parse_size};
pub use snapshot::{DeviceStats, HostStats, ScopeStats, Snapshot};
