"""Who holds the memory, from Python: `gpumemhook.breakdown()` names the shared object that asked
for each byte, and `GPUMEMHOOK_STACKS=python:<bytes>` puts the Python frames of each large
allocation into the leak report, over the simulated CUDA stack (more in test_sites.py)."""

from __future__ import annotations

import json
import re

import gpumemhook

COLLECTIVE = """
assert _rt.cudaSetDevice(0) == 0  # a current context, which the driver API needs
# PyDLL keeps the GIL during the call, as a C extension that allocates under it does (CuPy's
# allocator); CDLL (the prelude's `malloc`) releases it, as PyTorch's operators do.
lib = ctypes.PyDLL("libfakecollective.so")
lib.fakecollective_alloc.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]

def allocate_weights(nbytes):
    p = ctypes.c_uint64()
    assert lib.fakecollective_alloc(ctypes.byref(p), nbytes) == 0
    return p.value
"""


def test_breakdown_names_the_library_that_asked_and_adds_up_to_used(runner):
    out = runner.run(
        COLLECTIVE
        + """
import gpumemhook
w = allocate_weights(3 * MiB)
a = malloc(1 * MiB)
rows = gpumemhook.breakdown()
assert sum(r[1] for r in rows) == gpumemhook.used() == driver_used(), (rows, driver_used())
print(repr(rows))
print("device1", gpumemhook.breakdown(1))
"""
    )
    rows = eval(out.stdout.splitlines()[0])
    assert rows[0] == ("libfakecollective.so", 3 << 20, 3 << 20, 1)
    # ctypes.CDLL("libcudart.so.13").cudaMalloc is the runtime's own function (dlsym on its handle),
    # not the hook's shadow: the driver wrapper beneath charges the runtime, its caller (a known limit).
    assert rows[1] == ("libcudart.so.13", 1 << 20, 1 << 20, 1), rows
    assert len(rows) == 2, rows
    assert out.stdout.splitlines()[1] == "device1 []"


def test_python_sites_are_recorded_from_the_threshold_on_and_listed_in_the_leak_report(runner, tmp_path):
    report = tmp_path / "report.json"
    runner.run(
        COLLECTIVE
        + """
def build_model():
    return allocate_weights(2 * MiB)

model = build_model()
big = malloc(1 * MiB)
small = malloc(1000)
""",
        env={"GPUMEMHOOK_STACKS": "python:1MiB", "GPUMEMHOOK_REPORT": str(report)},
    )
    r = json.loads(report.read_text())
    sites = {a["bytes"]: a.get("site") for a in r["live"]}
    assert set(sites) == {2 << 20, 1 << 20, 1000}, sites
    assert re.fullmatch(r".*scenario\d+\.py:\d+ in allocate_weights < .* in build_model < .*", sites[2 << 20]), sites
    # Made with the GIL released (ctypes.CDLL): read without it all the same.
    assert re.fullmatch(r".*scenario\d+\.py:\d+ in malloc < .*scenario\d+\.py:\d+ in <module>", sites[1 << 20]), sites
    assert sites[1000] is None, "below the threshold: no site"
    modules = {a["bytes"]: a["module"] for a in r["live"]}
    assert modules[2 << 20] == "libfakecollective.so"
    by_module = r["devices"][0]["by_module"]
    assert by_module[0]["module"] == "libfakecollective.so"
    assert sum(m["used"] for m in by_module) == r["devices"][0]["used"]


def test_a_bad_stacks_setting_stops_the_program_at_load_naming_the_variable(runner):
    out = runner.run("print('ran')", env={"GPUMEMHOOK_STACKS": "native:1MiB"}, expect_rc=2)
    assert "ran" not in out.stdout
    assert "GPUMEMHOOK_STACKS" in out.stderr and "python:" in out.stderr


def test_breakdown_without_the_hook_raises_not_hooked(runner):
    runner.run(
        """
import gpumemhook
try:
    gpumemhook.breakdown()
except gpumemhook.NotHookedError:
    print("not hooked")
else:
    raise SystemExit("expected NotHookedError")
""",
        hooked=False,
    )


