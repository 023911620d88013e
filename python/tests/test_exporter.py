"""`gpumemhook exporter` read by Prometheus' own Python parsers: of the text format 0.0.4
(``prometheus_client.parser.text_string_to_metric_families``, what a client that does not ask for
OpenMetrics gets) and of OpenMetrics (``prometheus_client.openmetrics.parser``, strict, what
Prometheus asks for). Live hooked processes over the simulated CUDA stack, exact bytes against the
stand-in driver's own count, every label, processes appearing and disappearing, malformed requests.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

from gpumemhook import _native

# The variables the hook records as job labels: none inherited from the test's own environment.
JOB_VARIABLES = _native.JOB_VARIABLES


class Exporter:
    def __init__(self, cli: Path, env) -> None:
        self.proc = subprocess.Popen(
            [str(cli), "exporter", "--listen", "127.0.0.1:0"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        line = self.proc.stderr.readline()
        found = re.search(r"http://([0-9.]+):(\d+)/metrics", line)
        assert found, "no address in the exporter's first line: {!r}".format(line)
        self.host, self.port = found.group(1), int(found.group(2))

    def url(self, path: str = "/metrics") -> str:
        return "http://{}:{}{}".format(self.host, self.port, path)

    def scrape(self, openmetrics: bool = False) -> str:
        request = urllib.request.Request(self.url())
        if openmetrics:
            # What Prometheus 2.x sends.
            request.add_header(
                "Accept",
                "application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
                "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
            )
        with urllib.request.urlopen(request, timeout=20) as response:
            assert response.status == 200
            expected = "application/openmetrics-text" if openmetrics else "text/plain; version=0.0.4"
            assert response.headers["Content-Type"].startswith(expected)
            return response.read().decode("utf-8")

    def families(self, openmetrics: bool = False):
        parse = openmetrics_families if openmetrics else text_string_to_metric_families
        return {f.name: f for f in parse(self.scrape(openmetrics))}

    def raw(self, data: bytes) -> int:
        with socket.create_connection((self.host, self.port), timeout=20) as s:
            s.sendall(data)
            answer = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                answer += chunk
        return int(answer.split(b" ", 2)[1])

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.proc.stderr.close()


@pytest.fixture
def exporter(runner, cli_bin):
    e = Exporter(cli_bin, runner.env(hooked=False))
    yield e
    e.stop()


# A scenario that allocates, says what the stand-in driver holds, and waits to be let go.
HOLD = """
sizes = [int(s) for s in sys.argv[1].split(",")]
ptrs = [malloc(n) for n in sizes]
free(ptrs.pop(0))
print("pid={} driver={}".format(os.getpid(), driver_used(0)), flush=True)
touch(sys.argv[2] + ".ready")
wait_for(sys.argv[2] + ".go")
"""


def _hold(runner, name, sizes, env):
    """Starts the scenario with `sizes` (the first one freed again); returns (process, pid, driver)."""
    base = {k: "" for k in JOB_VARIABLES}
    base.update(env)
    clean = {k: v for k, v in base.items() if v != ""}
    full = runner.env(extra=clean)
    for k in JOB_VARIABLES:
        if k not in clean:
            full.pop(k, None)
    script = runner.script(HOLD)
    stem = str(runner.scratch / name)
    argv = [sys.executable, str(script), ",".join(map(str, sizes)), stem]
    proc = subprocess.Popen(
        argv,
        cwd=str(runner.scratch),
        env=full,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    fields = dict(w.split("=") for w in line.split())
    assert "pid" in fields, line + proc.stderr.read()
    deadline_ready = Path(stem + ".ready")
    while not deadline_ready.exists():
        assert proc.poll() is None, proc.stderr.read()
    proc.argv = argv
    return proc, int(fields["pid"]), int(fields["driver"]), stem


def _command_label(argv):
    """The exporter's `command` label: the program's file name and its arguments, 64 characters
    at most (63 and an ellipsis when cut)."""
    text = " ".join([os.path.basename(argv[0])] + argv[1:])
    return text if len(text) <= 64 else text[:63] + "\u2026"


def _let_go(proc, stem):
    Path(stem + ".go").touch()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err


def _samples(families, family, pid):
    return [
        s for s in families[family].samples if s.labels.get("pid") == str(pid)
    ]


@pytest.mark.parametrize("openmetrics", [False, True], ids=["text-0.0.4", "openmetrics"])
def test_a_scrape_parses_with_prometheus_parsers_with_exact_bytes_and_labels(
    runner, exporter, openmetrics
):
    rank0, pid0, driver0, stem0 = _hold(
        runner,
        "rank0",
        [1 << 20, 3 * (1 << 20) + 1],
        {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "job-7f3"},
    )
    rank1, pid1, driver1, stem1 = _hold(
        runner,
        "rank1",
        [7, 5 * (1 << 20) + 7, 11],
        {
            "RANK": "1",
            "LOCAL_RANK": "1",
            "WORLD_SIZE": "2",
            "TORCHELASTIC_RUN_ID": "job-7f3",
            "GPUMEMHOOK_LIMIT": "64MiB",
        },
    )
    families = exporter.families(openmetrics)
    # The stand-in driver counts each process's bytes itself: the exporter must say the same.
    for pid, driver, sizes in ((pid0, driver0, [3 * (1 << 20) + 1]), (pid1, driver1, [5 * (1 << 20) + 7, 11])):
        assert driver == sum(sizes)
        (used,) = _samples(families, "gpumemhook_used_bytes", pid)
        assert used.name == "gpumemhook_used_bytes"
        assert used.value == driver
        (peak,) = _samples(families, "gpumemhook_peak_bytes", pid)
        assert peak.value == driver + [1 << 20, 7][pid == pid1]
    (allocs,) = _samples(families, "gpumemhook_allocations", pid1)
    assert (allocs.name, allocs.value) == ("gpumemhook_allocations_total", 3)
    (frees,) = _samples(families, "gpumemhook_frees", pid1)
    assert frees.value == 1
    (denied,) = _samples(families, "gpumemhook_denied", pid1)
    assert denied.value == 0
    assert families["gpumemhook_allocations"].type == "counter"
    assert families["gpumemhook_used_bytes"].type == "gauge"
    (limit,) = _samples(families, "gpumemhook_limit_bytes", pid1)
    assert limit.value == 64 << 20
    assert _samples(families, "gpumemhook_limit_bytes", pid0) == []
    (used1,) = _samples(families, "gpumemhook_used_bytes", pid1)
    labels = dict(used1.labels)
    command = labels.pop("command")
    user = labels.pop("user")
    assert command == _command_label(rank1.argv)
    assert user
    assert labels == {
        "pid": str(pid1),
        "device": "0",
        "rank": "1",
        "local_rank": "1",
        "world_size": "2",
        "torchelastic_run_id": "job-7f3",
        "job_id": "torchrun:job-7f3",
    }
    assert families["gpumemhook_processes"].samples[0].value == 2
    _let_go(rank0, stem0)
    _let_go(rank1, stem1)


def test_processes_appear_and_then_disappear_from_the_scrape(runner, exporter):
    before = exporter.families()
    assert before["gpumemhook_used_bytes"].samples == []
    proc, pid, driver, stem = _hold(runner, "p", [1, 4096], {})
    during = exporter.families()
    (used,) = _samples(during, "gpumemhook_used_bytes", pid)
    assert used.value == driver == 4096
    assert "rank" not in used.labels and "job_id" not in used.labels
    _let_go(proc, stem)
    after = exporter.families()
    assert _samples(after, "gpumemhook_used_bytes", pid) == []
    assert after["gpumemhook_processes"].samples[0].value == 0


def test_a_job_named_by_its_user_wins_and_survives_both_parsers(runner, exporter):
    name = 'nightly "q" \\ , }'
    env = {"GPUMEMHOOK_JOB": name, "GPUMEMHOOK_RANK": "0", "RANK": "5", "SLURM_JOB_ID": "7"}
    proc, pid, driver, stem = _hold(runner, "nightly", [1, 4096], env)
    for openmetrics in (False, True):
        (used,) = _samples(exporter.families(openmetrics), "gpumemhook_used_bytes", pid)
        labels = dict(used.labels)
        for common in ("pid", "user", "command", "device"):
            labels.pop(common)
        assert labels == {"job_name": name, "rank": "0", "slurm_job_id": "7", "job_id": name}
    _let_go(proc, stem)


def test_malformed_requests_get_4xx_and_only_metrics_is_served(exporter):
    assert exporter.raw(b"this is not http\r\n\r\n") == 400
    assert exporter.raw(b"GET /metrics HTTP/1.1\r\nBad Header Line\r\n\r\n") == 400
    assert exporter.raw(b"PUT /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n") == 405
    for path in ("/", "/api/v1/query", "/metrics.json"):
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(exporter.url(path), timeout=20)
        assert e.value.code == 404
    # The exporter still serves after all of that.
    assert "\ngpumemhook_processes 0\n" in exporter.scrape()
    assert exporter.scrape(openmetrics=True).endswith("\ngpumemhook_processes 0\n# EOF\n")
