#!/usr/bin/env python3
"""Writes a synthetic timeline of N allocation events as Chrome JSON (the format of
reader/timeline/src/chrome_writer.rs), for scripts/bench/view: one device, three modules, 40 Python
call sites over 8 threads, buffers of 1 KiB to 64 MiB allocated and freed in a random walk around
2 GiB held, scopes every 10 000 events, one peak restart and one ceiling change.

  bench/view.py N OUT.json
"""

import random
import sys

n, out = int(sys.argv[1]), sys.argv[2]
rng = random.Random(35)
modules = ["libc10_cuda.so", "libcublasLt.so.12", "libnccl.so.2"]
sites = [f"model.py:{100 + i} in layer_{i} < train.py:{40 + i % 5} in step < train.py:90 in main"
         for i in range(40)]
with open(out, "w") as f:
    f.write('{"displayTimeUnit":"ms","traceEvents":[{"ph":"M","name":"process_name","pid":7,'
            '"args":{"name":"python train.py (synthetic)"}}')
    ts, used, live, events, address, scope = 1_000_000.0, 0, [], 0, 0x7f0000000000, 0
    f.write(',\n{"ph":"C","ts":%.3f,"pid":7,"name":"device 0 limit","args":{"limit":0}}' % ts)
    while events < n:
        ts += rng.expovariate(1 / 3.0)
        if events % 10000 == 0:
            if scope:
                f.write(',\n{"ph":"e","ts":%.3f,"pid":7,"cat":"scope","id":1,"tid":7,"name":"step %d"}' % (ts, scope - 1))
            f.write(',\n{"ph":"b","ts":%.3f,"pid":7,"cat":"scope","id":1,"tid":7,"name":"step %d"}' % (ts, scope))
            scope += 1
        if events == n // 2:
            f.write(',\n{"ph":"C","ts":%.3f,"pid":7,"name":"device 0 limit","args":{"limit":8589934592}}' % ts)
            f.write(',\n{"ph":"i","ts":%.3f,"pid":7,"s":"g","cat":"reset_peak","tid":7,"name":"reset_peak","args":{"device":0}}' % ts)
        if live and (used > (2 << 30) or rng.random() < 0.5):
            i = rng.randrange(len(live))
            live[i], live[-1] = live[-1], live[i]
            addr, size, mod, site, tid = live.pop()
            used -= size
            cat, name = "free", "cudaFree"
        else:
            size = 1 << rng.randrange(10, 27)
            address += size
            addr, mod, site, tid = address, rng.randrange(3), rng.randrange(40), 7 + rng.randrange(8)
            live.append((addr, size, mod, site, tid))
            used += size
            cat, name = "alloc", "cudaMalloc"
        f.write(',\n{"ph":"i","ts":%.3f,"pid":7,"cat":"%s","tid":%d,"name":"%s","args":{"device":0,'
                '"bytes":%d,"used":%d,"address":"0x%x","module":"%s","site":"%s"}}'
                % (ts, cat, tid, name, size, used, addr, modules[mod], sites[site]))
        f.write(',\n{"ph":"C","ts":%.3f,"pid":7,"name":"device 0 used","args":{"used":%d}}' % (ts, used))
        events += 1
    f.write(',\n{"ph":"M","name":"gpumemhook","pid":7,"args":{"limits":{"0":8589934592},"events":%d,'
            '"dropped":0,"end":%.3f}}]}\n' % (events, ts))
