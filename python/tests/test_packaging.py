"""The wheel (opt-in, slow: set GPUMEMHOOK_TEST_WHEEL=1): `maturin build --release` gives one abi3
wheel (cp39-abi3) holding the native module, the stubs, py.typed, the preload library and the pytest
plugin with its entry point, and it installs into a fresh virtual environment whose `library_path()`
lies inside site-packages."""

from __future__ import annotations

import configparser
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    not os.environ.get("GPUMEMHOOK_TEST_WHEEL"), reason="slow; set GPUMEMHOOK_TEST_WHEEL=1"
)


def test_abi3_wheel_contents_and_a_fresh_install(tmp_path):
    out = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "maturin", "build", "--release", "--out", str(out)],
        cwd=ROOT,
        check=True,
    )
    (wheel,) = out.glob("*.whl")
    assert "-cp39-abi3-" in wheel.name, wheel.name
    names = set(zipfile.ZipFile(wheel).namelist())
    for required in (
        "gpumemhook/__init__.py",
        "gpumemhook/mem.py",
        "gpumemhook/zeta.py",
        "gpumemhook/ipython.py",
        "gpumemhook/__main__.py",
        "gpumemhook/pytest_plugin.py",
        "gpumemhook/_native.abi3.so",
        "gpumemhook/_native.pyi",
        "gpumemhook/py.typed",
        "gpumemhook/libgpumemhook.so",
    ):
        assert required in names, (required, sorted(names))
    assert not any(n.startswith("gpumemhook/tests") for n in names)
    # The pytest plugin is registered for pytest to find once the wheel is installed.
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    parsed = configparser.ConfigParser()
    parsed.read_string(zipfile.ZipFile(wheel).read(entry_points).decode())
    assert parsed["pytest11"]["gpumemhook"] == "gpumemhook.pytest_plugin"

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", str(wheel)],
        check=True,
    )
    done = subprocess.run(
        [str(python), "-c", "import gpumemhook, os; p = gpumemhook.library_path(); print(p, os.path.isfile(p))"],
        cwd=str(tmp_path),
        capture_output=True,
        text=True,
        check=True,
    )
    path, exists = done.stdout.split()
    assert exists == "True" and "site-packages/gpumemhook/libgpumemhook.so" in path
    assert (venv / "bin" / "gpumemhook").exists()
