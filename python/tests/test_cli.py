"""Finding the preload library (`library_path()`: bundled, or in a development checkout) and the
`gpumemhook` console script: its Python fallback runs a program under the hook."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import gpumemhook


def test_library_path_is_an_existing_absolute_file():
    path = Path(gpumemhook.library_path())
    assert path.is_absolute() and path.is_file() and path.name == "libgpumemhook.so"


def _fake_checkout(tmp_path: Path, with_build: bool) -> Path:
    """A checkout whose package has nothing bundled: only the sources and the native module."""
    package = Path(gpumemhook.__file__).resolve().parent
    root = tmp_path / "checkout"
    shutil.copytree(
        package,
        root / "python" / "gpumemhook",
        ignore=shutil.ignore_patterns("libgpumemhook.so", "bin", "__pycache__"),
    )
    (root / "Cargo.toml").write_text("[workspace]\n")
    (root / "interceptor").mkdir()
    if with_build:
        (root / "target" / "release").mkdir(parents=True)
        (root / "target" / "release" / "libgpumemhook.so").write_bytes(b"")
    return root


def _library_path_in(root: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("CARGO_TARGET_DIR", "PYTHONPATH")}
    env["PYTHONPATH"] = str(root / "python")
    return subprocess.run(
        [sys.executable, "-c", "import gpumemhook; print(gpumemhook.library_path())"],
        env=env,
        cwd=str(root),
        capture_output=True,
        text=True,
    )


def test_library_path_falls_back_to_the_checkouts_release_build(tmp_path):
    root = _fake_checkout(tmp_path, with_build=True)
    done = _library_path_in(root)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(root / "target" / "release" / "libgpumemhook.so")


def test_library_path_says_how_to_build_when_nothing_is_there(tmp_path):
    done = _library_path_in(_fake_checkout(tmp_path, with_build=False))
    assert done.returncode != 0
    assert "FileNotFoundError" in done.stderr
    assert "cargo build --release -p gpumemhook" in done.stderr


def _cli(runner, args, extra=None):
    env = runner.env(hooked=False, extra={"GPUMEMHOOK_PYTHON_CLI": "1", **(extra or {})})
    return subprocess.run(
        [sys.executable, "-m", "gpumemhook"] + args,
        env=env,
        cwd=str(runner.scratch),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_console_script_prints_the_library_path(runner):
    done = _cli(runner, ["library-path"])
    assert done.returncode == 0 and done.stdout.strip() == gpumemhook.library_path()


def test_python_fallback_runs_a_program_under_the_hook(runner):
    child = (
        "import gpumemhook; s = gpumemhook.stats(0); "
        "print(gpumemhook.is_hooked(), s.limit)"
    )
    done = _cli(runner, ["run", "--limit", "8MiB", "--", sys.executable, "-c", child])
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True {}".format(8 << 20)
    # A size without its unit is refused before anything runs, with the one parser's line.
    done = _cli(runner, ["run", "--limit", "8", "--", sys.executable, "-c", "print('ran')"])
    assert done.returncode == 2 and done.stdout == "", done
    assert done.stderr.strip() == "gpumemhook run: --limit: 8 what? write 8GiB, or 8B for bytes"
    done = _cli(runner, ["list"])
    assert done.returncode == 0 and done.stdout == ""
    assert done.stderr.strip() == "no hooked processes"
    done = _cli(runner, ["bogus"])
    assert done.returncode == 2 and "usage:" in done.stderr


def test_python_fallback_drops_a_second_copy_of_the_hook_from_ld_preload(runner):
    # A copy of the hook already preloaded (another install, say) would interpose too and count
    # every allocation twice: `run` puts its own first and leaves the other out, keeping the rest.
    child = "import os; print(os.environ['LD_PRELOAD'])"
    existing = "/elsewhere/libgpumemhook.so /opt/libother.so:/elsewhere/libgpumemhook.so"
    done = _cli(
        runner, ["run", "--", sys.executable, "-c", child], extra={"LD_PRELOAD": existing}
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == gpumemhook.library_path() + ":/opt/libother.so"


def test_preload_value_is_the_clis_rule():
    from gpumemhook import _native

    assert _native.preload_value(None, "/h/libgpumemhook.so") == "/h/libgpumemhook.so"
    assert _native.preload_value("", "/h/libgpumemhook.so") == "/h/libgpumemhook.so"
    assert (
        _native.preload_value("/a/liba.so /old/libgpumemhook.so:/b/libb.so", "/h/libgpumemhook.so")
        == "/h/libgpumemhook.so:/a/liba.so:/b/libb.so"
    )


def test_environment_names_come_from_the_reader():
    # The names users type: the module gives them, and they are the documented ones.
    from gpumemhook import _native

    names = {k: getattr(_native, k) for k in dir(_native) if k.startswith("ENV_")}
    assert names["ENV_LIMIT"] == "GPUMEMHOOK_LIMIT"
    assert names["ENV_LIB"] == "GPUMEMHOOK_LIB"
    assert names["ENV_PYTHON_CLI"] == "GPUMEMHOOK_PYTHON_CLI"
    assert all(v.startswith("GPUMEMHOOK_") for v in names.values())
    assert len(set(names.values())) == len(names)
    readme = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    for name in names.values():
        assert name in readme, "{} is not documented in docs/configuration.md".format(name)


def test_in_a_checkout_the_newer_of_bundled_and_built_wins(tmp_path):
    root = _fake_checkout(tmp_path, with_build=True)
    bundled = root / "python" / "gpumemhook" / "libgpumemhook.so"
    built = root / "target" / "release" / "libgpumemhook.so"
    bundled.write_bytes(b"")
    os.utime(built, (1_000_000, 1_000_000))
    assert _library_path_in(root).stdout.strip() == str(bundled)
    os.utime(bundled, (500_000, 500_000))
    assert _library_path_in(root).stdout.strip() == str(built)


def test_editable_install_takes_library_and_cli_from_target_not_the_package():
    """scripts/build/python-env's editable install bundles nothing into python/gpumemhook/ (the build
    writes only under target/, docs/building.md): the library and the CLI are cargo's release build."""
    from gpumemhook import _core

    root = _core._dev_checkout_root()
    if root is None:
        pytest.skip("gpumemhook is installed, not imported from a checkout")
    package = Path(gpumemhook.__file__).resolve().parent
    assert not (package / "libgpumemhook.so").exists()
    assert not (package / "bin").exists()
    target = Path(os.environ.get("CARGO_TARGET_DIR") or root / "target").resolve()
    assert Path(gpumemhook.library_path()).parent == target / "release"
    cli = _core.cli_path()
    assert cli is not None and Path(cli).parent == target / "release"
    said = subprocess.run(
        [sys.executable, "-m", "gpumemhook", "--version"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert said == "gpumemhook {}".format(gpumemhook.__version__)
