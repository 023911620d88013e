//! The event model: one event of a timeline as the recording's reader hands it on ([`Event`]), and
//! what takes a timeline's events one at a time, in time order ([`EventSink`]): the Chrome writer,
//! the builder of a `Timeline`, and the counts of `report --json`. Every reader and format is fed
//! from this one stream.

use gpumemhook_segment::layout::MemKind;
use gpumemhook_segment::recording::EventKind;

use crate::timeline::RingPart;

/// One recorded event, as the hook hands it to the writer at exit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event<'a> {
    pub ts_ns: u64,
    pub kind: EventKind,
    pub device: u32,
    pub bytes: u64,
    /// `used` of the device right after the event.
    pub used: u64,
    pub address: u64,
    /// Entry point name, or the scope name.
    pub name: &'a str,
    /// Managed / pinned host / device.
    pub mem: MemKind,
    pub tid: u32,
    /// Scope slot for scope events.
    pub scope: u32,
    /// The ceiling of `device` in force at the event, `None` when there was none.
    pub limit: Option<u64>,
    /// File name of the module charged with a device allocation or free, `""` when unknown.
    pub module: &'a str,
    /// The Python call site of a device allocation, refusal or free (`GPUMEMHOOK_STACKS`), `""`
    /// for none.
    pub site: &'a str,
}

/// What takes a timeline's events one at a time, in time order: the Chrome writer and
/// [`crate::TimelineBuilder`] (the flight recorder's reader hands its events to either).
pub trait EventSink {
    /// One event of the count.
    fn event(&mut self, e: &Event<'_>) -> std::io::Result<()>;
    /// A step of `device`'s ceiling that is not an event of the count (the ceiling in force at an
    /// event, or at exit), taken where it differs from the last.
    fn ceiling_step(&mut self, ts_ns: u64, device: u32, limit: Option<u64>) -> std::io::Result<()>;
    /// A ring timeline's summary of the events it overwrote, before any event: a sink that sums
    /// starts from it.
    fn ring(&mut self, _ring: &RingPart) -> std::io::Result<()> {
        Ok(())
    }
}

/// A device's ceiling not seen yet: where a sink's record of the ceiling last taken per device
/// starts (no ceiling is 0, so that the first event of a device always gives a step).
pub(crate) const UNSEEN: u64 = u64::MAX - 1;
