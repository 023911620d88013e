"""`gpumemhook.group(name).stats(device)`: a group's joint figures read from Python, from a process
outside the group, over two hooked members of the simulated stack whose spikes never overlap."""

from __future__ import annotations

import subprocess

MiB = 1 << 20


def _member(runner, d, i: int) -> subprocess.Popen:
    """A member holding 100 MiB, with a 600 MiB spike on its turn."""
    return runner.start(
        """
        d = {d!r}
        base = malloc(100 * MiB)
        wait_for(d + "/turn.{i}")
        spike = malloc(600 * MiB)
        free(spike)
        touch(d + "/turn.{j}")
        wait_for(d + "/end", timeout=60)
        """.format(d=str(d), i=i, j=i + 1),
        env={"GPUMEMHOOK_GROUP": "pyjob"},
    )


def test_a_groups_stats_are_its_members_joint_figures(runner, tmp_path):
    members = [_member(runner, tmp_path, i) for i in range(2)]
    try:
        (tmp_path / "turn.0").touch()
        read = runner.run(
            """
            import gpumemhook
            wait_for({d!r} + "/turn.2")
            s = gpumemhook.group("pyjob").stats(0)
            print(s.used, s.peak, s.limit, s.allocs, s.frees, len(s.members))
            print(sorted(m.bytes for m in s.members))
            """.format(d=str(tmp_path)),
            hooked=False,
        )
    finally:
        (tmp_path / "end").touch()
        for m in members:
            out, err = m.communicate(timeout=60)
            assert m.returncode == 0, err
    lines = read.stdout.splitlines()
    assert lines[0] == "{} {} None 4 2 2".format(200 * MiB, 800 * MiB), read.stdout
    assert lines[1] == str([100 * MiB, 100 * MiB]), read.stdout


def test_a_group_that_does_not_exist_is_an_error(runner):
    runner.run(
        """
        import gpumemhook
        try:
            gpumemhook.group("nobody-here").stats(0)
        except gpumemhook.GpuMemHookError as e:
            print("refused:", e)
        else:
            raise SystemExit("no error")
        """,
        hooked=False,
    )


def _scoped_member(runner, d, name: str, ops: str) -> subprocess.Popen:
    return runner.start(
        ("d = {d!r}\n" + ops).format(d=str(d), name=name),
        env={"GPUMEMHOOK_GROUP": "pyscope"},
    )


def test_a_group_scope_measures_the_groups_peak_above_its_start_from_outside(runner, tmp_path):
    """`gpumemhook.scope(group=...)` and `gpumemhook.group(...).scope()`, opened by a process in no
    group: A spikes by 600 MiB and frees it, then B allocates 200 MiB and keeps it."""
    a = _scoped_member(
        runner,
        tmp_path,
        "a",
        "x = malloc(100 * MiB)\ntouch(d + '/ready.a')\nwait_for(d + '/turn.0')\n"
        "s = malloc(600 * MiB)\nfree(s)\ntouch(d + '/turn.1')\nwait_for(d + '/end', timeout=60)\n",
    )
    b = _scoped_member(
        runner,
        tmp_path,
        "b",
        "x = malloc(50 * MiB)\ntouch(d + '/ready.b')\nwait_for(d + '/turn.2')\n"
        "k = malloc(200 * MiB)\ntouch(d + '/turn.3')\nwait_for(d + '/end', timeout=60)\n",
    )
    try:
        read = runner.run(
            """
            import gpumemhook
            d = {d!r}
            wait_for(d + "/ready.a"); wait_for(d + "/ready.b")
            with gpumemhook.scope("whole", device=0, group="pyscope") as whole:
                with gpumemhook.group("pyscope").scope("after-a", 0) as after_a:
                    touch(d + "/turn.0"); wait_for(d + "/turn.1")
                    print(whole.delta_peak, whole.delta_used)
                    after_a.reset()
                    touch(d + "/turn.2"); wait_for(d + "/turn.3")
                print(after_a.delta_peak, after_a.delta_used, after_a.reading().base)
            print(whole.delta_peak, whole.delta_used, whole.reading().base)
            print(repr(whole))
            """.format(d=str(tmp_path)),
            hooked=False,
        )
    finally:
        (tmp_path / "end").touch()
        for m in (a, b):
            out, err = m.communicate(timeout=60)
            assert m.returncode == 0, err
    lines = read.stdout.splitlines()
    assert lines[0] == "{} 0".format(600 * MiB), read.stdout
    # The reset restarted the peak after A's spike: only B's 200 MiB is above its start.
    assert lines[1] == "{} {} {}".format(200 * MiB, 200 * MiB, 150 * MiB), read.stdout
    assert lines[2] == "{} {} {}".format(600 * MiB, 200 * MiB, 150 * MiB), read.stdout
    assert "group='pyscope'" in lines[3], read.stdout
