//! `gpumemhook kernel install | list | remove`: a Jupyter kernel that runs under the hook, so that a
//! notebook gets exact figures by picking "Python 3 (gpumemhook)" in the kernel menu, with no
//! `LD_PRELOAD` set by hand and no restart.
//!
//! A kernel spec is a directory `<data dir>/kernels/<name>/` holding `kernel.json`: the command
//! that starts the kernel (`argv`, here the chosen Python's `ipykernel_launcher`) and the variables
//! Jupyter adds to its environment (`env`, here the ones `run` gives its child, from
//! [`launch::hook_variables`]). The spec says it is gpumemhook's in `metadata.gpumemhook`: that is
//! how `list` finds ours and how `install` and `remove` tell them from kernels they must not touch.

use anyhow::{anyhow, bail, Context, Result};
use gpumemhook_reader::env::preload_value;
use gpumemhook_reader::parse_size;
use gpumemhook_reader::{parse_card, write_file};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::launch::{self, find_library};
use crate::style::{Painter, Style};
use crate::usage::UsageError;

/// The key of `metadata` that marks a spec as gpumemhook's.
const MARK: &str = "gpumemhook";
/// The spec's file inside its directory.
const SPEC_FILE: &str = "kernel.json";

#[derive(clap::Args, Debug)]
#[command(after_help = "\
Examples:
  gpumemhook kernel install                           # \"Python 3 (gpumemhook)\" for this user
  gpumemhook kernel install --python ~/venv/bin/python --limit 8GiB
  gpumemhook kernel install --name gmh-t4 --display-name \"Python 3 (T4)\" --emulate t4
  gpumemhook kernel list
  gpumemhook kernel remove

docs/notebooks.md says what the kernel sets and how to use the API, %load_ext gpumemhook and the
fastai/ipyexperiments layer in its cells.")]
pub struct KernelArgs {
    #[command(subcommand)]
    action: Action,
}

#[derive(clap::Subcommand, Debug)]
enum Action {
    /// Write a kernel spec that starts a Python's ipykernel under the hook.
    Install(InstallArgs),
    /// List the gpumemhook kernels installed: where, which Python, which library.
    List(ListArgs),
    /// Remove a gpumemhook kernel.
    Remove(RemoveArgs),
}

/// Where a kernel spec goes: Jupyter's own locations, as `jupyter kernelspec install` names them.
#[derive(clap::Args, Debug)]
#[group(multiple = false)]
struct Location {
    /// This user's Jupyter data directory ($JUPYTER_DATA_DIR, else $XDG_DATA_HOME/jupyter, else
    /// ~/.local/share/jupyter); the default.
    #[arg(long)]
    user: bool,
    /// PREFIX/share/jupyter (a prefix Jupyter searches: a virtual environment, /usr/local, or a
    /// directory on $JUPYTER_PATH).
    #[arg(long, value_name = "PREFIX")]
    prefix: Option<PathBuf>,
    /// The Python's own prefix (sys.prefix of --python): its virtual environment or installation.
    #[arg(long)]
    sys_prefix: bool,
}

#[derive(clap::Args, Debug)]
struct InstallArgs {
    /// The kernel's name (its directory): letters, digits, '.', '_', '-'.
    #[arg(long, default_value = "gpumemhook")]
    name: String,
    /// The name Jupyter shows in its kernel menu.
    #[arg(long, default_value = "Python 3 (gpumemhook)")]
    display_name: String,
    #[command(flatten)]
    location: Location,
    /// The Python whose ipykernel the kernel runs (it needs ipykernel; gpumemhook too, for the API
    /// in cells). Default: the Python of the virtual environment this command is installed in, else python3 on PATH.
    #[arg(long, value_name = "PATH")]
    python: Option<PathBuf>,
    /// Allocation ceiling for every device in the kernel, as `run --limit`.
    #[arg(long, value_name = "SIZE")]
    limit: Option<String>,
    /// Make every device behave like this card in the kernel, as `run --emulate`.
    #[arg(long, value_name = "CARD")]
    emulate: Option<String>,
    /// The hook library the kernel preloads, as `run --lib`. Default, as `run` of this same
    /// program picks it: $GPUMEMHOOK_LIB, then libgpumemhook.so beside this program, then the one
    /// of the installed Python package (`kernel list` shows which the kernel got).
    #[arg(long, value_name = "PATH")]
    lib: Option<PathBuf>,
    /// Replace a kernel of that name that gpumemhook did not write.
    #[arg(long)]
    force: bool,
}

