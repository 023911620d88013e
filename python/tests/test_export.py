"""`gpumemhook export`: a timeline recorded over the simulated CUDA stack, exported for Perfetto
and for PyTorch's memory viewer, read back by their own readers: the Perfetto project's protobuf
classes (the `perfetto` package; its trace processor is a download of its own, so the classes stand
in for it) and `pickle`, with `torch.cuda._memory_viz` too when torch can be imported. The peak of
each, replayed, is the exit report's."""

from __future__ import annotations

import json
import pickle
import subprocess

import pytest

# A scope around two allocations, a free, a ceiling the next allocation is refused by, one more.
SCENARIO = """
import gpumemhook
with gpumemhook.scope("build"):
    a = malloc(3 * MiB)
    b = malloc(MiB)
free(a)
gpumemhook.set_limit(4 * MiB, 0)
malloc(8 * MiB, expect=2)
c = malloc(2 * MiB)
"""


@pytest.fixture
def exported(runner, cli_bin):
    trace = runner.scratch / "t.json"
    report = runner.scratch / "report.json"
    runner.run(
        SCENARIO,
        env={
            "GPUMEMHOOK_TRACE": str(trace),
            "GPUMEMHOOK_REPORT": str(report),
            "GPUMEMHOOK_STACKS": "python:1MiB",
        },
    )
    perfetto, snapshot = runner.scratch / "t.pftrace", runner.scratch / "t.pickle"
    done = subprocess.run(
        [str(cli_bin), "export", str(trace), "--perfetto", str(perfetto), "--pytorch", str(snapshot)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2 and lines[0].startswith(str(perfetto) + ": Perfetto"), done.stdout
    assert lines[1].startswith(str(snapshot) + ": PyTorch"), done.stdout
    device = next(d for d in json.loads(report.read_text())["devices"] if d["device"] == 0)
    return perfetto, snapshot, device


def test_the_perfetto_trace_reads_with_perfettos_own_classes(exported):
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    path, _, device = exported
    trace = pb.Trace()
    trace.ParseFromString(path.read_bytes())
    packets = list(trace.packet)
    assert packets[0].sequence_flags == pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
    assert packets[0].track_descriptor.process.pid > 0
    assert all(p.trusted_packet_sequence_id == 1 for p in packets)
    tracks = {}
    events = []
    for p in packets:
        if p.HasField("track_descriptor"):
            tracks[p.track_descriptor.uuid] = p.track_descriptor
        else:
            assert p.HasField("track_event")
            assert p.track_event.track_uuid in tracks, "a track is described before its events"
            events.append((p.timestamp, p.track_event))
    used = next(u for u, d in tracks.items() if d.name == "device 0 used")
    assert tracks[used].counter.unit == pb.CounterDescriptor.UNIT_SIZE_BYTES
    values = [e.counter_value for _, e in events if e.track_uuid == used]
    assert max(values) == device["peak"] == 4 << 20, values
    assert values[-1] == device["used"]
    ceiling = next(u for u, d in tracks.items() if d.name == "device 0 ceiling")
    assert [e.counter_value for _, e in events if e.track_uuid == ceiling][-1] == 4 << 20
    begins = [e.name for _, e in events if e.type == pb.TrackEvent.TYPE_SLICE_BEGIN]
    ends = [e for _, e in events if e.type == pb.TrackEvent.TYPE_SLICE_END]
    assert begins == ["build"] and len(ends) == 1
    instants = [e.name for _, e in events if e.type == pb.TrackEvent.TYPE_INSTANT]
    assert instants == ["8.00 MiB refused by the ceiling"], instants


def test_the_pytorch_snapshot_replays_to_the_peak(exported):
    _, path, device = exported
    with open(path, "rb") as f:
        snapshot = pickle.load(f)
    assert set(snapshot) == {"segments", "device_traces"}
    trace = snapshot["device_traces"][0]
    for e in trace:
        assert {"action", "size", "stream", "time_us", "frames"} <= set(e), e
    held, peak = 0, 0
    for e in trace:
        if e["action"] == "alloc":
            held += e["size"]
            peak = max(peak, held)
        elif e["action"] == "free_completed":
            held -= e["size"]
    assert (peak, held) == (device["peak"], device["used"])
    ooms = [e for e in trace if e["action"] == "oom"]
    assert [(e["size"], e["device_free"]) for e in ooms] == [(8 << 20, 3 << 20)], ooms
    first = next(e for e in trace if e["action"] == "alloc")
    assert first["size"] == 3 << 20
    names = [(f["filename"], f["name"]) for f in first["frames"]]
    assert names[0][0].endswith(".py") and names[0][1] == "malloc", names
    assert names[-1][1] == "<shared object>", names
    live = sorted((s["total_size"], s["blocks"][0]["state"]) for s in snapshot["segments"])
    assert live == [(1 << 20, "active_allocated"), (2 << 20, "active_allocated")]
    try:
        from torch.cuda import _memory_viz
    except ImportError:
        return  # torch is not installed here: its viewer's check only is skipped
    for plot in (_memory_viz.trace_plot, _memory_viz.segment_plot):
        assert "snapshot.pickle" in plot(snapshot)
    assert "TOTAL MEM" in _memory_viz.trace(snapshot)
