//! The decisions the bindings make that do not need Python: which exception family a reader error
//! belongs to, which device a reading defaults to, and the ceiling `gpu_mem_leave_free_mbs` sets.
//! Kept apart from the PyO3 glue so that they are unit-tested with plain `cargo test`.

use gpumemhook_reader::{Error, MAX_SIZE};

/// The Python exception class a reader error maps to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// `NotHookedError`: there is no segment because the process was not started under the hook.
    NotHooked,
    /// `ProcessGoneError`.
    ProcessGone,
    /// `LayoutVersionError`: a reader from another release is needed.
    LayoutVersion,
    /// `ScopeClosedError`.
    ScopeClosed,
    /// `GpuMemHookError` itself.
    Other,
}

pub fn classify(e: &Error) -> ErrorKind {
    match e {
        Error::NoSegment { .. } | Error::NotLoaded => ErrorKind::NotHooked,
        Error::ProcessGone { .. } => ErrorKind::ProcessGone,
        Error::LayoutVersion { .. } => ErrorKind::LayoutVersion,
        Error::ScopeClosed | Error::GroupScopeGone { .. } => ErrorKind::ScopeClosed,
        Error::WrongMagic { .. }
        | Error::Truncated { .. }
        | Error::ReadOnly { .. }
        | Error::ScopesFull
        | Error::ScopeBusy
        | Error::Refused { .. }
        | Error::OtherUser { .. }
        | Error::OtherNamespace { .. }
        | Error::NoSuchDevice { .. }
        | Error::Io { .. }
        | Error::Report { .. }
        | Error::GroupName { .. }
        | Error::GroupFull { .. }
        | Error::GroupNoWideAtomic { .. }
        | Error::GroupScopesFull { .. } => ErrorKind::Other,
    }
}

/// The device a scope reading is about: the one asked for, else the scope's own, else device 0.
pub fn reading_device(requested: Option<u32>, scope_default: Option<u32>) -> u32 {
    requested.or(scope_default).unwrap_or(0)
}

/// The ceiling that leaves `keep_free` bytes allocatable above `used`, the bytes the process holds
/// now. When the device's real free bytes are known the ceiling never passes `used + device_free`:
/// a ceiling above what the card can give would promise memory that is not there. It never reaches
/// the segment's "no ceiling" sentinel either (at most `MAX_SIZE`).
pub fn leave_free_ceiling(used: u64, keep_free: u64, device_free: Option<u64>) -> u64 {
    let wanted = used.saturating_add(keep_free);
    let ceiling = match device_free {
        Some(free) => wanted.min(used.saturating_add(free)),
        None => wanted,
    };
    ceiling.min(MAX_SIZE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn errors_map_to_their_exception_family() {
        let path = PathBuf::from("/dev/shm/x");
        assert_eq!(
            classify(&Error::NoSegment {
                pid: 1,
                path: path.clone()
            }),
            ErrorKind::NotHooked
        );
        assert_eq!(classify(&Error::NotLoaded), ErrorKind::NotHooked);
        assert_eq!(
            classify(&Error::ProcessGone { pid: 7 }),
            ErrorKind::ProcessGone
        );
        assert_eq!(
            classify(&Error::LayoutVersion {
                path: path.clone(),
                found: 9,
                expected: 1
            }),
            ErrorKind::LayoutVersion
        );
        assert_eq!(classify(&Error::ScopeClosed), ErrorKind::ScopeClosed);
        assert_eq!(classify(&Error::ScopesFull), ErrorKind::Other);
        assert_eq!(classify(&Error::WrongMagic { path }), ErrorKind::Other);
    }

    #[test]
    fn readings_default_to_the_scope_device_then_zero() {
        assert_eq!(reading_device(Some(3), Some(1)), 3);
        assert_eq!(reading_device(None, Some(1)), 1);
        assert_eq!(reading_device(None, None), 0);
    }

    #[test]
    fn leave_free_ceiling_is_used_plus_n_capped_by_the_device() {
        const MIB: u64 = 1 << 20;
        assert_eq!(leave_free_ceiling(10 * MIB, 100 * MIB, None), 110 * MIB);
        assert_eq!(
            leave_free_ceiling(10 * MIB, 100 * MIB, Some(1000 * MIB)),
            110 * MIB
        );
        // Only 50 MiB really free: the ceiling stops at what the card can give.
        assert_eq!(
            leave_free_ceiling(10 * MIB, 100 * MIB, Some(50 * MIB)),
            60 * MIB
        );
        assert_eq!(leave_free_ceiling(u64::MAX, 1, None), MAX_SIZE);
        assert_eq!(leave_free_ceiling(0, 0, Some(0)), 0);
    }
}
