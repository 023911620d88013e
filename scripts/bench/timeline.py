#!/usr/bin/env python3
"""What the flight recorder costs and how fast its file reads back (issue 43).

    python3 scripts/bench/timeline.py --lib target/release/libgpumemhook.so --sim target/sim \
        --cli target/release/gpumemhook [--events 1000000,10000000] [--rounds 3]

For each number of events N: one simulated process (simrun over the stand-in driver) makes N
allocations and frees on one thread, `--rounds` times without a timeline and as many with one,
alternating, under the hook; wall time and peak resident memory of each run come from wait4. Then
`gpumemhook report` and `gpumemhook plot` read the last file, their wall time and peak resident
memory measured the same way. Printed as one table, never asserted. `scripts/bench/timeline`
builds everything and runs this.
"""
import argparse
import datetime
import os
import platform
import shutil
import statistics
import subprocess
import tempfile
import time

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--lib", required=True)
ap.add_argument("--sim", required=True, help="directory of the simulated stack (simrun, libcuda.so.1)")
ap.add_argument("--cli", required=True, help="the gpumemhook command")
ap.add_argument("--events", default="1000000,10000000", help="comma-separated numbers of events")
ap.add_argument("--rounds", type=int, default=3)
args = ap.parse_args()

tmp = tempfile.mkdtemp(prefix="bench-timeline-")
os.makedirs(os.path.join(tmp, "shm"))
trace = os.path.join(tmp, "t.trace")


def timed(argv, env=None):
    """Wall seconds and peak resident KiB of one command, its output thrown away."""
    start = time.perf_counter()
    p = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - start
    if status != 0:
        raise SystemExit("%s failed (status %d)" % (argv[0], status))
    return wall, usage.ru_maxrss


def record(events, with_trace):
    env = dict(os.environ, LD_PRELOAD=os.path.abspath(args.lib), LD_LIBRARY_PATH=os.path.abspath(args.sim),
               GPUMEMHOOK_SHM_DIR=os.path.join(tmp, "shm"), FAKECUDA_MEM_BYTES=str(1 << 40))
    env.pop("GPUMEMHOOK_TRACE", None)
    if with_trace:
        env["GPUMEMHOOK_TRACE"] = trace
    return timed([os.path.join(args.sim, "simrun"), "drv.init", "drv.ctx:0",
                  "threads:1:%d:7:4096" % events], env)


rows = []
for events in [int(n) for n in args.events.split(",")]:
    samples = {False: [], True: []}
    for r in range(args.rounds):
        for side in ((False, True) if r % 2 == 0 else (True, False)):
            samples[side].append(record(events, side))
    size = os.path.getsize(trace)
    med = statistics.median
    wall_without, wall_with = med(s[0] for s in samples[False]), med(s[0] for s in samples[True])
    rss_without, rss_with = med(s[1] for s in samples[False]), med(s[1] for s in samples[True])
    report = timed([args.cli, "report", trace])
    plot = timed([args.cli, "plot", trace, "-o", os.path.join(tmp, "t.png")])
    rows.append((events, size, wall_without, wall_with, rss_with - rss_without, report, plot))
    os.remove(trace)

cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.machine())
print("the flight recorder, %s UTC, %s, %d logical CPUs, load %s" % (
    datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"), cpu, os.cpu_count(),
    " ".join(open("/proc/loadavg").read().split()[:3])))
print("| events | file | bytes/event | run without | run with | added per event | peak RSS added "
      "| report | report RSS | plot | plot RSS |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for events, size, without, with_, rss, report, plot in rows:
    print("| %s | %.0f MiB | %.1f | %.2f s | %.2f s | %.0f ns | %.1f MiB | %.1f s | %.0f MiB | %.1f s | %.0f MiB |" % (
        format(events, ","), size / 2**20, size / events, without, with_, (with_ - without) * 1e9 / events,
        rss / 1024, report[0], report[1] / 1024, plot[0], plot[1] / 1024))
shutil.rmtree(tmp)