#[derive(clap::Args, Debug)]
struct ListArgs {
    #[command(flatten)]
    location: Location,
    /// The Python whose prefix --sys-prefix means. Default: the Python of the virtual environment this command is installed in, else python3 on PATH.
    #[arg(long, value_name = "PATH")]
    python: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
struct RemoveArgs {
    /// The kernel's name.
    #[arg(long, default_value = "gpumemhook")]
    name: String,
    #[command(flatten)]
    location: Location,
    /// The Python whose prefix --sys-prefix means. Default: the Python of the virtual environment this command is installed in, else python3 on PATH.
    #[arg(long, value_name = "PATH")]
    python: Option<PathBuf>,
    /// Remove a kernel of that name that gpumemhook did not write.
    #[arg(long)]
    force: bool,
}

pub fn kernel(args: KernelArgs, painter: Painter) -> Result<i32> {
    match args.action {
        Action::Install(a) => install(a, painter),
        Action::List(a) => list(a, painter),
        Action::Remove(a) => remove(a),
    }
}

/// What a Python said about itself.
struct PythonFacts {
    /// `sys.executable`: absolute, and the interpreter itself rather than a version manager's shim.
    executable: PathBuf,
    /// `sys.prefix`.
    prefix: PathBuf,
    /// ipykernel's version, or why it cannot be imported.
    ipykernel: Result<String, String>,
    /// Whether `import gpumemhook` works there (the API in cells needs it; the counting does not).
    has_gpumemhook: bool,
}

/// Runs `python` (unhooked) to learn where it is and what it can import.
fn probe_python(python: Option<&Path>) -> Result<PythonFacts> {
    const PROBE: &str = "\
import sys
print(sys.executable)
print(sys.prefix)
try:
    import ipykernel
    print('ok ' + str(getattr(ipykernel, '__version__', '?')))
except Exception as e:
    print('no ' + type(e).__name__ + ': ' + str(e).replace('\\n', ' '))
try:
    import gpumemhook
    print('ok')
except Exception:
    print('no')
";
    let own = own_python();
    let program = python.or(own.as_deref()).unwrap_or(Path::new("python3"));
    let out = Command::new(program)
        .args(["-c", PROBE])
        .env_remove("LD_PRELOAD")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| {
            UsageError(format!(
                "--python {}: cannot run it ({e}); name a Python 3 interpreter",
                program.display()
            ))
        })?;
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    if !out.status.success() || lines.len() < 4 {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(UsageError(format!(
            "--python {}: not a working Python 3 ({})",
            program.display(),
            err.lines().last().unwrap_or("it printed nothing").trim()
        ))
        .into());
    }
    let executable = if lines[0].is_empty() {
        std::fs::canonicalize(program).unwrap_or_else(|_| program.to_path_buf())
    } else {
        PathBuf::from(lines[0])
    };
    let ipykernel = match lines[2].split_once(' ') {
        Some(("ok", version)) => Ok(version.to_string()),
        Some((_, why)) => Err(why.to_string()),
        None => Err(lines[2].to_string()),
    };
    Ok(PythonFacts {
        executable,
        prefix: PathBuf::from(lines[1]),
        ipykernel,
        has_gpumemhook: lines[3] == "ok",
    })
}

/// The Python of the virtual environment this command was installed in (`<venv>/bin/gpumemhook`,
/// or the binary inside the package, `<venv>/lib/pythonX.Y/site-packages/gpumemhook/bin/`): the
/// nearest folder above it with a `pyvenv.cfg` and a `bin/python3`. Run by path from a venv, the
/// command so finds that venv's Python rather than whichever `python3` is first on PATH.
fn own_python() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    exe.ancestors()
        .skip(1)
        .take(6)
        .find(|dir| dir.join("pyvenv.cfg").is_file() && dir.join("bin/python3").exists())
        .map(|dir| dir.join("bin/python3"))
}

/// This user's Jupyter data directory, as Jupyter itself finds it on Linux.
fn user_data_dir() -> Result<PathBuf> {
    let set = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(dir) = set("JUPYTER_DATA_DIR") {
        return Ok(PathBuf::from(dir));
    }
    if let Some(xdg) = set("XDG_DATA_HOME") {
        return Ok(PathBuf::from(xdg).join("jupyter"));
    }
    match set("HOME") {
        Some(home) => Ok(PathBuf::from(home).join(".local/share/jupyter")),
        None => bail!("HOME is not set: give the kernel's place with --prefix PREFIX"),
    }
}

