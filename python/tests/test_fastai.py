"""`gpumemhook.mem` as a drop-in for fastai's `fastai.utils.mem`: every public name, the report
line formats, exact peaks under the hook (1000 spikes in one trace, three threads with overlapping
traces), NVML figures, the CPU answers without NVML, and the fallback without the hook."""

from __future__ import annotations

import sys

import pytest

from gpumemhook import mem

FASTAI_NAMES = [
    "GPUMemory",
    "b2mb",
    "preload_pytorch",
    "gpu_mem_get",
    "gpu_mem_get_all",
    "gpu_mem_get_free",
    "gpu_mem_get_free_no_cache",
    "gpu_mem_get_used",
    "gpu_mem_get_used_no_cache",
    "gpu_mem_get_used_fast",
    "gpu_with_max_free_mem",
    "GPUMemTrace",
    "gpu_mem_trace",
    "gpu_mem_restore",
    "gpu_mem_restore_ctx",
    "get_ref_free_exc_info",
]

GPUMEMTRACE_METHODS = [
    "start",
    "stop",
    "reset",
    "data",
    "data_set",
    "report",
    "report_n_reset",
    "silent",
    "__enter__",
    "__exit__",
    "peak_monitor_start",
    "peak_monitor_stop",
    "peak_monitor_func",
]


def test_every_fastai_name_is_exported():
    for name in FASTAI_NAMES:
        assert name in mem.__all__ and hasattr(mem, name), name
    for method in GPUMEMTRACE_METHODS:
        assert hasattr(mem.GPUMemTrace, method), method


def test_b2mb_rounds_down_and_gpumemory_is_a_namedtuple():
    assert mem.b2mb(2**20) == 1
    assert mem.b2mb(2**21 - 1) == 1
    assert mem.b2mb(0) == 0
    g = mem.GPUMemory(1, 2, 3)
    assert (g.total, g.free, g.used) == (1, 2, 3) and tuple(g) == (1, 2, 3)
    assert repr(g) == "GPUMemory(total=1, free=2, used=3)"


def test_point_in_time_figures_from_nvml_and_the_hook(runner):
    runner.run(
        """
        from gpumemhook.mem import *
        from gpumemhook import _nvml
        a = malloc(100 * MiB)
        b = malloc(50 * MiB, device=1)
        total_mb = (1 << 30) // MiB
        # Device-wide NVML sees 200 MiB held by "other processes" besides this one's 100 MiB;
        # used is this process's exact use.
        assert gpu_mem_get() == GPUMemory(total_mb, total_mb - 300, 100), gpu_mem_get()
        assert gpu_mem_get(1) == GPUMemory(total_mb, total_mb - 250, 50)
        assert gpu_mem_get(7) == GPUMemory(0, 0, 0)        # invalid id
        assert gpu_mem_get(-1) == GPUMemory(0, 0, 0)
        assert gpu_mem_get_all() == [gpu_mem_get(0), gpu_mem_get(1)]
        assert gpu_mem_get_free() == gpu_mem_get_free_no_cache() == total_mb - 300
        assert gpu_mem_get_used() == gpu_mem_get_used_no_cache() == 100
        assert gpu_with_max_free_mem() == (1, total_mb - 250)
        assert gpu_mem_get_used_fast(0) == 100 and gpu_mem_get_used_fast(1) == 50
        # An NVML handle, as pynvml's nvmlDeviceGetHandleByIndex gives it.
        assert gpu_mem_get_used_fast(_nvml.handle(1)) == 50
        assert preload_pytorch() is None                    # no torch here: a no-op
        """,
        env={"FAKECUDA_MEM_BYTES": str(1 << 30), "FAKENVML_OTHER_USED": str(200 << 20)},
    )


def test_figures_without_the_hook_are_nvml_device_wide(runner):
    runner.run(
        """
        from gpumemhook.mem import *
        a = malloc(100 * MiB)
        assert gpu_mem_get() == GPUMemory(1024, 1024 - 300, 300), gpu_mem_get()
        assert gpu_mem_get_used() == 300
        """,
        hooked=False,
        env={"FAKECUDA_MEM_BYTES": str(1 << 30), "FAKENVML_OTHER_USED": str(200 << 20)},
    )


