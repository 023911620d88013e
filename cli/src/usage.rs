//! [`UsageError`]: a mistake in how the command was called (a bad option value, a device the process
//! does not count), which `main` turns into exit status 2 with its one line, like clap's own usage
//! errors. Every command module raises it; it lives apart from `main` so that none of them depends
//! on the binary's root.

/// A mistake in how the command was called: exit status 2, like clap's own usage errors.
#[derive(Debug)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}
