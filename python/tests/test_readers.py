"""Readers no other user can hang, fool or crash, from Python: `processes()` and `attach()` with
FIFOs and foreign-owned files planted at segment names, readers SIGKILLed in the middle of scope
operations, a segment shrunk under an attached reader, and writes to processes that are gone.

Every reader runs in a child process under a time limit, so that a hang fails the test instead of
blocking it. The foreign-owned case needs root (chown); without root it is skipped, saying why.
"""

from __future__ import annotations

import os
import signal
import subprocess
import textwrap
import time

import pytest
from conftest import pods_supported

# Seconds any reader may take before the test calls it a hang.
ANSWER = 10


def _wait_ready(proc: subprocess.Popen, path) -> None:
    deadline = time.monotonic() + 30
    while not os.path.exists(str(path)):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the hooked child never got ready"
        time.sleep(0.005)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def _target(runner, tmp_path, body: str = "") -> subprocess.Popen:
    """A hooked Python process holding 3 MiB, then running `body` (with `d` the sync directory)."""
    proc = runner.start(
        """
        import gpumemhook
        d = {d!r}
        held = malloc(3 * MiB)
        touch(d + "/ready")
        {body}
        wait_for(d + "/done", timeout=60)
        """.format(d=str(tmp_path), body=textwrap.dedent(body).strip().replace("\n", "\n        "))
    )
    _wait_ready(proc, tmp_path / "ready")
    return proc


def test_planted_fifo_and_foreign_file_leave_processes_and_attach_answering(runner, tmp_path):
    target = _target(runner, tmp_path)
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        planted = runner.shm / "gpumemhook-{}-{}".format(os.getuid(), bystander.pid)
        os.mkfifo(str(planted))
        os.mkfifo(str(runner.shm / "gpumemhook-{}-999999999".format(os.getuid())))
        check = """
            import gpumemhook
            started = time.monotonic()
            pids = [p.pid for p in gpumemhook.processes()]
            assert pids == [{target}], pids
            proc = gpumemhook.attach({target})
            assert proc.used(0) == 3 * MiB
            try:
                gpumemhook.attach({other})
            except gpumemhook.NotHookedError as e:
                raise AssertionError("a planted file is not 'not hooked': " + str(e))
            except gpumemhook.GpuMemHookError as e:
                assert {reason!r} in str(e), str(e)
                assert e.path == {planted!r}, e.path
            else:
                raise AssertionError("attached to a planted file")
            elapsed = time.monotonic() - started
            assert elapsed < 1.0, elapsed
            print("answered in", elapsed)
        """
        runner.run(
            check.format(target=target.pid, other=bystander.pid, reason="FIFO", planted=str(planted)),
            hooked=False,
            timeout=ANSWER,
        )
        if os.getuid() != 0:
            print("skipping the foreign-owned file case: chown to another user needs root")
            return
        # A forged segment: the real one's bytes, naming the bystander, owned by nobody, mode 0666.
        os.unlink(str(planted))
        real = runner.shm / "gpumemhook-{}-{}".format(os.getuid(), target.pid)
        image = bytearray(real.read_bytes())
        image[24:28] = bystander.pid.to_bytes(4, "little")
        planted.write_bytes(bytes(image))
        os.chmod(str(planted), 0o666)
        os.chown(str(planted), 65534, 65534)
        runner.run(
            check.format(
                target=target.pid, other=bystander.pid, reason="owned by uid 65534", planted=str(planted)
            ),
            hooked=False,
            timeout=ANSWER,
        )
        assert planted.read_bytes() == bytes(image), "nothing was written into the forged file"
    finally:
        (tmp_path / "done").touch()
        _stop(bystander)
        out, err = target.communicate(timeout=30)
        assert target.returncode == 0, err


