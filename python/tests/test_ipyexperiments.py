"""`gpumemhook.mem` as a drop-in for ipyexperiments' `utils.mem`: the `*_mbs` getters,
`gpu_mem_allocate_mbs`, and `gpu_mem_leave_free_mbs`, which under the hook sets a ceiling instead of
allocating (issue 4) and without it falls back to allocating like ipyexperiments."""

from __future__ import annotations

from gpumemhook import mem

IPYEXPERIMENTS_NAMES = [
    "gpu_mem_get_mbs",
    "gpu_mem_get_total_mbs",
    "gpu_mem_get_free_mbs",
    "gpu_mem_get_free_no_cache_mbs",
    "gpu_mem_get_used_mbs",
    "gpu_mem_get_used_no_cache_mbs",
    "gpu_mem_allocate_mbs",
    "gpu_mem_leave_free_mbs",
    "preload_pytorch",
    "b2mb",
    "GPUMemory",
]


def test_every_ipyexperiments_name_is_exported():
    for name in IPYEXPERIMENTS_NAMES:
        assert name in mem.__all__ and hasattr(mem, name), name


def test_mbs_getters(runner):
    runner.run(
        """
        from gpumemhook.mem import *
        a = malloc(100 * MiB)
        assert gpu_mem_get_mbs() == GPUMemory(2048, 2048 - 100 - 10, 100), gpu_mem_get_mbs()
        assert gpu_mem_get_mbs(1) == GPUMemory(2048, 2048 - 10, 0)
        assert gpu_mem_get_total_mbs() == 2048
        assert gpu_mem_get_free_mbs() == gpu_mem_get_free_no_cache_mbs() == 2048 - 110
        assert gpu_mem_get_used_mbs() == gpu_mem_get_used_no_cache_mbs() == 100
        """,
        env={"FAKECUDA_MEM_BYTES": str(2 << 30), "FAKENVML_OTHER_USED": str(10 << 20)},
    )


def test_allocate_mbs_through_the_runtime_is_counted_exactly(runner):
    runner.run(
        """
        import gpumemhook
        from gpumemhook.mem import gpu_mem_allocate_mbs
        buf = gpu_mem_allocate_mbs(12)
        assert buf is not None and buf.nbytes == 12 * MiB
        assert gpumemhook.used() == driver_used() == 12 * MiB
        del buf
        assert gpumemhook.used() == driver_used() == 0
        # Past the card's capacity: None, or the error with fatal=True.
        assert gpu_mem_allocate_mbs(10 ** 6) is None
        try:
            gpu_mem_allocate_mbs(10 ** 6, fatal=True)
        except RuntimeError as e:
            assert "out of memory" in str(e)
        else:
            raise AssertionError("no error")
        """
    )


def test_leave_free_sets_a_ceiling_instead_of_allocating(runner):
    runner.run(
        """
        import gpumemhook
        from gpumemhook.mem import gpu_mem_leave_free_mbs, gpu_mem_get_free_mbs
        held = malloc(30 * MiB)
        hold = gpu_mem_leave_free_mbs(100)
        # No memory was taken: only a ceiling, at used + 100 MiB.
        assert driver_used() == 30 * MiB
        assert gpumemhook.stats().limit == 130 * MiB == hold.limit
        assert hold.previous is None and hold.device == 0
        assert gpu_mem_get_free_mbs() == 100                 # what fastai code sees
        malloc(100 * MiB + 1, expect=2)                      # one byte too many
        p = malloc(100 * MiB)                                # exactly what was left free
        free(p)
        hold.release()
        assert gpumemhook.stats().limit is None and hold.released
        hold.release()                                       # idempotent
        q = malloc(200 * MiB)
        free(q)
        # Deleting the object lifts the ceiling too.
        hold = gpu_mem_leave_free_mbs(10)
        assert gpumemhook.stats().limit == 40 * MiB
        del hold
        assert gpumemhook.stats().limit is None
        # As a context manager.
        with gpu_mem_leave_free_mbs(1) as h:
            malloc(2 * MiB, expect=2)
        assert gpumemhook.stats().limit is None
        """
    )


def test_leave_free_restores_the_previous_ceiling_whatever_the_release_order(runner):
    runner.run(
        """
        import gpumemhook
        from gpumemhook.mem import gpu_mem_leave_free_mbs
        gpumemhook.set_limit(1 << 30)                         # a ceiling from before
        first = gpu_mem_leave_free_mbs(100)
        second = gpu_mem_leave_free_mbs(50)
        assert (first.limit, second.limit) == (100 * MiB, 50 * MiB)
        assert second.previous == 100 * MiB
        assert gpumemhook.stats().limit == 50 * MiB
        first.release()                                       # out of order: the newest stays
        assert gpumemhook.stats().limit == 50 * MiB
        second.release()                                      # the one from before comes back
        assert gpumemhook.stats().limit == 1 << 30
        """
    )


def test_leave_free_never_promises_more_than_the_device_has(runner):
    runner.run(
        """
        import gpumemhook
        from gpumemhook.mem import gpu_mem_leave_free_mbs
        held = malloc(20 * MiB)
        # The card: 1 GiB, of which other processes hold all but 84 MiB (and we hold 20): 64 MiB
        # are available. Asking to leave more free is refused, in ipyexperiments' words.
        for n in (500, 64, 10**9, -5):
            try:
                gpu_mem_leave_free_mbs(n)
            except AssertionError as e:
                assert str(e).startswith(
                    "already have less available mem than desired {}MBs".format(n)), e
                assert type(e).__name__ == "LessMemoryThanAskedError"
            else:
                raise AssertionError("accepted {}".format(n))
        assert gpumemhook.stats().limit is None              # nothing was set
        hold = gpu_mem_leave_free_mbs(63)
        assert hold.limit == 20 * MiB + 63 * MiB, hold.limit
        malloc(63 * MiB + 1, expect=2)
        """,
        env={"FAKECUDA_MEM_BYTES": str(1 << 30), "FAKENVML_OTHER_USED": str((1 << 30) - 84 * (1 << 20))},
    )


def test_leave_free_without_nvml_uses_the_process_figures_only(runner):
    runner.run(
        """
        import gpumemhook
        from gpumemhook.mem import gpu_mem_leave_free_mbs
        held = malloc(5 * MiB)
        hold = gpu_mem_leave_free_mbs(7)
        assert hold.limit == 12 * MiB
        # Without NVML the ceiling in force still bounds what is available (7 MiB here).
        for n in (7, 10**9, 10**20, -1):
            try:
                gpu_mem_leave_free_mbs(n)
            except AssertionError as e:
                assert "already have less available mem than desired" in str(e), e
            else:
                raise AssertionError("accepted {}".format(n))
        """,
        env={"GPUMEMHOOK_NVML_LIB": "none"},
    )


def test_leave_free_without_the_hook_falls_back_with_one_hint(runner):
    done = runner.run(
        """
        from gpumemhook.mem import gpu_mem_leave_free_mbs
        # No torch here: like ipyexperiments without its framework, nothing can be held.
        assert gpu_mem_leave_free_mbs(100) is None
        assert gpu_mem_leave_free_mbs(100) is None
        print("ok")
        """,
        hooked=False,
    )
    assert done.stdout.strip() == "ok"
    assert done.stderr.count("NotHookedWarning") == 1, done.stderr
    assert "gpu_mem_leave_free_mbs runs without the hook" in done.stderr
