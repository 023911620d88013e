//! Which Python distribution installed a shared object: `torch` for `.../site-packages/torch/lib/
//! libc10_cuda.so`, `cupy-cuda12x` for `.../site-packages/cupy_backends/cuda/api/runtime....so`, so
//! that reports can name a module by its package beside its file name.
//!
//! Found from the path alone, off the hook's hot path (the CLI asks when it prints): the nearest
//! ancestor directory named `site-packages` or `dist-packages` is the installation root; the
//! distribution is the one whose `*.dist-info/RECORD` (the list of files pip installed) lists the
//! object's path relative to that root, and its name is `METADATA`'s `Name:`. A root's records are
//! read once per process and kept. An object outside such a root, or listed by no record (a
//! system library, one built in place), has no distribution.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The directories an installer puts distributions in.
const ROOT_NAMES: [&str; 2] = ["site-packages", "dist-packages"];

/// Per installation root: relative path (with `/`) → distribution name.
static ROOTS: Mutex<Option<HashMap<PathBuf, HashMap<String, String>>>> = Mutex::new(None);

/// The name of the distribution that installed the file at `path`, if one did.
pub fn distribution_of(path: &Path) -> Option<String> {
    let root = path.ancestors().skip(1).find(|a| {
        a.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| ROOT_NAMES.contains(&n))
    })?;
    let relative = path.strip_prefix(root).ok()?.to_str()?.to_string();
    let mut roots = ROOTS.lock().unwrap_or_else(|e| e.into_inner());
    let files = roots
        .get_or_insert_with(HashMap::new)
        .entry(root.to_path_buf())
        .or_insert_with(|| read_records(root));
    files.get(&relative).cloned()
}

/// `torch (libc10_cuda.so)` when the module at `path` belongs to a distribution, else `file`.
pub fn module_label(file: &str, path: &str) -> String {
    match (!path.is_empty())
        .then(|| distribution_of(Path::new(path)))
        .flatten()
    {
        Some(name) => format!("{name} ({file})"),
        None => file.to_string(),
    }
}

/// Every file every distribution under `root` lists, with the distribution's name.
fn read_records(root: &Path) -> HashMap<String, String> {
    let mut files = HashMap::new();
    let Ok(entries) = std::fs::read_dir(root) else {
        return files;
    };
    for entry in entries.flatten() {
        let dir = entry.path();
        let Some(dir_name) = dir.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let Some(stem) = dir_name.strip_suffix(".dist-info") else {
            continue;
        };
        let Ok(record) = std::fs::read_to_string(dir.join("RECORD")) else {
            continue;
        };
        let name = std::fs::read_to_string(dir.join("METADATA"))
            .ok()
            .and_then(|m| {
                m.lines()
                    .take_while(|l| !l.is_empty())
                    .find_map(|l| l.strip_prefix("Name:").map(|n| n.trim().to_string()))
            })
            .unwrap_or_else(|| stem.split('-').next().unwrap_or(stem).to_string());
        for line in record.lines() {
            // `path,hash,size`; a path with a comma is quoted (CSV), and never a shared object's.
            if let Some(file) = line.split(',').next().filter(|f| !f.is_empty()) {
                files.insert(file.to_string(), name.clone());
            }
        }
    }
    files
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_object_is_named_by_the_distribution_whose_record_lists_it() {
        let dir = std::env::temp_dir().join(format!("gpumemhook-packages-{}", std::process::id()));
        let site = dir.join("lib/python3.12/site-packages");
        let info = site.join("torch-2.11.0.dist-info");
        std::fs::create_dir_all(&info).unwrap();
        std::fs::create_dir_all(site.join("torch/lib")).unwrap();
        std::fs::write(
            info.join("METADATA"),
            "Metadata-Version: 2.1\nName: torch\nVersion: 2.11.0\n\nName: not this\n",
        )
        .unwrap();
        std::fs::write(
            info.join("RECORD"),
            "torch/__init__.py,sha256=x,10\ntorch/lib/libc10_cuda.so,sha256=y,20\n",
        )
        .unwrap();
        // A distribution without METADATA is named by its directory.
        let other = site.join("cupy_cuda12x-14.2.0.dist-info");
        std::fs::create_dir_all(&other).unwrap();
        std::fs::write(
            other.join("RECORD"),
            "cupy_backends/cuda/api/runtime.cpython-312-x86_64-linux-gnu.so,,\n",
        )
        .unwrap();
        let so = site.join("torch/lib/libc10_cuda.so");
        assert_eq!(distribution_of(&so).as_deref(), Some("torch"));
        assert_eq!(
            module_label("libc10_cuda.so", so.to_str().unwrap()),
            "torch (libc10_cuda.so)"
        );
        let cupy = site.join("cupy_backends/cuda/api/runtime.cpython-312-x86_64-linux-gnu.so");
        assert_eq!(distribution_of(&cupy).as_deref(), Some("cupy_cuda12x"));
        // Listed by no record, or outside any installation root: no distribution.
        assert_eq!(distribution_of(&site.join("torch/lib/libextra.so")), None);
        assert_eq!(distribution_of(Path::new("/usr/lib/libcuda.so.1")), None);
        assert_eq!(
            module_label("libcuda.so.1", "/usr/lib/libcuda.so.1"),
            "libcuda.so.1"
        );
        assert_eq!(module_label("other", ""), "other");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