@pytest.mark.parametrize(
    "nvml_env",
    [{"GPUMEMHOOK_NVML_LIB": "none"}, {"GPUMEMHOOK_NVML_LIB": "/nonexistent/libnvidia-ml.so.1"}, {"FAKENVML_FAIL": "1"}],
    ids=["disabled", "absent", "init-fails"],
)
@pytest.mark.parametrize("hooked", [True, False], ids=["hooked", "unhooked"])
def test_without_nvml_the_cpu_answers(runner, nvml_env, hooked):
    runner.run(
        """
        from gpumemhook.mem import *
        malloc(3 * MiB)
        assert gpu_mem_get() == GPUMemory(0, 0, 0)
        assert gpu_mem_get(0) == GPUMemory(0, 0, 0)
        assert gpu_mem_get_all() == []
        assert gpu_with_max_free_mem() == (None, 0)
        assert gpu_mem_get_free() == 0
        # used stays exact under the hook, NVML or not.
        assert gpu_mem_get_used() == ({hooked} and 3 or 0)
        """.format(hooked=hooked),
        hooked=hooked,
        env=nvml_env,
    )


def test_report_formats(runner):
    out = runner.run(
        """
        from gpumemhook.mem import *

        def some_code():
            p = malloc(20 * MiB)
            free(p)
            return malloc(3 * MiB)

        mtrace = GPUMemTrace()
        some_code()
        mtrace.report()
        some_code()
        mtrace.report('2nd run of some_code()')
        delta_used, delta_peaked = mtrace.data()
        assert (delta_used, delta_peaked) == (6, 17), mtrace.data()
        print(mtrace)
        mtrace = GPUMemTrace(ctx="foobar")
        mtrace.report()
        mtrace.report('1st try')
        mtrace.report_n_reset('reset')
        mtrace.report('after reset')
        mtrace = GPUMemTrace(silent=True)
        mtrace.report()              # nothing
        mtrace.silent = False
        mtrace.report("attr on")
        mtrace.silent = True
        mtrace.report()              # nothing
        mtrace.silent(silent=False)
        mtrace.report("call on")
        mtrace.silent(True)
        assert mtrace.silent and bool(mtrace.silent) is True
        mtrace.report()              # nothing
        with GPUMemTrace():
            some_code()
        with GPUMemTrace(ctx='some context'):
            some_code()

        def some_func():
            with GPUMemTrace(ctx='some_func'):
                p = malloc(2 * MiB)
                free(p)
                return 1
        assert some_func() == 1

        @gpu_mem_trace
        def my_function():
            return malloc(1 * MiB)
        my_function()

        class Model:
            @gpu_mem_trace
            def fit(self):
                pass
        Model().fit()

        with GPUMemTrace(ctx='some_func', on_exit_report=False) as mtrace:
            some_code()
        mtrace.report("measured in ctx")
        with GPUMemTrace(on_exit_report=False) as mtrace:
            some_code()
        print(mtrace)
        with GPUMemTrace(on_exit_report=False) as mtrace:
            pass
        assert mtrace.data() == (0, 0)
        print("done")
        """
    ).stdout
    assert out.splitlines() == [
        "△Used Peaked MB:      3     17",
        "△Used Peaked MB:      6     17 (2nd run of some_code())",
        "△Used Peaked MB:      6     17",
        "△Used Peaked MB:      0      0 (foobar)",
        "△Used Peaked MB:      0      0 (foobar: 1st try)",
        "△Used Peaked MB:      0      0 (foobar: reset)",
        "△Used Peaked MB:      0      0 (foobar: after reset)",
        "△Used Peaked MB:      0      0 (attr on)",
        "△Used Peaked MB:      0      0 (call on)",
        "△Used Peaked MB:      3     17 (exit)",
        "△Used Peaked MB:      3     17 (some context: exit)",
        "△Used Peaked MB:      0      2 (some_func: exit)",
        "△Used Peaked MB:      1      0 (my_function: exit)",
        "△Used Peaked MB:      0      0 (Model.fit: exit)",
        "△Used Peaked MB:      3     17 (some_func: measured in ctx)",
        "△Used Peaked MB:      3     17",
        "done",
    ]


def test_stop_freezes_and_start_restarts(runner):
    runner.run(
        """
        from gpumemhook.mem import GPUMemTrace
        t = GPUMemTrace()
        p = malloc(5 * MiB)
        t.stop()
        assert not t.is_running and t.data() == (5, 0)
        q = malloc(50 * MiB)
        assert t.data() == (5, 0)                 # frozen
        free(q)
        t.start()
        r = malloc(2 * MiB)
        free(r)
        assert t.data() == (0, 2)
        # Negative deltas, as fastai computes them.
        free(p)
        assert t.data() == (-5, 2)
        assert t.data_bytes() == (-5 * MiB, 2 * MiB)
        # Stopping twice (and deletion after) is harmless.
        t.stop(); t.stop(); del t
        """
    )


