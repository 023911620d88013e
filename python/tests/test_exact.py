"""The exact API (`scope`, `stats`, `used`, `peak`, `reset_peak`, `set_limit`, `snapshot`,
`processes`, `attach`) and the error classes, over the simulated CUDA stack: numbers compared with
the stand-in driver's own count, scopes read and reset from a second process, segments of dead
processes and of another layout version."""

from __future__ import annotations

import os
import signal
import struct
import time

import pytest

import gpumemhook
from gpumemhook import _native


def test_error_classes_form_one_family():
    for cls in (
        gpumemhook.NotHookedError,
        gpumemhook.ProcessGoneError,
        gpumemhook.LayoutVersionError,
        gpumemhook.ScopeClosedError,
    ):
        assert issubclass(cls, gpumemhook.GpuMemHookError)
    assert issubclass(gpumemhook.GpuMemHookError, Exception)


def test_without_the_hook_exact_calls_raise_not_hooked_and_say_how(runner):
    out = runner.run(
        """
        import gpumemhook
        assert not gpumemhook.is_hooked()
        for call in (gpumemhook.stats, gpumemhook.used, gpumemhook.peak, gpumemhook.reset_peak,
                     gpumemhook.current, gpumemhook.snapshot, lambda: gpumemhook.set_limit(1 << 30),
                     lambda: gpumemhook.scope("x").__enter__()):
            try:
                call()
            except gpumemhook.NotHookedError as e:
                assert "LD_PRELOAD=" in str(e) and "libgpumemhook.so" in str(e), str(e)
            else:
                raise AssertionError("no error from %r" % call)
        print("ok")
        """,
        hooked=False,
    ).stdout
    assert out.strip() == "ok"


def test_used_peak_stats_and_reset_peak_match_the_driver(runner):
    runner.run(
        """
        import gpumemhook
        assert gpumemhook.is_hooked()
        a = malloc(3 * MiB)
        b = malloc(5000)
        free(a)
        assert gpumemhook.used() == driver_used() == 5000
        assert gpumemhook.peak() == 3 * MiB + 5000
        s = gpumemhook.stats(0)
        assert (s.device, s.used, s.peak, s.limit, s.allocs, s.frees) == (0, 5000, 3 * MiB + 5000, None, 2, 1), s
        assert s.total_allocated == 3 * MiB + 5000 and s.denied == 0 and s.failed == 0
        # Device 1, through the runtime's current device.
        c = malloc(7 * MiB, device=1)
        assert gpumemhook.used(1) == driver_used(1) == 7 * MiB
        gpumemhook.reset_peak(0)
        assert gpumemhook.peak(0) == 5000 and gpumemhook.peak(1) == 7 * MiB
        free(c)
        gpumemhook.reset_peak()
        assert gpumemhook.peak(1) == 0
        snap = gpumemhook.snapshot()
        assert snap["pid"] == os.getpid()
        assert [d["device"] for d in snap["devices"]] == [0, 1]
        assert snap["devices"][0]["used"] == 5000
        """
    )


def test_scope_as_context_manager_gives_exact_deltas_in_bytes(runner):
    runner.run(
        """
        import gpumemhook
        keep = malloc(1 * MiB)
        with gpumemhook.scope("block") as s:
            spike = malloc(64 * MiB)
            free(spike)
            kept = malloc(10 * MiB)
            live = s.reading()
            assert live.delta_used == 10 * MiB and live.delta_peak == 64 * MiB
        assert not s.is_open
        assert s.delta_used == 10 * MiB
        assert s.delta_peak == 64 * MiB
        assert s.delta_peaked == 54 * MiB
        assert s.peak == 65 * MiB and s.used == 11 * MiB
        free(kept)
        # Frozen after the block: later allocations do not change it.
        x = malloc(100 * MiB)
        assert s.delta_peak == 64 * MiB
        free(x)
        # Negative deltas.
        with gpumemhook.scope() as t:
            free(keep)
        assert t.delta_used == -1 * MiB and t.delta_peak == 0 and t.delta_peaked == 0
        """
    )


