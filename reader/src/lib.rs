//! gpumemhook's reader: the one definition of the shared-memory segment the hook writes, and the API
//! to read it, from the process itself or from another one.
//!
//! Start with [`Process`]: [`Process::current`] for this process, [`Process::attach`] for another,
//! [`list_processes`] for all of this user's; then [`Process::snapshot`], [`Process::used`],
//! [`Process::peak`], [`Process::open_scope`], [`Process::set_limit`].
//!
//! Modules: [`attach`] (that API), [`layout`] (the segment and its atomic operations), [`shm`] (segment files),
//! [`snapshot`] (plain-data copies, also the exit report format), [`cards`] (the cards that can be
//! emulated), [`size`] (parsing and printing
//! sizes), [`process`] (process identity from `/proc`), [`error`] (typed errors).

pub mod attach;
pub mod cards;
pub mod error;
pub mod layout;
pub mod process;
pub mod shm;
pub mod size;
pub mod snapshot;
pub mod trace;

pub use attach::{list_processes, Process, ProcessEntry, Scope, ScopeReading};
pub use error::{Error, Result};
pub use layout::{MemKind, Segment, MAX_DEVICES, MAX_SCOPES};
pub use size::{check_limit, format_size, parse_size, MAX_SIZE};
pub use snapshot::{DeviceStats, EmulatedStats, HostStats, ScopeStats, Snapshot};