def test_1000_spikes_of_10_mib_inside_one_trace_give_the_exact_peak(runner):
    runner.run(
        """
        from gpumemhook.mem import GPUMemTrace
        threads_before = threading.active_count()
        base = malloc(7 * MiB)
        with GPUMemTrace(on_exit_report=False) as t:
            for i in range(1000):
                p = malloc(10 * MiB)
                free(p)
            # No polling thread does the measuring.
            assert threading.active_count() == threads_before
        assert t.data() == (0, 10)
        assert t.data_bytes() == (0, 10 * MiB)
        # Growing spikes: the largest one is the peak, to the byte.
        with GPUMemTrace(on_exit_report=False) as t:
            for i in range(1000):
                p = malloc(10 * MiB + i)
                free(p)
        assert t.data_bytes() == (0, 10 * MiB + 999)
        assert driver_used() == 7 * MiB
        """
    )


def test_three_threads_with_overlapping_traces_each_get_their_exact_peak(runner):
    out = runner.run(
        """
        from gpumemhook.mem import GPUMemTrace
        ev = {n: threading.Event() for n in ["a_open", "b_holds", "c_done", "a_done", "b_done"]}
        results = {}

        def a():
            with GPUMemTrace(on_exit_report=False) as t:          # used 0 at start
                p = malloc(30 * MiB); free(p)                      # spike: 30
                ev["a_open"].set()
                ev["c_done"].wait()                                 # b holds 20, c spiked to 70
            results["a"] = t.data_bytes()
            ev["a_done"].set()

        def b():
            ev["a_open"].wait()
            with GPUMemTrace(on_exit_report=False) as t:          # used 0
                keep = malloc(20 * MiB)
                ev["b_holds"].set()
                ev["c_done"].wait()
            results["b"] = t.data_bytes()
            ev["a_done"].wait()                                     # a still measures: keep holding
            free(keep)
            ev["b_done"].set()

        def c():
            ev["b_holds"].wait()
            with GPUMemTrace(on_exit_report=False) as t:          # used 20
                p = malloc(50 * MiB); free(p)                      # 70
                q = malloc(5 * MiB)
            results["c"] = t.data_bytes()
            ev["c_done"].set()
            ev["b_done"].wait()
            free(q)

        threads = [threading.Thread(target=f) for f in (a, b, c)]
        for th in threads: th.start()
        for th in threads: th.join()
        # (delta used, delta peaked) in bytes, fastai's definitions, each over its own window.
        assert results["a"] == (25 * MiB, 70 * MiB - 25 * MiB), results
        assert results["b"] == (25 * MiB, 70 * MiB - 25 * MiB), results
        assert results["c"] == (5 * MiB, 50 * MiB - 5 * MiB), results
        print("ok")
        """
    ).stdout
    assert out.strip() == "ok"


def test_without_the_hook_the_trace_hints_once_and_falls_back(runner):
    done = runner.run(
        """
        from gpumemhook.mem import *
        t = GPUMemTrace(ctx="nohook")
        p = malloc(5 * MiB)
        t.report()
        with GPUMemTrace():
            q = malloc(3 * MiB)
        @gpu_mem_trace
        def f():
            pass
        f()
        print(gpu_mem_get_used())
        """,
        hooked=False,
    )
    # The fallback samples NVML's device-wide used: deltas, no peaks.
    assert done.stdout.splitlines() == [
        "△Used Peaked MB:      5      0 (nohook)",
        "△Used Peaked MB:      3      0 (exit)",
        "△Used Peaked MB:      0      0 (f: exit)",
        "8",
    ]
    assert done.stderr.count("NotHookedWarning") == 1, done.stderr
    assert "runs without the hook" in done.stderr
    assert "LD_PRELOAD=" in done.stderr and "libgpumemhook.so" in done.stderr


def test_gpu_mem_restore_outside_ipython_passes_through():
    @mem.gpu_mem_restore
    def ok(x):
        return x + 1

    @mem.gpu_mem_restore
    def oom():
        raise RuntimeError("CUDA out of memory. Tried to allocate 2 GiB")

    assert ok(1) == 2
    with pytest.raises(RuntimeError, match="CUDA out of memory"):
        oom()


def test_gpu_mem_restore_ctx_reraises_with_cleared_frames():
    def inner():
        big = list(range(1000))  # a local the traceback would keep alive
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom") as info:
        with mem.gpu_mem_restore_ctx():
            inner()
    frames = []
    tb = info.value.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    inner_frame = [f for f in frames if f.f_code.co_name == "inner"]
    assert inner_frame and "big" not in inner_frame[0].f_locals
    with mem.gpu_mem_restore_ctx():
        pass


def test_get_ref_free_exc_info_clears_locals():
    def inner():
        big = list(range(10))  # noqa: F841
        raise KeyError("k")

    try:
        inner()
    except KeyError:
        type_, val, tb = mem.get_ref_free_exc_info()
    assert type_ is KeyError and isinstance(val, KeyError)
    while tb.tb_next is not None:
        tb = tb.tb_next
    assert tb.tb_frame.f_code.co_name == "inner" and "big" not in tb.tb_frame.f_locals