def test_killed_readers_leave_the_targets_own_scope_instant_and_exact(runner, tmp_path):
    target = _target(
        runner,
        tmp_path,
        """
        wait_for(d + "/hammered", timeout=60)
        started = time.monotonic()
        with gpumemhook.scope("own") as s:
            opened = time.monotonic() - started
            spike = malloc(5 * MiB)
            free(spike)
            r = s.reading()
        assert opened < 0.5, opened
        assert (r.base, r.peak, r.used) == (3 * MiB, 8 * MiB, 3 * MiB), (r.base, r.peak, r.used)
        assert gpumemhook.peak(0) == 8 * MiB and gpumemhook.used(0) == 3 * MiB
        print("own scope opened in", opened, flush=True)
        """,
    )
    try:
        runner.run(
            """
            import gpumemhook, random, signal
            proc = gpumemhook.attach({pid})
            rng = random.Random({pid})
            started = time.monotonic()
            kills = 0
            while kills < 300 and time.monotonic() - started < 40:
                child = os.fork()
                if child == 0:
                    try:
                        while True:
                            s = proc.open_scope("hammer", 0)
                            s.reset()
                            s.close()
                    finally:
                        os._exit(0)
                time.sleep(rng.uniform(0.0005, 0.004))
                os.kill(child, signal.SIGKILL)
                os.waitpid(child, 0)
                kills += 1
            assert kills >= 100, kills
            print("killed", kills, "readers in", time.monotonic() - started)
            touch({d!r} + "/hammered")
            """.format(pid=target.pid, d=str(tmp_path)),
            hooked=False,
            timeout=90,
        )
        # The target measures its own scope, then waits for this to exit.
        (tmp_path / "done").touch()
        out, err = target.communicate(timeout=30)
        assert target.returncode == 0, err
        assert "own scope opened in" in out
    finally:
        (tmp_path / "done").touch()
        _stop(target)


def test_a_segment_shrunk_under_an_attached_reader_is_no_sigbus(runner, tmp_path):
    target = _target(runner, tmp_path)
    try:
        segment = runner.shm / "gpumemhook-{}-{}".format(os.getuid(), target.pid)
        done = runner.run(
            """
            import gpumemhook
            proc = gpumemhook.attach({pid})
            assert proc.used(0) == 3 * MiB
            os.truncate({seg!r}, 0)
            assert proc.used(0) == 0
            assert not proc.is_alive()
            try:
                proc.set_limit(1 << 30)
            except gpumemhook.ProcessGoneError:
                pass
            else:
                raise AssertionError("wrote to a shrunk segment")
            # Give the watched process its pages back before it touches them again.
            os.truncate({seg!r}, {size})
            print("reader survived")
            """.format(pid=target.pid, seg=str(segment), size=segment.stat().st_size),
            hooked=False,
            timeout=ANSWER,
        )
        assert "reader survived" in done.stdout
    finally:
        _stop(target)


def test_writes_to_a_gone_process_raise_process_gone(runner, tmp_path):
    target = _target(runner, tmp_path)
    try:
        runner.run(
            """
            import gpumemhook
            proc = gpumemhook.attach({pid})
            scope = proc.open_scope("s", 0)
            touch({d!r} + "/done")
            deadline = time.time() + 20
            def exited():
                # Gone, or a zombie its parent (the test) has not reaped yet.
                try:
                    stat = open("/proc/{pid}/stat").read()
                except OSError:
                    return True
                return stat[stat.rindex(")") + 2] == "Z"
            while not exited():
                assert time.time() < deadline
                time.sleep(0.01)
            assert not proc.is_alive()
            for name, write in [
                ("set_limit", lambda: proc.set_limit(1 << 30)),
                ("reset_peak", lambda: proc.reset_peak()),
                ("open_scope", lambda: proc.open_scope("t")),
                ("scope reset", lambda: scope.reset()),
            ]:
                try:
                    write()
                except gpumemhook.ProcessGoneError as e:
                    assert e.pid == {pid}, e.pid
                else:
                    raise AssertionError(name + " wrote to a gone process")
            print("all raised")
            """.format(pid=target.pid, d=str(tmp_path)),
            hooked=False,
            timeout=30,
        )
    finally:
        (tmp_path / "done").touch()
        _stop(target)


