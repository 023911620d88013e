#!/usr/bin/env python3
"""What writing the timeline costs at exit (issue 9's goal: at most 32 MiB of memory beyond the
event buffer, and 200 ns per event: 4 million events in under 2 s).

    python3 scripts/bench/timeline.py --lib target/release/libgpumemhook.so --sim target/sim [--events N]

One simulated process (simrun over the stand-in driver) makes N allocations and frees on one thread
(N events, default 4,000,000), three times without a timeline and three times with one, alternating,
under the hook. Wall time and peak resident memory of each run come from wait4 (resource usage of the
child). What the timeline adds = with minus without (medians); its buffer (56 bytes an event, filled
while the program runs) is shown apart, and the rest of the memory is the exit's own. Printed, never
asserted. `scripts/bench/timeline` builds everything and runs this.
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import tempfile
import time

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--lib", required=True)
ap.add_argument("--sim", required=True, help="directory of the simulated stack (simrun, libcuda.so.1)")
ap.add_argument("--events", type=int, default=4_000_000)
ap.add_argument("--rounds", type=int, default=3)
args = ap.parse_args()

tmp = tempfile.mkdtemp(prefix="bench-timeline-")
os.makedirs(os.path.join(tmp, "shm"))
trace = os.path.join(tmp, "t.json")


def run(with_trace):
    env = dict(os.environ, LD_PRELOAD=os.path.abspath(args.lib), LD_LIBRARY_PATH=os.path.abspath(args.sim),
               GPUMEMHOOK_SHM_DIR=os.path.join(tmp, "shm"), FAKECUDA_MEM_BYTES=str(1 << 40))
    if with_trace:
        env.update(GPUMEMHOOK_TRACE=trace, GPUMEMHOOK_TRACE_EVENTS=str(args.events + 1000))
    start = time.perf_counter()
    p = subprocess.Popen([os.path.join(args.sim, "simrun"), "drv.init", "drv.ctx:0",
                          "threads:1:%d:7:4096" % args.events], env=env, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - start
    if status != 0:
        raise SystemExit("simrun failed (status %d)" % status)
    return wall, usage.ru_maxrss  # KiB on Linux


samples = {False: [], True: []}
for r in range(args.rounds):
    for side in ((False, True) if r % 2 == 0 else (True, False)):
        samples[side].append(run(side))
with open(trace) as f:
    recorded = sum(1 for e in json.load(f)["traceEvents"] if e.get("ph") == "i")
size = os.path.getsize(trace)
med = statistics.median
wall_without, wall_with = med(s[0] for s in samples[False]), med(s[0] for s in samples[True])
rss_without, rss_with = med(s[1] for s in samples[False]), med(s[1] for s in samples[True])
added = wall_with - wall_without
buffer_kib = recorded * 56 / 1024
own_mib = (rss_with - rss_without - buffer_kib) / 1024
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.machine())
print("timeline at exit, %s UTC, %s, %d logical CPUs, load %s" % (
    datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"), cpu, os.cpu_count(),
    " ".join(open("/proc/loadavg").read().split()[:3])))
print("| events | file | wall without | wall with | added | added per event | peak RSS added | buffer | exit's own memory |")
print("|---|---|---|---|---|---|---|---|---|")
print("| %s | %.0f MiB | %.2f s | %.2f s | %.2f s | %.0f ns | %.1f MiB | %.1f MiB | %.1f MiB |" % (
    format(recorded, ","), size / 2**20, wall_without, wall_with, added, added * 1e9 / recorded,
    (rss_with - rss_without) / 1024, buffer_kib / 1024, own_mib))
print("goals: exit's own memory <= 32 MiB: %s; <= 200 ns per event, recording and writing together: %s%s" % (
    "met" if own_mib <= 32 else "MISSED", "met" if added * 1e9 / recorded <= 200 else "MISSED",
    "; 4M events in < 2 s: %s" % ("met" if added < 2 else "MISSED") if recorded >= 4_000_000 else ""))
subprocess.run(["rm", "-rf", tmp])