def test_scope_as_decorator_nested_and_on_exception(runner):
    runner.run(
        """
        import gpumemhook

        @gpumemhook.scope()
        def step(n):
            p = malloc(n)
            free(p)
            return n

        assert step(3 * MiB) == 3 * MiB
        assert step.scope.delta_peak == 3 * MiB and step.scope.delta_used == 0
        step(5 * MiB)
        assert step.scope.delta_peak == 5 * MiB

        named = gpumemhook.scope("named")
        @named
        def boom():
            malloc(2 * MiB)
            raise ValueError("x")
        try:
            boom()
        except ValueError:
            pass
        assert named.delta_used == 2 * MiB and named.delta_peak == 2 * MiB

        with gpumemhook.scope("outer") as outer:
            a = malloc(4 * MiB)
            with gpumemhook.scope("inner") as inner:
                b = malloc(8 * MiB)
                free(b)
            free(a)
        assert (outer.delta_peak, outer.delta_used) == (12 * MiB, 0)
        assert (inner.delta_peak, inner.delta_used) == (8 * MiB, 0)

        # Open scopes are visible in the segment; closed ones are gone.
        me = gpumemhook.current()
        assert me.scopes() == [] or all(s.name not in ("outer", "inner") for s in me.scopes())
        with gpumemhook.scope("visible"):
            assert [s.name for s in me.scopes()] == ["visible"]
        assert me.scopes() == []
        # One scope object cannot be entered twice at once.
        s = gpumemhook.scope("once")
        with s:
            try:
                s.__enter__()
            except RuntimeError:
                pass
            else:
                raise AssertionError("re-entered")
        """
    )


def test_set_limit_at_run_time_refuses_then_admits(runner):
    runner.run(
        """
        import gpumemhook
        from gpumemhook.mem import gpu_mem_get
        a = malloc(10 * MiB)
        gpumemhook.set_limit("16MiB")
        assert gpumemhook.stats().limit == 16 * MiB and gpumemhook.stats(1).limit == 16 * MiB
        malloc(7 * MiB, expect=2)            # 17 MiB would pass the ceiling
        b = malloc(6 * MiB)                  # exactly at the ceiling
        assert gpumemhook.stats().denied == 1
        # NVML's total is seen through the ceiling, free is what is left under it.
        assert gpu_mem_get(0) == (16, 0, 16), gpu_mem_get(0)
        gpumemhook.set_limit(None)
        c = malloc(7 * MiB)
        assert gpumemhook.stats().limit is None
        gpumemhook.set_limit(1 << 30, device=1)
        assert gpumemhook.stats(1).limit == 1 << 30 and gpumemhook.stats(0).limit is None
        for bad in (-1, True):
            try:
                gpumemhook.set_limit(bad)
            except (ValueError, TypeError):
                pass
            else:
                raise AssertionError(bad)
        # A float is no byte count (1.9 would be a 1-byte ceiling): TypeError, the ceiling unchanged.
        for bad in (1.9, 0.5, 2.0):
            try:
                gpumemhook.set_limit(bad)
            except TypeError as e:
                assert "whole number of bytes" in str(e), e
            else:
                raise AssertionError(bad)
        assert gpumemhook.stats(1).limit == 1 << 30
        try:
            gpumemhook.set_limit("eight")
        except ValueError as e:
            assert "examples" in str(e)
        """
    )


def test_set_limit_refuses_zero_and_sizes_past_the_no_limit_sentinel_in_parse_sizes_words(runner):
    runner.run(
        """
        import gpumemhook
        me = gpumemhook.current()
        def refusal(call):
            try:
                call()
            except ValueError as e:
                return str(e)
            raise AssertionError("accepted")
        zero = refusal(lambda: gpumemhook.parse_size("0B"))
        assert "zero bytes" in zero, zero
        # An integer is bytes: 0 is refused exactly as the string "0B" is, by both doors.
        assert refusal(lambda: gpumemhook.set_limit(0)) == zero
        assert refusal(lambda: me.set_limit(0, None)) == zero
        for big in (2**64 - 1, 2**64, 10**30):
            assert "too large" in refusal(lambda: gpumemhook.set_limit(big)), big
        assert "too large" in refusal(lambda: me.set_limit(2**64 - 1, 0))
        assert "too large" in refusal(lambda: gpumemhook.set_limit("99999999999999999999GiB"))
        assert "whole number of bytes" in refusal(lambda: gpumemhook.set_limit("0.5B"))
        # A string must carry its unit: one line that shows the fix.
        assert refusal(lambda: gpumemhook.set_limit("8")) == "8 what? write 8GiB, or 8B for bytes"
        assert "exponents" in refusal(lambda: gpumemhook.set_limit("1e3"))
        assert "positive" in refusal(lambda: gpumemhook.set_limit(-5))
        # Nothing was changed by the refusals; the largest accepted ceiling is shown as it is.
        assert gpumemhook.stats().limit is None
        gpumemhook.set_limit(2**64 - 2)
        assert gpumemhook.stats().limit == 2**64 - 2
        # An integer stays bytes; a string with its unit is the same ceiling.
        gpumemhook.set_limit(4096)
        assert gpumemhook.stats().limit == 4096
        gpumemhook.set_limit("4KiB")
        assert gpumemhook.stats().limit == 4096
        """
    )


