//! `gpumemhook kernel`: the spec `install` writes (the Python, `ipykernel_launcher`, the hook's
//! variables as `run` sets them), where it goes (`--prefix`, `--user` under `$JUPYTER_DATA_DIR`),
//! and every refusal: a Python without ipykernel, another kernel at the name (unless `--force`), a
//! library that is not there, a bad name, size or interpreter. The kernel itself is started
//! through jupyter_client in python/tests/test_kernel.py; here the Python only has to answer the
//! CLI's probe, so ipykernel is a stub module on `PYTHONPATH` (or one that fails to import).

use gpumemhook_tests::{cli, hook_lib, python, scratch};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Output;

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn show(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        text(&o.stdout),
        text(&o.stderr)
    )
}

/// A directory for `PYTHONPATH` whose `ipykernel` imports (`works`) or raises ImportError.
fn stub_ipykernel(dir: &Path, works: bool) -> PathBuf {
    let stubs = dir.join(if works {
        "with-ipykernel"
    } else {
        "no-ipykernel"
    });
    std::fs::create_dir_all(&stubs).unwrap();
    let body = if works {
        "__version__ = '0.0-stub'\n"
    } else {
        "raise ImportError(\"No module named 'ipykernel'\")\n"
    };
    std::fs::write(stubs.join("ipykernel.py"), body).unwrap();
    stubs
}

/// `gpumemhook kernel ARGS` in `dir`, with `--python` the real interpreter and ipykernel from
/// `stubs`.
fn kernel(dir: &Path, stubs: &Path, args: &[&str]) -> Output {
    let mut all = vec!["kernel"];
    all.extend_from_slice(args);
    cli(dir, &all)
        .env("PYTHONPATH", stubs)
        .env("NO_COLOR", "1")
        .env("JUPYTER_DATA_DIR", dir.join("user-data"))
        .output()
        .expect("gpumemhook runs")
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}\n{text}", path.display()))
}

fn python_arg() -> String {
    python().display().to_string()
}

#[test]
fn install_writes_a_spec_that_starts_ipykernel_under_the_hook_with_runs_settings() {
    let dir = scratch("kernel-spec");
    let stubs = stub_ipykernel(&dir, true);
    let prefix = dir.join("prefix");
    let py = python_arg();
    let o = kernel(
        &dir,
        &stubs,
        &[
            "install",
            "--prefix",
            prefix.to_str().unwrap(),
            "--python",
            &py,
            "--limit",
            "1GiB",
            "--emulate",
            "t4",
        ],
    );
    assert!(o.status.success(), "{}", show(&o));
    let spec_dir = prefix.join("share/jupyter/kernels/gpumemhook");
    let stdout = text(&o.stdout);
    assert!(
        stdout.starts_with(&format!(
            "Installed kernel gpumemhook (\"Python 3 (gpumemhook)\") in {}\n",
            spec_dir.display()
        )),
        "{}",
        show(&o)
    );
    assert!(stdout.contains("(ipykernel 0.0-stub)"), "{}", show(&o));
    // The prefix is not one Jupyter searches: said, with the variable that makes it one.
    assert!(
        stdout.contains(&format!(
            "JUPYTER_PATH={}",
            prefix.join("share/jupyter").display()
        )),
        "{}",
        show(&o)
    );

    let spec = read_json(&spec_dir.join("kernel.json"));
    let lib = std::fs::canonicalize(hook_lib()).unwrap();
    assert_eq!(
        spec["argv"],
        serde_json::json!([py, "-m", "ipykernel_launcher", "-f", "{connection_file}"])
    );
    assert_eq!(spec["display_name"], "Python 3 (gpumemhook)");
    assert_eq!(spec["language"], "python");
    // As `run` sets them: the hook alone in LD_PRELOAD (absolute), the ceiling in bytes (with its unit), the card.
    assert_eq!(
        spec["env"],
        serde_json::json!({
            "LD_PRELOAD": lib.display().to_string(),
            "GPUMEMHOOK_LIMIT": format!("{}B", 1u64 << 30),
            "GPUMEMHOOK_EMULATE": "t4",
        })
    );
    assert!(spec["metadata"]["gpumemhook"]["version"].is_string());

    // Installing again over our own kernel replaces it, with the new settings only.
    let o = kernel(
        &dir,
        &stubs,
        &[
            "install",
            "--prefix",
            prefix.to_str().unwrap(),
            "--python",
            &py,
        ],
    );
    assert!(o.status.success(), "{}", show(&o));
    assert!(text(&o.stdout).starts_with("Replaced kernel gpumemhook"));
    let spec = read_json(&spec_dir.join("kernel.json"));
    assert_eq!(
        spec["env"],
        serde_json::json!({"LD_PRELOAD": lib.display().to_string()})
    );
}