/// The `kernels` directory a location option names (`--user` when none is given).
fn kernels_dir(location: &Location, python: Option<&Path>) -> Result<PathBuf> {
    let data = if let Some(prefix) = &location.prefix {
        absolute(prefix)?.join("share/jupyter")
    } else if location.sys_prefix {
        probe_python(python)?.prefix.join("share/jupyter")
    } else {
        user_data_dir()?
    };
    Ok(data.join("kernels"))
}

/// `path` made absolute against the working directory (not resolved: a link stays the user's).
fn absolute(path: &Path) -> Result<PathBuf> {
    std::path::absolute(path).with_context(|| format!("{}", path.display()))
}

/// Jupyter's rule for a kernel's name (it is a directory and part of URLs).
fn check_name(name: &str) -> Result<()> {
    // Not hidden, and never `.` or `..`: the name is joined to a directory that `remove` deletes.
    let fine = !name.is_empty()
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-".contains(c));
    if fine {
        Ok(())
    } else {
        Err(UsageError(format!(
            "--name {name:?}: a kernel's name is lower-case letters, digits, '.', '_' and '-', \
             not starting with '.'"
        ))
        .into())
    }
}

/// What is at a kernel's directory now.
enum Existing {
    Nothing,
    /// A spec gpumemhook wrote.
    Ours,
    /// Something else: another kernel, or a directory that is not a kernel spec.
    Other(String),
}

fn existing(dir: &Path) -> Existing {
    if !dir.exists() {
        return Existing::Nothing;
    }
    match read_spec(dir) {
        Ok(spec) if is_ours(&spec) => Existing::Ours,
        Ok(spec) => Existing::Other(format!(
            "the kernel {:?}, which gpumemhook did not write",
            spec["display_name"].as_str().unwrap_or("(no display name)")
        )),
        Err(why) => Existing::Other(format!("something that is not a kernel spec ({why})")),
    }
}

/// The largest `kernel.json` read: a spec is a few hundred bytes.
const SPEC_MAX: u64 = 1 << 20;

/// Reads `dir`'s `kernel.json` without ever blocking: a kernel directory may be shared
/// (`JUPYTER_PATH`) and hold anything another user put there. Opened non-blocking (a FIFO would
/// otherwise wait for a writer forever), then read only if it is a regular file, at most
/// [`SPEC_MAX`] bytes.
fn read_spec(dir: &Path) -> Result<Value, String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let file = dir.join(SPEC_FILE);
    let shown = printable(&file.display().to_string());
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(&file)
        .map_err(|e| format!("{shown}: {e}"))?;
    let meta = opened.metadata().map_err(|e| format!("{shown}: {e}"))?;
    if !meta.is_file() {
        return Err(format!("{shown}: not a regular file"));
    }
    let mut text = String::new();
    opened
        .take(SPEC_MAX)
        .read_to_string(&mut text)
        .map_err(|e| format!("{shown}: {e}"))?;
    serde_json::from_str(&text).map_err(|e| format!("{shown}: {e}"))
}

