//! The crate's one error: why a timeline could not be read.

/// Why a trace could not be read.
#[derive(Debug)]
pub struct TraceError {
    pub(crate) message: String,
    /// The file is JSON without a `traceEvents` list: no timeline at all (an exit report, say),
    /// rather than a broken one.
    pub not_a_timeline: bool,
}

impl TraceError {
    pub(crate) fn broken(message: String) -> TraceError {
        TraceError {
            message,
            not_a_timeline: false,
        }
    }
}

impl std::fmt::Display for TraceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for TraceError {}
