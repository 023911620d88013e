//! [`UsageError`]: a mistake in how the command was called (a bad option value, a device the process
//! does not count), which `main` turns into exit status 2 with its one line, like clap's own usage
//! errors. Every command module raises it; it lives apart from `main` so that none of them depends
//! on the binary's root. [`split_size`] finds a size written as two words (`--limit 8 GiB`).

/// A mistake in how the command was called: exit status 2, like clap's own usage errors.
#[derive(Debug)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// The refusal of a size written as two words among `words` (a command line, read up to `--`): a
/// bare number followed by a unit, as in `--limit 8 GiB`, gives `--limit: write 8GiB (no space)`
/// (the option named when the word before the number is one). Without this, `GiB` would be taken
/// for the program to run or an extra argument, and the error would name the wrong mistake.
pub fn split_size<S: AsRef<std::ffi::OsStr>>(words: &[S]) -> Option<UsageError> {
    let words: Vec<&str> = words
        .iter()
        .map_while(|w| w.as_ref().to_str())
        .take_while(|&w| w != "--")
        .collect();
    (0..words.len().saturating_sub(1)).find_map(|i| {
        let refusal = gpumemhook_reader::spaced_size(words[i], words[i + 1])?;
        Some(UsageError(match i.checked_sub(1).map(|o| words[o]) {
            Some(option) if option.starts_with('-') => format!("{option}: {refusal}"),
            _ => refusal.to_string(),
        }))
    })
}
