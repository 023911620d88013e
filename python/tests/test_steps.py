"""The steps of `scripts/test` and `scripts/demo` (`scripts/lib/steps`, sourced by both): run with a
clock on their output, a slow fake step is never silent longer than its ticker's interval, says what
it does first and how long it took last, and its ticker never outlives it."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path
from typing import List, Tuple

ROOT = Path(__file__).resolve().parents[2]
STEPS = ROOT / "scripts" / "lib" / "steps"


def clocked(script: str, tick: float) -> Tuple[List[Tuple[float, str]], float, int]:
    """Runs `script` in bash after sourcing the steps, with the ticker every `tick` seconds: each
    line of its output with the seconds since the start when it came, the seconds until its output
    ended (every writer gone), and its exit status."""
    env = dict(os.environ, GPUMEMHOOK_STEP_TICK_S=str(tick))
    start = time.monotonic()
    child = subprocess.Popen(
        ["bash", "-c", 'set -euo pipefail; source "$0"; ' + script, str(STEPS)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    assert child.stdout is not None
    lines = [(time.monotonic() - start, line.rstrip("\n")) for line in child.stdout]
    ended = time.monotonic() - start
    return lines, ended, child.wait()


def test_a_slow_step_says_what_it_does_that_it_is_still_going_and_how_long_it_took():
    script = 'step "a slow fake step"; sleep 4.2; step "a quick one"; true'
    lines, ended, status = clocked(script, 1)
    assert status == 0, lines
    text = [line for _, line in lines if line]
    assert text[0] == "== a slow fake step", text
    # No time in the header (it read as a duration); the ticks count up; the end says how long.
    ticks = [line for line in text if line.startswith("   ... still going")]
    assert ticks[:3] == [
        "   ... still going after {} s: a slow fake step".format(n) for n in (1, 2, 3)
    ], text
    # Whole seconds of bash's clock: 4.2 s reads 4 or 5 as it falls across their ticks.
    slow_done = re.compile(r"   done in [45] s: a slow fake step")
    ends = [i for i, line in enumerate(text) if slow_done.fullmatch(line)]
    assert ends and ends[0] < text.index("== a quick one"), text
    assert re.fullmatch(r"   done in [01] s: a quick one", text[-1]), text
    # The clock: never more than the ticker's interval (and a margin for a loaded machine) without a
    # line, from the start to the end of the output.
    times = [0.0] + [at for at, _ in lines] + [ended]
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert max(gaps) < 2.5, list(zip(gaps, text))


def test_the_ticker_goes_with_its_step_and_a_failed_step_says_so_with_its_status():
    # A 30 s ticker on a step that ends at once: the output ends with the script (no ticker, nor
    # its sleep, keeps it open), and the failure's status is the script's.
    lines, ended, status = clocked('step "fails"; sleep 0.3; exit 3', 30)
    assert status == 3, lines
    assert ended < 5, (ended, lines)
    text = [line for _, line in lines if line]
    assert text[0] == "== fails" and len(text) == 2, text
    assert re.fullmatch(r"   stopped after [01] s \(exit status 3\): fails", text[1]), text


def shell_scripts() -> List[Path]:
    """Every shell script under scripts/ (its first line names bash)."""
    found = []
    for path in sorted((ROOT / "scripts").rglob("*")):
        if path.is_file() and path.suffix == "":
            with path.open("rb") as f:
                if b"bash" in f.readline():
                    found.append(path)
    return found


def test_no_script_prints_its_elapsed_time_in_a_step_header():
    # A header such as `== tools (0s)` reads as the step's duration; scripts/lib/steps says the
    # elapsed time at a step's end. A script's own `step` helper that prints `== ` with `$SECONDS`
    # is the old form: the script should source scripts/lib/steps instead.
    scripts = shell_scripts()
    assert ROOT / "scripts" / "build" / "wheels" in scripts, scripts
    own_timed_headers = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in scripts
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if "== " in line and "SECONDS" in line
    ]
    assert own_timed_headers == [], "\n".join(own_timed_headers)
