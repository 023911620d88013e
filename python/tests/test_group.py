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