#[test]
fn user_kernels_go_to_jupyter_data_dir_and_list_and_remove_find_them() {
    let dir = scratch("kernel-user");
    let stubs = stub_ipykernel(&dir, true);
    let py = python_arg();
    let o = kernel(
        &dir,
        &stubs,
        &[
            "install",
            "--user",
            "--python",
            &py,
            "--name",
            "gmh-a",
            "--display-name",
            "A",
        ],
    );
    assert!(o.status.success(), "{}", show(&o));
    let spec_file = dir.join("user-data/kernels/gmh-a/kernel.json");
    assert!(spec_file.is_file(), "{}", show(&o));
    // No Jupyter search note for the user's own directory.
    assert!(!text(&o.stdout).contains("JUPYTER_PATH"), "{}", show(&o));
    // A kernel that is not ours beside it is not listed.
    let other = dir.join("user-data/kernels/python3");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::write(
        other.join("kernel.json"),
        r#"{"argv": ["python3"], "display_name": "Python 3"}"#,
    )
    .unwrap();

    let o = kernel(&dir, &stubs, &["list"]);
    assert!(o.status.success(), "{}", show(&o));
    let lib = std::fs::canonicalize(hook_lib()).unwrap();
    assert_eq!(
        text(&o.stdout),
        format!(
            "gmh-a  \"A\"\n  spec:    {}\n  python:  {py}\n  library: {}\n",
            spec_file.display(),
            lib.display()
        ),
        "{}",
        show(&o)
    );

    let o = kernel(&dir, &stubs, &["remove", "--name", "gmh-a"]);
    assert!(o.status.success(), "{}", show(&o));
    assert!(!spec_file.exists() && other.join("kernel.json").is_file());
    let o = kernel(&dir, &stubs, &["list", "--user"]);
    assert!(
        text(&o.stdout).starts_with("no gpumemhook kernels (looked in "),
        "{}",
        show(&o)
    );
    // Removing what is not there is an error that says where it looked.
    let o = kernel(&dir, &stubs, &["remove", "--name", "gmh-a"]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(
        text(&o.stderr).contains("there is no kernel gmh-a in"),
        "{}",
        show(&o)
    );
}

#[test]
fn install_refuses_a_python_without_ipykernel_and_writes_nothing() {
    let dir = scratch("kernel-no-ipykernel");
    let stubs = stub_ipykernel(&dir, false);
    let prefix = dir.join("prefix");
    let o = kernel(
        &dir,
        &stubs,
        &[
            "install",
            "--prefix",
            prefix.to_str().unwrap(),
            "--python",
            &python_arg(),
        ],
    );
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    let stderr = text(&o.stderr);
    assert_eq!(stderr.lines().count(), 1, "{}", show(&o));
    assert!(
        stderr.contains("has no ipykernel") && stderr.contains("-m pip install ipykernel"),
        "{}",
        show(&o)
    );
    assert!(!prefix.exists(), "{}", show(&o));
}

#[test]
fn install_and_remove_leave_a_kernel_that_is_not_theirs_alone_unless_forced() {
    let dir = scratch("kernel-other");
    let stubs = stub_ipykernel(&dir, true);
    let prefix = dir.join("prefix");
    let other = prefix.join("share/jupyter/kernels/gpumemhook");
    std::fs::create_dir_all(&other).unwrap();
    let theirs = r#"{"argv": ["python3"], "display_name": "Someone else's"}"#;
    std::fs::write(other.join("kernel.json"), theirs).unwrap();
    let py = python_arg();
    let install = |force: bool| {
        let mut args = vec![
            "install",
            "--prefix",
            prefix.to_str().unwrap(),
            "--python",
            &py,
        ];
        if force {
            args.push("--force");
        }
        kernel(&dir, &stubs, &args)
    };

    let o = install(false);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(
        text(&o.stderr).contains("holds the kernel \"Someone else's\", which gpumemhook did not write; choose another --name, or pass --force"),
        "{}",
        show(&o)
    );
    let o = kernel(
        &dir,
        &stubs,
        &["remove", "--prefix", prefix.to_str().unwrap()],
    );
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(text(&o.stderr).contains("pass --force to remove it anyway"));
    assert_eq!(
        std::fs::read_to_string(other.join("kernel.json")).unwrap(),
        theirs
    );

    let o = install(true);
    assert!(o.status.success(), "{}", show(&o));
    assert!(read_json(&other.join("kernel.json"))["metadata"]["gpumemhook"].is_object());
}

#[test]
fn install_refuses_a_missing_library_and_bad_values_before_writing() {
    let dir = scratch("kernel-refusals");
    let stubs = stub_ipykernel(&dir, true);
    let prefix = dir.join("prefix");
    let p = prefix.to_str().unwrap();
    let py = python_arg();
    let missing = dir.join("nowhere/libgpumemhook.so");
    let cases: &[(&[&str], i32, &str)] = &[
        (
            &["--lib", missing.to_str().unwrap()],
            1,
            "which is not the gpumemhook library (not a file)",
        ),
        (
            &["--name", "My Kernel"],
            2,
            "--name \"My Kernel\": a kernel's name is lower-case",
        ),
        (&["--name", ".."], 2, "not starting with '.'"),
        (&["--limit", "lots"], 2, "--limit:"),
        (&["--emulate", "no-such-card"], 2, "--emulate:"),
        (&["--prefix", p, "--user"], 2, "cannot be used with"),
    ];
    for (extra, code, says) in cases {
        let mut args = vec!["install", "--python", &py];
        if !extra.contains(&"--prefix") {
            args.extend(["--prefix", p]);
        }
        args.extend_from_slice(extra);
        let o = kernel(&dir, &stubs, &args);
        assert_eq!(o.status.code(), Some(*code), "{extra:?}: {}", show(&o));
        assert!(text(&o.stderr).contains(says), "{extra:?}: {}", show(&o));
    }
    let o = kernel(
        &dir,
        &stubs,
        &["install", "--prefix", p, "--python", "/nonexistent/python3"],
    );
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    assert!(text(&o.stderr).contains("--python /nonexistent/python3: cannot run it"));
    assert!(!prefix.exists());
}

/// `gpumemhook kernel ARGS` that must end within 20 s (a FIFO opened for reading would block it
/// forever): its output, or a failure that says it hung.
fn kernel_in_time(dir: &Path, stubs: &Path, args: &[&str], jupyter_path: &Path) -> Output {
    let mut all = vec!["kernel"];
    all.extend_from_slice(args);
    let mut child = cli(dir, &all)
        .env("PYTHONPATH", stubs)
        .env("NO_COLOR", "1")
        .env("JUPYTER_DATA_DIR", dir.join("user-data"))
        .env("JUPYTER_PATH", jupyter_path)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("gpumemhook kernel {args:?} hung on a FIFO");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn a_fifo_kernel_json_hangs_nothing_and_listed_values_cannot_drive_the_terminal() {
    let dir = scratch("kernel-fifo");
    let stubs = stub_ipykernel(&dir, true);
    let shared = dir.join("shared");
    let prefix = dir.join("prefix");
    for kernels in [
        shared.join("kernels/planted"),
        prefix.join("share/jupyter/kernels/gpumemhook"),
    ] {
        std::fs::create_dir_all(&kernels).unwrap();
        let fifo = std::ffi::CString::new(kernels.join("kernel.json").to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    }
    // A spec of ours beside it, with a terminal escape in a value.
    let ours = shared.join("kernels/ours");
    std::fs::create_dir_all(&ours).unwrap();
    let spec = serde_json::json!({
        "argv": ["python3"], "display_name": "ours",
        "env": {"LD_PRELOAD": "/x/libgpumemhook.so", "GPUMEMHOOK_JOB": "a\u{1b}[2Jb"},
        "metadata": {"gpumemhook": {}}
    });
    std::fs::write(ours.join("kernel.json"), spec.to_string()).unwrap();

    let o = kernel_in_time(&dir, &stubs, &["list"], &shared);
    assert!(o.status.success(), "{}", show(&o));
    let out = text(&o.stdout);
    assert!(out.contains("GPUMEMHOOK_JOB=a\\u{1b}[2Jb"), "{}", show(&o));
    assert!(
        !out.contains('\u{1b}'),
        "a raw escape reached the terminal: {}",
        show(&o)
    );

    let p = prefix.to_str().unwrap();
    let py = python_arg();
    let o = kernel_in_time(
        &dir,
        &stubs,
        &["install", "--prefix", p, "--python", &py],
        &shared,
    );
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(
        text(&o.stderr).contains("not a regular file"),
        "{}",
        show(&o)
    );
    let o = kernel_in_time(&dir, &stubs, &["remove", "--prefix", p], &shared);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(
        text(&o.stderr).contains("not a regular file"),
        "{}",
        show(&o)
    );
}

/// `kernel install` run by path from a virtual environment (not activated, another `python3`
/// first on PATH) takes that environment's Python, not PATH's.
#[test]
fn install_run_from_a_venv_takes_that_venvs_python() {
    let dir = scratch("kernel-own-venv");
    let stubs = stub_ipykernel(&dir, true);
    let real = std::fs::canonicalize(python()).unwrap();
    let venv = dir.join("venv");
    std::fs::create_dir_all(venv.join("bin")).unwrap();
    std::fs::write(
        venv.join("pyvenv.cfg"),
        format!("home = {}\n", real.parent().unwrap().display()),
    )
    .unwrap();
    std::os::unix::fs::symlink(&real, venv.join("bin/python3")).unwrap();
    let own = venv.join("bin/gpumemhook");
    std::fs::copy(gpumemhook_tests::cli_bin(), &own).unwrap();
    let prefix = dir.join("prefix");
    let o = gpumemhook_tests::cli_at(
        &own,
        &dir,
        &["kernel", "install", "--prefix", prefix.to_str().unwrap()],
    )
    .env("PYTHONPATH", &stubs)
    .env("NO_COLOR", "1")
    .env("GPUMEMHOOK_LIB", hook_lib())
    .env("PATH", "/usr/bin:/bin")
    .output()
    .unwrap();
    assert!(o.status.success(), "{}", show(&o));
    let spec = read_json(&prefix.join("share/jupyter/kernels/gpumemhook/kernel.json"));
    let argv0 = spec["argv"][0].as_str().unwrap().to_string();
    assert!(
        argv0.starts_with(venv.to_str().unwrap()),
        "the kernel runs {argv0}, not the venv's Python: {}",
        show(&o)
    );
}
