#!/usr/bin/env python3
"""What each reader of a timeline takes, in wall time and peak resident memory (issue 49, item 2).

    python3 scripts/bench/readers.py --lib target/release/libgpumemhook.so --sim target/sim \
        --cli target/release/gpumemhook [--events 1000000,10000000] [--commands report,view]

For each number of events N: one simulated process (simrun over the stand-in driver, one thread)
makes N allocations and frees under the hook, its timeline written; then each command reads that
file once, alone, its wall time and peak resident memory (wait4's ru_maxrss, from this small
process, so that no larger parent's peak is counted) measured. Printed as one table, never
asserted. `scripts/bench/readers` builds everything and runs this.
"""
import argparse
import datetime
import os
import platform
import shutil
import subprocess
import tempfile
import time

COMMANDS = {
    "report": ["report", "{t}"],
    "plot": ["plot", "{t}", "-o", "{d}/p.png"],
    "view": ["view", "{t}", "-o", "{d}/v.html"],
    "export --perfetto": ["export", "{t}", "--perfetto", "{d}/e.pftrace"],
    "export --chrome": ["export", "{t}", "--chrome", "{d}/e.json"],
    "export --pytorch": ["export", "{t}", "--pytorch", "{d}/e.pickle"],
}

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--lib", required=True)
ap.add_argument("--sim", required=True, help="directory of the simulated stack (simrun, libcuda.so.1)")
ap.add_argument("--cli", required=True, help="the gpumemhook command")
ap.add_argument("--events", default="1000000,10000000", help="comma-separated numbers of events")
ap.add_argument("--commands", default=",".join(c.split()[-1].lstrip("-") for c in COMMANDS),
                help="which readers: report, plot, view, perfetto, chrome, pytorch")
args = ap.parse_args()
chosen = [c for c in COMMANDS if c.split()[-1].lstrip("-") in args.commands.split(",")]

tmp = tempfile.mkdtemp(prefix="bench-readers-")
os.makedirs(os.path.join(tmp, "shm"))
trace = os.path.join(tmp, "t.trace")


def timed(argv, env=None):
    """Wall seconds and peak resident KiB of one command, its output thrown away."""
    start = time.perf_counter()
    p = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - start
    if status != 0:
        raise SystemExit("%s failed (status %d)" % (" ".join(argv), status))
    return wall, usage.ru_maxrss


def record(events):
    env = dict(os.environ, LD_PRELOAD=os.path.abspath(args.lib), LD_LIBRARY_PATH=os.path.abspath(args.sim),
               GPUMEMHOOK_SHM_DIR=os.path.join(tmp, "shm"), FAKECUDA_MEM_BYTES=str(1 << 40),
               GPUMEMHOOK_TRACE=trace)
    timed([os.path.join(args.sim, "simrun"), "drv.init", "drv.ctx:0", "threads:1:%d:7:4096" % events], env)


rows = []
for events in [int(n) for n in args.events.split(",")]:
    record(events)
    size = os.path.getsize(trace)
    for command in chosen:
        argv = [args.cli] + [a.format(t=trace, d=tmp) for a in COMMANDS[command]]
        rows.append((events, size, command) + timed(argv))
    os.remove(trace)

cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.machine())
print("the readers, %s UTC, %s, %d logical CPUs, load %s" % (
    datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"), cpu, os.cpu_count(),
    " ".join(open("/proc/loadavg").read().split()[:3])))
print("| events | file | command | wall | peak RSS |")
print("|---|---|---|---|---|")
for events, size, command, wall, rss in rows:
    print("| %s | %.0f MiB | `%s` | %.1f s | %.0f MiB |" % (format(events, ","), size / 2**20, command, wall, rss / 1024))
shutil.rmtree(tmp)
