"""The timeline (`GPUMEMHOOK_TRACE`) of a program that changes its own ceiling (`set_limit`) and
restarts its peak (`reset_peak`) from Python: both are events of the timeline, and `gpumemhook
report` of it states the peak and ceiling of the exit report, over the simulated CUDA stack."""

from __future__ import annotations

import json
import subprocess


def test_set_limit_and_reset_peak_from_python_are_on_the_timeline(runner, cli_bin, timeline_events):
    trace = runner.scratch / "t.json"
    report = runner.scratch / "report.json"
    runner.run(
        """
        import gpumemhook
        a = malloc(3 * MiB)
        free(a)
        b = malloc(MiB)
        gpumemhook.set_limit(2 * MiB, 0)
        gpumemhook.reset_peak(0)
        c = malloc(MiB // 2)
        # After the last allocation: the ceiling at exit must still be the timeline's last.
        gpumemhook.set_limit(3 * MiB, 0)
        """,
        env={"GPUMEMHOOK_TRACE": str(trace), "GPUMEMHOOK_REPORT": str(report)},
    )
    exit_report = json.loads(report.read_text())
    device = next(d for d in exit_report["devices"] if d["device"] == 0)
    assert (device["peak"], device["limit"]) == (3 << 19, 3 << 20)
    events = timeline_events(trace)
    ceilings = [e["args"]["limit"] for e in events if e.get("name") == "device 0 limit"]
    assert ceilings == [0, 2 << 20, 3 << 20]
    assert sum(1 for e in events if e.get("cat") == "reset_peak") == 1
    out = subprocess.run(
        [str(cli_bin), "report", str(trace)], capture_output=True, text=True, check=True
    ).stdout
    row = next(line for line in out.splitlines() if line.strip().startswith("0 "))
    assert "1.50 MiB" in row and "3.00 MiB" in row, out
    assert "device 0 peak restarted at +" in out and "4.00 MiB over the whole run" not in out, out
    assert "3.00 MiB over the whole run" in out, out
