"""`gpumemhook.zeta.print_cuda_memory_usage`, zeta's context manager: the delta in GB, nestable,
printed also when the block raises; exact under the hook, a hinted fallback without it."""

from __future__ import annotations

import gpumemhook
from gpumemhook import zeta


def test_exported_at_the_top_level_too():
    assert gpumemhook.print_cuda_memory_usage is zeta.print_cuda_memory_usage
    assert zeta.__all__ == ["print_cuda_memory_usage"]


def test_prints_the_delta_in_gb_nested_and_on_exceptions(runner):
    out = runner.run(
        """
        from gpumemhook.zeta import print_cuda_memory_usage
        with print_cuda_memory_usage():
            a = malloc(512 * MiB)
        with print_cuda_memory_usage() as outer:
            x = malloc(1024 * MiB)
            with print_cuda_memory_usage() as inner:
                y = malloc(256 * MiB)
                free(y)
                z = malloc(256 * MiB)
            spike = malloc(3 * 1024 * MiB)
            free(spike)
        assert (inner.delta_used, inner.delta_peak) == (256 * MiB, 256 * MiB)
        assert outer.delta_peak == (1024 + 256 + 3 * 1024) * MiB
        try:
            with print_cuda_memory_usage():
                malloc(2048 * MiB)
                raise ValueError("Some Exception")
        except ValueError as e:
            print(f"Caught an exception: {e}")
        with print_cuda_memory_usage():
            free(a)
        """
    ).stdout
    assert out.splitlines() == [
        "CUDA memory usage: 0.50 GB",
        "CUDA memory usage: 0.25 GB",
        "CUDA memory usage: 1.25 GB",
        "CUDA memory usage: 2.00 GB",
        "Caught an exception: Some Exception",
        "CUDA memory usage: -0.50 GB",
    ]


def test_without_the_hook_it_falls_back_and_hints_once(runner):
    done = runner.run(
        """
        from gpumemhook import print_cuda_memory_usage
        with print_cuda_memory_usage() as s:
            assert s is None
            a = malloc(1024 * MiB)
        with print_cuda_memory_usage():
            pass
        """,
        hooked=False,
    )
    assert done.stdout.splitlines() == ["CUDA memory usage: 1.00 GB", "CUDA memory usage: 0.00 GB"]
    assert done.stderr.count("NotHookedWarning") == 1