def test_limit_from_the_environment_is_visible_and_changeable(runner):
    runner.run(
        """
        import gpumemhook
        assert gpumemhook.stats(0).limit == 8 * MiB
        malloc(9 * MiB, expect=2)
        gpumemhook.set_limit(None, device=0)
        malloc(9 * MiB)
        """,
        env={"GPUMEMHOOK_LIMIT": "8MiB"},
    )


def test_second_process_reads_and_resets_a_scope_of_the_first(runner, tmp_path):
    sync = tmp_path / "sync"
    sync.mkdir()
    first = runner.start(
        """
        import gpumemhook
        d = {sync!r}
        base = malloc(2 * MiB)
        with gpumemhook.scope("shared") as s:
            spike = malloc(30 * MiB)
            free(spike)
            kept = malloc(4 * MiB)
            touch(d + "/opened")
            wait_for(d + "/reset-done")
            # The second process reset the window: base and peak are now the current use.
            r = s.reading()
            assert (r.base, r.peak, r.used) == (6 * MiB, 6 * MiB, 6 * MiB), r
            more = malloc(1 * MiB)
            touch(d + "/allocated")
            wait_for(d + "/read-again")
        print("first ok", flush=True)
        """.format(sync=str(sync))
    )
    try:
        second = runner.run(
            """
            import gpumemhook
            d = {sync!r}
            wait_for(d + "/opened")
            proc = gpumemhook.attach({pid})
            assert proc.pid == {pid} and proc.is_alive()
            assert proc.used(0) == 6 * MiB and proc.peak(0) == 32 * MiB
            scope = proc.find_scope("shared")
            assert scope is not None and scope.name == "shared" and not scope.owned
            r = scope.reading(0)
            assert (r.base, r.peak, r.used) == (2 * MiB, 32 * MiB, 6 * MiB), r
            assert (r.delta_used, r.delta_peak, r.delta_peaked) == (4 * MiB, 30 * MiB, 26 * MiB)
            scope.reset()
            touch(d + "/reset-done")
            wait_for(d + "/allocated")
            r = scope.reading(0)
            assert (r.delta_used, r.delta_peak) == (1 * MiB, 1 * MiB), r
            touch(d + "/read-again")
            print("second ok")
            """.format(sync=str(sync), pid=first.pid),
            hooked=False,
        )
        assert "second ok" in second.stdout
        out, err = first.communicate(timeout=30)
        assert first.returncode == 0, err
        assert "first ok" in out
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()


def test_segment_of_a_dead_process_is_ignored(runner, tmp_path):
    ready = tmp_path / "ready"
    victim = runner.start(
        """
        import gpumemhook
        malloc(3 * MiB)
        touch({ready!r})
        time.sleep(60)
        """.format(ready=str(ready))
    )
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert victim.poll() is None, victim.communicate()
            assert time.monotonic() < deadline, "the hooked child never got ready"
            time.sleep(0.005)
        segment = runner.shm / "gpumemhook-{}-{}".format(os.getuid(), victim.pid)
        assert segment.exists()
        # SIGKILL: the hook gets no chance to unlink its segment.
        victim.send_signal(signal.SIGKILL)
        victim.wait()
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait()
    assert segment.exists()
    runner.run(
        """
        import gpumemhook
        try:
            gpumemhook.attach({pid})
        except gpumemhook.ProcessGoneError as e:
            assert e.pid == {pid} and "exited" in str(e)
        else:
            raise AssertionError("attached to a dead process")
        # The live list leaves it out and cleans its file up; this process is listed.
        pids = [p.pid for p in gpumemhook.processes()]
        assert pids == [os.getpid()], pids
        assert not os.path.exists({segment!r})
        """.format(pid=victim.pid, segment=str(segment))
    )


