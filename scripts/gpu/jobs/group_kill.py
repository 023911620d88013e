#!/usr/bin/env python3
"""Checks a group under a kill on a real GPU (issue 40, docs/groups.md "Under kills"): two PyTorch
processes in one group under `--emulate t4`; the first holds 4 GiB, the second 2 GiB; the first is
SIGKILLed. Right after, one read of the group (`gpumemhook group NAME --json`, which sweeps) must
give `used` equal to the survivor's own bytes in the group and to its process `used` (`gpumemhook
ls --json`), to the byte, with one member left; and the survivor may then take 10 GiB, which fits
the T4 only once the dead member's 4 GiB are given back.

    GPUMEMHOOK_LIB=.gpu/libgpumemhook.so GPUMEMHOOK_CLI=.gpu/gpumemhook python3 scripts/gpu/jobs/group_kill.py

Prints a short table last; exit 0 when every check holds.
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

GIB = 1 << 30

MEMBER = textwrap.dedent(
    """
    import json, os, sys, time
    import torch

    d, role = sys.argv[1], sys.argv[2]
    torch.cuda.init()
    def wait_for(path):
        while not os.path.exists(path):
            time.sleep(0.01)
    if role == "victim":
        held = torch.empty(4 << 30, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        open(d + "/victim.ready", "w").close()
        time.sleep(600)
    else:
        held = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        open(d + "/survivor.ready", "w").close()
        wait_for(d + "/more")
        try:
            more = torch.empty(10 << 30, dtype=torch.uint8, device="cuda")
            took = True
        except torch.OutOfMemoryError:
            took = False
        print("RESULT " + json.dumps({"took_10_gib": took}), flush=True)
    """
)


def cli(*args):
    out = subprocess.run([os.environ["GPUMEMHOOK_CLI"], *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit("gpumemhook {}: {}".format(" ".join(args), out.stderr))
    return json.loads(out.stdout)


def main() -> int:
    group = "gpu-kill-{}".format(os.getpid())
    with tempfile.TemporaryDirectory() as d:
        script = os.path.join(d, "member.py")
        with open(script, "w") as f:
            f.write(MEMBER)
        env = dict(os.environ, LD_PRELOAD=os.environ["GPUMEMHOOK_LIB"], GPUMEMHOOK_GROUP=group,
                   GPUMEMHOOK_EMULATE="t4")
        victim = subprocess.Popen([sys.executable, script, d, "victim"], env=env)
        survivor = subprocess.Popen([sys.executable, script, d, "survivor"], env=env,
                                    stdout=subprocess.PIPE, text=True)
        for name in ("victim.ready", "survivor.ready"):
            while not os.path.exists(os.path.join(d, name)):
                time.sleep(0.05)
        before = cli("group", group, "--json")["devices"][0]
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        started = time.monotonic()
        after = cli("group", group, "--json")["devices"][0]
        read_s = time.monotonic() - started
        procs = {p["pid"]: p for p in cli("ls", "--json")}
        own = procs[survivor.pid]["devices"][0]["used"] if survivor.pid in procs else None
        open(os.path.join(d, "more"), "w").close()
        out, _ = survivor.communicate(timeout=300)
        took = json.loads([l for l in out.splitlines() if l.startswith("RESULT ")][-1][7:])
    members = {m["pid"]: m["bytes"] for m in after["members"]}
    checks = [
        ("group used before the kill", before["used"], "victim + survivor",
         len(before["members"]) == 2),
        ("group used right after the kill", after["used"], "survivor's group bytes {}".format(members.get(survivor.pid)),
         after["used"] == members.get(survivor.pid) and len(members) == 1),
        ("survivor's process used (ls)", own, "equals the group's used", own == after["used"]),
        ("read after the kill, seconds", round(read_s, 3), "< 2", read_s < 2),
        ("survivor then takes 10 GiB on the T4", took["took_10_gib"], "True", took["took_10_gib"]),
    ]
    print("\n{:<40} {:>16}  {:<28} {}".format("CHECK", "VALUE", "EXPECTED", "OK"))
    for name, value, expected, ok in checks:
        print("{:<40} {:>16}  {:<28} {}".format(name, str(value), expected, "yes" if ok else "NO"))
    return 0 if all(c[3] for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