def test_gpu_mem_restore_under_ipython_strips_the_traceback(monkeypatch):
    class FakeIPython:
        @staticmethod
        def get_ipython():
            return object()

    monkeypatch.setitem(sys.modules, "IPython", FakeIPython)
    monkeypatch.delenv("FASTAI_TB_CLEAR_FRAMES", raising=False)

    @mem.gpu_mem_restore
    def oom():
        big = list(range(10))  # noqa: F841
        raise RuntimeError("CUDA out of memory.")

    with pytest.raises(RuntimeError) as info:
        oom()
    tb = info.value.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    assert "big" not in tb.tb_frame.f_locals
    assert info.value.__suppress_context__

    # Other errors keep their frames (so %debug works) unless FASTAI_TB_CLEAR_FRAMES=1.
    @mem.gpu_mem_restore
    def other():
        kept = 1  # noqa: F841
        raise ValueError("x")

    with pytest.raises(ValueError) as info:
        other()
    tb = info.value.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    assert "kept" in tb.tb_frame.f_locals


FAKE_TORCH = '''
import builtins
builtins.FAKE_TORCH_IMPORTED = True

class _Cuda:
    @staticmethod
    def is_available():
        raise AssertionError("torch.cuda.is_available() initialises CUDA")

    @staticmethod
    def is_initialized():
        return False

class _BackendsCuda:
    @staticmethod
    def is_built():
        return True

class _Backends:
    cuda = _BackendsCuda()

cuda = _Cuda()
backends = _Backends()
'''


def test_star_import_brings_fastais_companion_names_without_initialising_cuda(runner, tmp_path):
    fake = tmp_path / "fakepkgs"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text(FAKE_TORCH)
    runner.run(
        """
        import sys
        sys.path.insert(0, {fake!r})
        import gpumemhook, gpumemhook.mem
        # Importing the package imports no framework.
        assert "torch" not in sys.modules and "numpy" not in sys.modules
        ns = {{}}
        exec("from gpumemhook.mem import *", ns)
        for name in ("use_gpu", "is_osx", "IS_IN_IPYTHON", "torch", "np", "gpu_mem_get"):
            assert name in ns, name
        # The star import may import torch, as fastai's does, but never initialises CUDA.
        assert ns["torch"] is sys.modules["torch"]
        assert ns["use_gpu"] is True                  # the stand-in NVML sees 2 GPUs
        assert ns["is_osx"] is False and ns["IS_IN_IPYTHON"] is False
        assert ns["np"] is sys.modules.get("numpy")  # numpy when installed, else None
        """.format(fake=str(fake))
    )


def test_companion_names_without_torch_or_a_gpu(runner):
    runner.run(
        """
        import sys
        ns = {}
        exec("from gpumemhook.mem import *", ns)
        assert ns["torch"] is None and "torch" not in sys.modules   # no torch installed here
        assert ns["use_gpu"] is False                                # NVML sees no GPU
        """,
        env={"FAKENVML_FAIL": "1"},
    )
    runner.run(
        """
        import os
        from gpumemhook.mem import *
        assert IS_IN_IPYTHON is True and use_gpu is True
        """,
        env={"JPY_PARENT_PID": "1"},
    )


def test_used_fast_honours_the_gpu_its_handle_names(runner):
    runner.run(
        """
        from gpumemhook import _nvml
        from gpumemhook.mem import gpu_mem_get_used_fast
        a = malloc(100 * MiB, device=0)
        b = malloc(50 * MiB, device=1)
        # CUDA sees NVML's GPU 1 as its device 0 and NVML's GPU 0 as its device 1.
        assert gpu_mem_get_used_fast(_nvml.handle(1)) == 100
        assert gpu_mem_get_used_fast(_nvml.handle(0)) == 50
        assert gpu_mem_get_used_fast(0) == 100                  # an integer is a CUDA ordinal
        """,
        env={"CUDA_VISIBLE_DEVICES": "1,0"},
    )
    runner.run(
        """
        from gpumemhook import _nvml
        from gpumemhook.mem import gpu_mem_get_used_fast
        a = malloc(100 * MiB, device=0)
        # NVML's GPU 0 is not visible to this process: NVML's own figure for that GPU, not the
        # figure of this process's device 0 (which is NVML's GPU 1).
        info = _nvml.memory_info(0)
        assert gpu_mem_get_used_fast(_nvml.handle(0)) == info[2] >> 20
        assert gpu_mem_get_used_fast(_nvml.handle(1)) == 100
        """,
        env={"CUDA_VISIBLE_DEVICES": "1", "FAKENVML_OTHER_USED": str(7 << 20)},
    )