/// `text` with its control characters (a terminal's escapes among them) written as Rust escapes,
/// so that a path or value from someone's spec cannot drive the terminal that lists it.
fn printable(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

fn is_ours(spec: &Value) -> bool {
    spec["metadata"][MARK].is_object()
}

/// `kernel install`'s checked plan: the hook, the Python that runs the kernel, where its spec goes
/// and the variables it sets.
struct InstallPlan {
    lib: PathBuf,
    python: PythonFacts,
    /// The kernels directory, and the kernel's own directory in it.
    kernels: PathBuf,
    dir: PathBuf,
    /// Whether a spec there is replaced.
    replaced: bool,
    env: serde_json::Map<String, Value>,
}

fn install(args: InstallArgs, painter: Painter) -> Result<i32> {
    let plan = install_plan(&args)?;
    write_spec(&args, &plan)?;
    present_install(&args, &plan, painter)?;
    Ok(0)
}

/// The plan of `args`, every value checked (as `run` checks them) before anything is written; a
/// spec that is not ours in the way is removed here, with --force only.
fn install_plan(args: &InstallArgs) -> Result<InstallPlan> {
    check_name(&args.name)?;
    let limit = match &args.limit {
        Some(text) => Some(parse_size(text).map_err(|e| UsageError(format!("--limit: {e}")))?),
        None => None,
    };
    let emulate = match &args.emulate {
        Some(text) => Some(parse_card(text).map_err(|e| UsageError(format!("--emulate: {e}")))?),
        None => None,
    };
    // Absolute and checked to be the hook: the spec outlives this shell and its directory.
    let lib = find_library(args.lib.as_deref())?;
    let python = probe_python(args.python.as_deref())?;
    if let Err(why) = &python.ipykernel {
        bail!(
            "{} cannot start a Jupyter kernel: it has no ipykernel ({why}); install it there with \
             `{} -m pip install ipykernel`, or choose another Python with --python PATH",
            python.executable.display(),
            python.executable.display()
        );
    }
    let kernels = if args.location.sys_prefix {
        python.prefix.join("share/jupyter/kernels")
    } else {
        kernels_dir(&args.location, None)?
    };
    let dir = kernels.join(&args.name);
    let replaced = match existing(&dir) {
        Existing::Nothing => false,
        Existing::Ours => true,
        Existing::Other(what) if args.force => {
            std::fs::remove_dir_all(&dir).with_context(|| {
                format!("cannot remove {} ({what}) to replace it", dir.display())
            })?;
            true
        }
        Existing::Other(what) => bail!(
            "{} holds {what}; choose another --name, or pass --force to replace it",
            dir.display()
        ),
    };
    // The kernel's own LD_PRELOAD is the hook alone: the install shell's preloads are not the
    // notebook server's business.
    let env = launch::hook_variables(preload_value(None, &lib), limit, emulate.as_ref())
        .into_iter()
        .map(|(name, value)| (name.to_string(), value.to_string_lossy().into()))
        .collect();
    Ok(InstallPlan {
        lib,
        python,
        kernels,
        dir,
        replaced,
        env,
    })
}

/// Writes the kernel spec of the plan.
fn write_spec(args: &InstallArgs, plan: &InstallPlan) -> Result<()> {
    let spec = json!({
        "argv": [plan.python.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": args.display_name,
        "language": "python",
        "env": plan.env,
        "metadata": {
            "debugger": true,
            MARK: { "version": env!("CARGO_PKG_VERSION") },
        },
    });
    let dir = &plan.dir;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let file = dir.join(SPEC_FILE);
    write_file(&file, |out| {
        serde_json::to_writer_pretty(&mut *out, &spec)?;
        out.write_all(b"\n")
    })
    .with_context(|| format!("cannot write {}", file.display()))?;
    Ok(())
}

/// What was installed, for people, with a note where the kernel will not find the package or
/// Jupyter will not find the kernel.
fn present_install(args: &InstallArgs, plan: &InstallPlan, painter: Painter) -> Result<()> {
    let python = &plan.python;
    println!(
        "{} kernel {} ({:?}) in {}",
        if plan.replaced {
            "Replaced"
        } else {
            "Installed"
        },
        painter.paint(&args.name, Style::Name),
        args.display_name,
        plan.dir.display()
    );
    println!(
        "  python:  {} (ipykernel {})",
        python.executable.display(),
        python.ipykernel.as_deref().unwrap_or("?")
    );
    println!("  library: {}", plan.lib.display());
    for (name, value) in &plan.env {
        if name != "LD_PRELOAD" {
            println!("  {name}={}", value.as_str().unwrap_or(""));
        }
    }
    if !python.has_gpumemhook {
        println!(
            "{} {} cannot import gpumemhook: the kernel is counted (`gpumemhook ls` shows it), but \
             the API, %load_ext gpumemhook and gpumemhook.mem in its cells need the package \
             installed into that Python",
            painter.paint("note:", Style::Warn),
            python.executable.display()
        );
    }
    if let Some(prefix) = &args.location.prefix {
        let data = plan.kernels.parent().unwrap_or(&plan.kernels).to_path_buf();
        if !searched_by_jupyter(&data, python) {
            println!(
                "{} Jupyter does not look in {} unless told: start it with JUPYTER_PATH={} (or \
                 install with --user or --sys-prefix)",
                painter.paint("note:", Style::Warn),
                absolute(prefix)?.display(),
                data.display()
            );
        }
    }
    println!(
        "Pick {:?} in Jupyter's kernel menu; `gpumemhook ls` then shows the kernel's memory.",
        args.display_name
    );
    Ok(())
}

/// Whether Jupyter (run from `python`'s installation) finds kernels under the data directory
/// `data` (`.../share/jupyter`) without being told.
fn searched_by_jupyter(data: &Path, python: &PythonFacts) -> bool {
    search_path().contains(data) || *data == python.prefix.join("share/jupyter")
}

/// The data directories Jupyter searches for kernels, as far as they are known without asking a
/// Python: $JUPYTER_PATH, the user's, the active environment's, the system's.
fn search_path() -> BTreeSet<PathBuf> {
    let mut dirs = BTreeSet::new();
    if let Some(paths) = std::env::var_os("JUPYTER_PATH") {
        dirs.extend(std::env::split_paths(&paths).filter(|p| !p.as_os_str().is_empty()));
    }
    if let Ok(user) = user_data_dir() {
        dirs.insert(user);
    }
    for prefix in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
        if let Some(p) = std::env::var_os(prefix).filter(|v| !v.is_empty()) {
            dirs.insert(PathBuf::from(p).join("share/jupyter"));
        }
    }
    dirs.insert(PathBuf::from("/usr/local/share/jupyter"));
    dirs.insert(PathBuf::from("/usr/share/jupyter"));
    dirs
}

fn list(args: ListArgs, painter: Painter) -> Result<i32> {
    let chosen = args.location.user || args.location.sys_prefix || args.location.prefix.is_some();
    let places: Vec<PathBuf> = if chosen {
        vec![kernels_dir(&args.location, args.python.as_deref())?]
    } else {
        search_path()
            .into_iter()
            .map(|d| d.join("kernels"))
            .collect()
    };
    let mut found = 0;
    for kernels in &places {
        let Ok(entries) = std::fs::read_dir(kernels) else {
            continue;
        };
        let mut dirs: Vec<PathBuf> = entries.filter_map(|e| Some(e.ok()?.path())).collect();
        dirs.sort();
        for dir in dirs {
            let Ok(spec) = read_spec(&dir) else { continue };
            if !is_ours(&spec) {
                continue;
            }
            found += 1;
            print!("{}", describe_spec(&dir, &spec, painter));
        }
    }
    if found == 0 {
        let looked: Vec<String> = places.iter().map(|p| p.display().to_string()).collect();
        println!(
            "no gpumemhook kernels (looked in {}); `gpumemhook kernel install` adds one",
            looked.join(", ")
        );
    }
    Ok(0)
}

/// One installed kernel for `list`: its name and display name, where, which Python and library
/// (each said missing when it is gone), and its other settings.
fn describe_spec(dir: &Path, spec: &Value, painter: Painter) -> String {
    let name = dir
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let gone = |path: &str| {
        if Path::new(path).exists() {
            String::new()
        } else {
            format!("  {}", painter.paint("(missing)", Style::Bad))
        }
    };
    let python = spec["argv"][0].as_str().unwrap_or("");
    let library = spec["env"]["LD_PRELOAD"].as_str().unwrap_or("");
    let mut out = format!(
        "{}  {:?}\n  spec:    {}\n  python:  {}{}\n  library: {}{}\n",
        painter.paint(&printable(&name), Style::Name),
        spec["display_name"].as_str().unwrap_or(""),
        printable(&dir.join(SPEC_FILE).display().to_string()),
        printable(python),
        gone(python),
        printable(library),
        gone(library),
    );
    if let Some(env) = spec["env"].as_object() {
        for (variable, value) in env.iter().filter(|(v, _)| *v != "LD_PRELOAD") {
            let value = printable(value.as_str().unwrap_or(""));
            out.push_str(&format!("  {}={value}\n", printable(variable)));
        }
    }
    out
}

fn remove(args: RemoveArgs) -> Result<i32> {
    check_name(&args.name)?;
    let dir = kernels_dir(&args.location, args.python.as_deref())?.join(&args.name);
    match existing(&dir) {
        Existing::Nothing => {
            return Err(anyhow!(
                "there is no kernel {} in {} (`gpumemhook kernel list` shows where they are)",
                args.name,
                dir.parent().unwrap_or(&dir).display()
            ))
        }
        Existing::Other(what) if !args.force => bail!(
            "{} holds {what}; pass --force to remove it anyway",
            dir.display()
        ),
        Existing::Ours | Existing::Other(_) => {}
    }
    std::fs::remove_dir_all(&dir).with_context(|| format!("cannot remove {}", dir.display()))?;
    println!("Removed kernel {} from {}", args.name, dir.display());
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_names_follow_jupyters_rule() {
        assert!(check_name("gpumemhook").is_ok());
        assert!(check_name("gmh-t4_2.0").is_ok());
        for bad in ["", "Big", "a/b", "x y", "ü", ".", "..", ".hidden"] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn only_specs_marked_as_ours_are_ours() {
        assert!(is_ours(
            &json!({"metadata": {MARK: {"version": "1"}}, "argv": []})
        ));
        assert!(!is_ours(&json!({"metadata": {"debugger": true}})));
        assert!(!is_ours(&json!({"argv": ["python3"]})));
    }
}