def test_a_process_that_execs_away_from_the_hook_is_not_listed(runner, tmp_path):
    proc = runner.start(
        """
        held = malloc(MiB)
        touch({d!r} + "/ready")
        wait_for({d!r} + "/go")
        env = dict(os.environ)
        env.pop("LD_PRELOAD")
        os.execvpe("sleep", ["sleep", "20"], env)
        """.format(d=str(tmp_path))
    )
    try:
        _wait_ready(proc, tmp_path / "ready")
        segment = runner.shm / "gpumemhook-{}-{}".format(os.getuid(), proc.pid)
        listed = """
            import gpumemhook
            print(sorted(p.pid for p in gpumemhook.processes()))
        """
        out = runner.run(listed, hooked=False, timeout=ANSWER).stdout
        assert str(proc.pid) in out
        (tmp_path / "go").touch()
        deadline = time.monotonic() + 20
        while not open("/proc/{}/cmdline".format(proc.pid), "rb").read().startswith(b"sleep"):
            assert time.monotonic() < deadline, "never exec'd"
            time.sleep(0.01)
        assert segment.exists(), "the exec'd image left its file behind"
        out = runner.run(listed, hooked=False, timeout=ANSWER).stdout
        assert str(proc.pid) not in out, out
        assert not segment.exists(), "the stale file was removed"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def test_process_open_refuses_a_fifo_at_once(runner):
    path = runner.shm / "gpumemhook-{}-1".format(os.getuid())
    os.mkfifo(str(path))
    runner.run(
        """
        import gpumemhook
        try:
            gpumemhook.Process.open({path!r})
        except gpumemhook.GpuMemHookError as e:
            assert "FIFO" in str(e), str(e)
        else:
            raise AssertionError("opened a FIFO")
        """.format(path=str(path)),
        hooked=False,
        timeout=ANSWER,
    )


def test_a_full_segment_filesystem_means_private_counting_and_exact_scopes(runner, tmp_path):
    if os.getuid() != 0:
        print("skipping: mounting a small tmpfs needs root")
        return
    mnt = tmp_path / "full"
    mnt.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m,mode=1777", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        print("skipping: mount -t tmpfs failed: " + mounted.stderr.strip())
        return
    try:
        with open(str(mnt / "filler"), "wb", buffering=0) as f:
            for chunk in (4096, 1):
                try:
                    while True:
                        f.write(b"\0" * chunk)
                except OSError:
                    pass
        done = runner.run(
            """
            import gpumemhook
            base = malloc(2 * MiB)
            with gpumemhook.scope("full") as s:
                spike = malloc(6 * MiB)
                free(spike)
                r = s.reading()
            assert (r.base, r.peak, r.used) == (2 * MiB, 8 * MiB, 2 * MiB), (r.base, r.peak, r.used)
            assert gpumemhook.current().path is None  # counting privately
            print("exact")
            """,
            env={"GPUMEMHOOK_SHM_DIR": str(mnt)},
        )
        assert "exact" in done.stdout
        warnings = [l for l in done.stderr.splitlines() if l.startswith("gpumemhook:")]
        assert len(warnings) == 1, done.stderr
    finally:
        subprocess.run(["umount", str(mnt)])


def test_in_a_pod_processes_lists_the_pods_own_by_its_pids_and_leaves_the_nodes(runner, tmp_path):
    """Issue 51: a reader in a pid namespace of its own (a pod without hostPID) sharing the node's
    segment directory sees its pod's processes by the pids the pod sees, and neither lists nor
    removes the node's live ones."""
    if not pods_supported():
        pytest.skip("unshare --pid needs root")
    target = _target(runner, tmp_path)
    try:
        node_segments = sorted(os.listdir(str(runner.shm)))
        runner.run(
            """
            import gpumemhook
            held = malloc(5 * MiB)
            seen = [(p.pid, p.used(0)) for p in gpumemhook.processes()]
            assert seen == [(1, 5 * MiB)], seen
            assert gpumemhook.attach(1).used(0) == 5 * MiB
            """,
            pod=True,
        )
        assert sorted(os.listdir(str(runner.shm))) == node_segments
        node = runner.run(
            """
            import gpumemhook
            print([(p.pid, p.used(0)) for p in gpumemhook.processes()])
            """,
            hooked=False,
        )
        assert node.stdout.strip() == str([(target.pid, 3 * 1024 * 1024)]), node.stdout
    finally:
        (tmp_path / "done").touch()
        _stop(target)