def test_wrong_layout_version_gives_the_typed_error(runner):
    # A segment whose magic is right and whose major layout version is not ours, under the name of
    # a live process (this test's own).
    pid = os.getpid()
    path = runner.shm / "gpumemhook-{}-{}".format(os.getuid(), pid)
    image = bytearray(_native.SEGMENT_SIZE)
    image[0:8] = b"GPUMEMHK"
    struct.pack_into("<II", image, 8, _native.LAYOUT_MAJOR + 98, 0)
    path.write_bytes(bytes(image))
    path.chmod(0o600)
    runner.run(
        """
        import gpumemhook
        for attempt in (lambda: gpumemhook.attach({pid}), lambda: gpumemhook.Process.open({path!r})):
            try:
                attempt()
            except gpumemhook.LayoutVersionError as e:
                assert (e.found, e.expected) == ({found}, {expected}), (e.found, e.expected)
                assert e.path == {path!r}
                assert "layout version {found}" in str(e)
            else:
                raise AssertionError("opened a segment of another layout")
        # Listing skips it (and leaves it: it may belong to a newer gpumemhook's live process).
        assert {pid} not in [p.pid for p in gpumemhook.processes()]
        assert os.path.exists({path!r})
        """.format(
            pid=pid,
            path=str(path),
            found=_native.LAYOUT_MAJOR + 98,
            expected=_native.LAYOUT_MAJOR,
        ),
        hooked=False,
    )


def test_attach_to_an_unhooked_process_says_how_to_hook(runner):
    runner.run(
        """
        import gpumemhook
        try:
            gpumemhook.attach(1)
        except gpumemhook.NotHookedError as e:
            assert e.pid == 1 and "LD_PRELOAD" in str(e)
        """,
        hooked=False,
    )


def test_scope_closed_elsewhere_raises_scope_closed(runner):
    runner.run(
        """
        import gpumemhook
        me = gpumemhook.current()
        mine = me.open_scope("mine", 0)
        other = me.find_scope("mine")
        assert other.close() is True
        assert other.close() is False           # closing twice is harmless
        try:
            mine.reading()
        except gpumemhook.ScopeClosedError:
            pass
        else:
            raise AssertionError("read a closed scope")
        assert not mine.is_open
        assert mine.close() is False
        """
    )


def test_many_concurrent_scopes_each_exact(runner):
    runner.run(
        """
        import gpumemhook
        scopes = []
        held = []
        for i in range(50):
            s = gpumemhook.scope("s%d" % i)
            s.__enter__()
            scopes.append(s)
            held.append(malloc(MiB))
        for p in held:
            free(p)
        for i, s in enumerate(scopes):
            s.__exit__(None, None, None)
            # Scope i opened with i MiB held; the peak was 50 MiB.
            assert s.delta_peak == (50 - i) * MiB, (i, s.delta_peak)
            assert s.delta_used == -i * MiB
        """
    )


def test_processes_lists_hooked_processes_with_their_commands(runner):
    out = runner.run(
        """
        import gpumemhook
        procs = gpumemhook.processes()
        assert [p.pid for p in procs] == [os.getpid()]
        assert "scenario" in procs[0].command
        print(repr(procs[0]))
        """
    ).stdout
    assert out.startswith("Process(pid=")


def test_a_forked_child_reads_its_own_segment(runner):
    runner.run(
        """
        import gpumemhook
        a = malloc(8 * MiB)
        assert gpumemhook.used() == 8 * MiB
        parent_pid = gpumemhook.current().pid
        # The stand-in driver refuses a forked child's calls, as a real driver does; this test is
        # about the child's own segment, so its allocation is let through.
        os.environ["FAKECUDA_FORK_OK"] = "1"
        pid = os.fork()
        if pid == 0:
            ok = gpumemhook.current().pid == os.getpid() != parent_pid and gpumemhook.used() == 0
            b = malloc(3 * MiB)
            ok = ok and gpumemhook.used() == 3 * MiB
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert status == 0, status
        assert gpumemhook.used() == 8 * MiB and gpumemhook.current().pid == os.getpid()
        """
    )