def test_breakdown_is_exported():
    assert "breakdown" in gpumemhook.__all__


def test_an_out_of_memory_report_per_step_when_re_armed(runner, tmp_path):
    runner.run(
        """
import gpumemhook
gpumemhook.set_limit("1MiB")
keep = malloc(512 * 1024)
for step in range(3):
    if step != 1:
        assert gpumemhook.arm_oom_report() is True
    malloc(2 * MiB, expect=2)
    malloc(3 * MiB, expect=2)   # a retry in the same step writes nothing more
""",
        env={"GPUMEMHOOK_OOM_REPORT": str(tmp_path / "oom.%n.json")},
    )
    names = sorted(p.name for p in tmp_path.glob("oom.*.json"))
    # Step 0 (armed at start anyway) and step 2 (re-armed); step 1 was not re-armed.
    assert names == ["oom.0.json", "oom.1.json"], names
    for name in names:
        oom = json.loads((tmp_path / name).read_text())["oom"]
        assert (oom["bytes"], oom["reason"], oom["used"]) == (2 << 20, "ceiling", 512 * 1024)


def test_arm_oom_report_says_when_no_report_was_asked_for(runner):
    runner.run(
        """
import gpumemhook
malloc(4096)
assert gpumemhook.arm_oom_report() is False
"""
    )


def test_report_json_lists_the_live_allocations_now_in_process_only(runner):
    out = runner.run(
        COLLECTIVE
        + """
import json, gpumemhook
w = allocate_weights(3 * MiB)
a = malloc(1 * MiB)
b = malloc(2 * MiB)
free(b)
report = json.loads(gpumemhook.current().report_json())
print(json.dumps([(x["bytes"], x["module"], x.get("site")) for x in report["live"]]))
print(report["devices"][0]["used"] == driver_used())
try:
    gpumemhook.attach(os.getpid()).report_json()
except gpumemhook.NotHookedError:
    print("attached: no report")
""",
        env={"GPUMEMHOOK_STACKS": "python:2MiB"},
    )
    lines = out.stdout.splitlines()
    live = json.loads(lines[0])
    assert [(n, m) for n, m, _ in live] == [
        (3 << 20, "libfakecollective.so"),
        (1 << 20, "libcudart.so.13"),
    ]
    # The innermost frame first; its callers follow (GPUMEMHOOK_STACKS' depth, 3 by default).
    assert re.fullmatch(r".*scenario\d+\.py:\d+ in allocate_weights < .* in <module>", live[0][2]), live
    assert live[1][2] is None
    assert lines[1:] == ["True", "attached: no report"]


def test_a_module_a_python_distribution_installed_is_shown_by_its_package(runner, sim_dir, tmp_path):
    # A site-packages of a distribution that ships the stand-in collective library, as torch ships
    # libc10_cuda.so; its RECORD lists the file.
    import shutil
    import subprocess

    site = tmp_path / "env" / "lib" / "python3" / "site-packages"
    (site / "fakecoll" / "lib").mkdir(parents=True)
    so = site / "fakecoll" / "lib" / "libfakecollective.so"
    shutil.copy(sim_dir / "libfakecollective.so", so)
    info = site / "fake_collective-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-collective\nVersion: 1.0\n")
    (info / "RECORD").write_text("fakecoll/__init__.py,,\nfakecoll/lib/libfakecollective.so,,\n")
    report = tmp_path / "report.json"
    runner.run(
        """
assert _rt.cudaSetDevice(0) == 0
lib = ctypes.CDLL({!r})
p = ctypes.c_uint64()
assert lib.fakecollective_alloc(ctypes.byref(p), 3 * MiB) == 0
""".format(str(so)),
        env={"GPUMEMHOOK_REPORT": str(report)},
    )
    r = json.loads(report.read_text())
    assert r["live"][0]["module"] == "libfakecollective.so", "the report keeps the file name"
    text = subprocess.run(
        [str(runner.hook.parent / "gpumemhook"), "report", str(report)],
        capture_output=True, text=True, check=True,
    ).stdout
    assert "fake-collective (libfakecollective.so)" in text, text