def test_sizes_and_plain_values():
    assert gpumemhook.parse_size("8GiB") == 8 << 30 == gpumemhook.parse_size("8G")
    assert gpumemhook.parse_size("8000MB") == 8_000_000_000
    assert gpumemhook.format_size(64 << 20) == "64.00 MiB"
    with pytest.raises(ValueError, match="examples"):
        gpumemhook.parse_size("0")
    with pytest.raises(ValueError) as bare:
        gpumemhook.parse_size("8")
    assert str(bare.value) == "8 what? write 8GiB, or 8B for bytes"
    assert gpumemhook.parse_size("4096B") == 4096
    r = gpumemhook.ScopeReading(device=1, base=10, peak=100, used=40)
    assert (r.delta_used, r.delta_peak, r.delta_peaked, r.peak_above_used) == (30, 90, 60, 60)
    assert gpumemhook.ScopeReading(0, 50, 50, 20).delta_used == -30
    assert repr(r) == "ScopeReading(device=1, base=10, peak=100, used=40)"
    assert r == gpumemhook.ScopeReading(1, 10, 100, 40)
    # A window that fell below its base (memory given back, then a reset elsewhere) never reads as
    # a negative peak: the reader's saturating deltas, the same in every API.
    low = gpumemhook.ScopeReading(0, 100, 40, 60)
    assert (low.delta_used, low.delta_peak, low.delta_peaked, low.peak_above_used) == (-40, 0, 0, 0)
    # Device numbers: one check, the reader's, with its words.
    from gpumemhook import _core, _native

    last = _native.MAX_DEVICES - 1
    assert _native.check_device(last) == last
    with pytest.raises(ValueError, match="past the {} devices".format(_native.MAX_DEVICES)):
        _native.check_device(_native.MAX_DEVICES)
    assert [_core.is_counted_device(d) for d in (0, last, last + 1, -1)] == [True, True, False, False]
    cli = gpumemhook.cli_path()
    assert cli is None or os.access(cli, os.X_OK)


def test_process_object_methods(runner):
    runner.run(
        """
        import gpumemhook
        me = gpumemhook.current()
        a = malloc(2 * MiB, device=1)
        assert me.active_devices() == [1]
        assert me.limit(1) is None
        me.set_limit(10 * MiB, 1)
        assert me.limit(1) == 10 * MiB and me.limit(0) is None
        # The ceiling's view of a device: total = min(real, ceiling), free = min(real free, ceiling - used).
        assert me.ceiling_view(1, 100 * MiB, 200 * MiB) == (8 * MiB, 10 * MiB)
        assert me.ceiling_view(0, 100 * MiB, 200 * MiB) == (100 * MiB, 200 * MiB)
        st = me.device_stats(1)
        assert isinstance(st, gpumemhook.DeviceStats) and st.used == 2 * MiB and st.limit == 10 * MiB
        assert repr(st).startswith("DeviceStats(device=1, used=2097152,")
        assert "limit=10485760, allocs=1," in repr(st) and repr(st).endswith(", managed_peak=0)")
        # One list of fields: the class's, the report's keys (but the nested lists and objects,
        # by_module and emulated) and the attributes agree.
        import json
        report_device = json.loads(me.snapshot_json())["devices"][0]
        nested = {"by_module", "emulated"}
        assert sorted(gpumemhook.DeviceStats.FIELDS) == sorted(set(report_device) - nested), report_device
        assert [m["used"] for m in report_device["by_module"]] == [2 * MiB]
        assert [getattr(st, f) for f in gpumemhook.DeviceStats.FIELDS] == [
            report_device[f] for f in gpumemhook.DeviceStats.FIELDS
        ]
        assert gpumemhook.DeviceStats.FIELDS[:3] == ["device", "used", "peak"]
        with me.open_scope("native", 1) as s:
            assert s.device == 1 and s.owned and s.is_open and s.name == "native"
            b = malloc(3 * MiB, device=1)
            free(b)
            r0, r1 = s.readings([0, 1])
            assert (r0.delta_peak, r1.delta_peak) == (0, 3 * MiB)
            assert s.reading().device == 1
        assert not s.is_open
        for bad in (lambda: me.used(-1), lambda: me.limit(64), lambda: me.open_scope("x", 99)):
            try:
                bad()
            except (ValueError, OverflowError):
                pass
            else:
                raise AssertionError("accepted a bad device")
        assert me.path.endswith("gpumemhook-%d-%d" % (os.getuid(), os.getpid()))
        """
    )
