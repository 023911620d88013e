"""The IPython extension (`%load_ext gpumemhook`), driven through a stand-in shell that offers
what IPython offers an extension (`events.register/unregister`, `register_magic_function`), so the
test needs no IPython: per-cell reports with consumed, exact peak and used GPU memory, RAM and
time, compact or not, magics, unloading."""

from __future__ import annotations

import re
from textwrap import dedent

SHELL = """
import re
import gpumemhook

class Events:
    def __init__(self):
        self.callbacks = {"pre_run_cell": [], "post_run_cell": []}
    def register(self, event, callback):
        self.callbacks[event].append(callback)
    def unregister(self, event, callback):
        self.callbacks[event].remove(callback)
    def trigger(self, event, *args):
        for callback in list(self.callbacks[event]):
            callback(*args)

class Shell:
    def __init__(self):
        self.events = Events()
        self.magics = {}
    def register_magic_function(self, func, magic_kind="line", magic_name=None):
        self.magics[magic_name] = func
    def run_cell(self, body):
        self.events.trigger("pre_run_cell", object())    # IPython >= 7 passes an info object
        body()
        self.events.trigger("post_run_cell", object())

shell = Shell()
"""


def test_reports_after_each_cell_with_the_exact_peak(runner):
    out = runner.run(
        SHELL
        + dedent(
            """
        # `%load_ext gpumemhook` runs inside a cell: the extension measures the rest of that cell.
        gpumemhook.load_ipython_extension(shell)
        held = []
        held.append(malloc(4 * MiB))
        shell.events.trigger("post_run_cell", object())

        def cell():
            spike = malloc(40 * MiB)          # a short spike a polling thread could miss
            free(spike)
            held.append(malloc(10 * MiB))
        shell.run_cell(cell)
        d = gpumemhook.ipython._logger.data
        assert (d.gpu_mem_used_delta, d.gpu_mem_peaked, d.gpu_mem_used) == (10, 30, 14), d
        assert d.time_delta >= 0 and d.gen_mem_used > 0

        shell.magics["gpumemhook"]("compact")
        def cell2():
            free(held.pop())
            p = malloc(5 * MiB)
            free(p)
        # ipygpulogger's identity: what the cell needed above its start = consumed + peaked, so
        # a cell that frees 10 MiB reports -10 consumed and 10 peaked (it never went above 0).
        shell.run_cell(cell2)
        shell.magics["gpumemhook"]("full")
        shell.run_cell(lambda: None)
        shell.magics["gpumemhook"]("stop")
        shell.run_cell(lambda: None)                       # nothing reported
        shell.magics["gpumemhook"]("start")
        shell.events.trigger("post_run_cell", object())
        gpumemhook.unload_ipython_extension(shell)
        assert shell.events.callbacks == {"pre_run_cell": [], "post_run_cell": []}
        shell.run_cell(lambda: None)                       # nothing reported
        print("END")
        """
        )
    ).stdout
    lines = out.splitlines()
    header = r"RAM: Consumed Peaked  Used Total \| Exec time \d+\.\d{3}s"
    gen = r"Gen:    [ \d-]{5}  [ \d]{5}    [ \d]{5} MB \|"

    expected = [
        (header, gen, r"GPU:        4      0        4 MB \|"),
        (header, gen, r"GPU:       10     30       14 MB \|"),
        (
            r"Gen: -?\d+/\d+/\d+ MB \| GPU: -10/10/4 MB \| Time \d+\.\d{3}s \| "
            r"\(Consumed/Peaked/Used Total\)",
        ),
        (header, gen, r"GPU:        0      0        4 MB \|"),
        (header, gen, r"GPU:        0      0        4 MB \|"),
    ]
    patterns = [p for group in expected for p in group] + ["END"]
    assert len(lines) == len(patterns), out
    for line, pattern in zip(lines, patterns):
        assert re.fullmatch(pattern, line), (line, pattern)


def test_without_the_hook_the_extension_reports_and_hints_once(runner):
    done = runner.run(
        SHELL
        + dedent(
            """
        gpumemhook.load_ipython_extension(shell)
        shell.events.trigger("post_run_cell", object())
        shell.run_cell(lambda: malloc(3 * MiB))
        shell.run_cell(lambda: None)
        """
        ),
        hooked=False,
    )
    lines = done.stdout.splitlines()
    assert len(lines) == 9 and lines[5] == "GPU:        3      0        3 MB |", lines
    assert done.stderr.count("NotHookedWarning") == 1
    assert "IPython extension runs without the hook" in done.stderr


def test_ipygpulogger_signature_compact_first_and_the_shell_found_by_itself(runner):
    out = runner.run(
        SHELL
        + dedent(
            """
        import sys, types
        from gpumemhook.ipython import IPyGPULogger, GPUMemLogger
        # Outside IPython it says where it works instead of failing obscurely.
        sys.modules.pop("IPython", None)
        fake = types.ModuleType("IPython")
        fake.get_ipython = lambda: None
        sys.modules["IPython"] = fake
        try:
            IPyGPULogger()
        except RuntimeError as e:
            assert "IPython" in str(e) and "Jupyter" in str(e), e
        else:
            raise AssertionError("no shell, no error")
        # Inside one, as ipygpulogger's users write it: found by itself.
        fake.get_ipython = lambda: shell
        logger = IPyGPULogger(True)                       # compact, positionally
        assert isinstance(logger, GPUMemLogger)
        assert logger.ipython is shell and logger.compact and logger.gc_collect
        assert logger.start() is logger
        held = malloc(6 * MiB)
        shell.events.trigger("post_run_cell", object())
        logger.stop()
        full = IPyGPULogger(compact=False, gc_collect=False).start()
        assert not full.compact and not full.gc_collect
        shell.run_cell(lambda: None)
        full.stop()
        assert shell.events.callbacks == {"pre_run_cell": [], "post_run_cell": []}
        """
        )
    ).stdout
    lines = out.splitlines()
    assert re.fullmatch(r"Gen: -?\d+/\d+/\d+ MB \| GPU: 6/0/6 MB \| Time .*", lines[0]), out
    assert lines[1].startswith("RAM: Consumed Peaked  Used Total"), out
    assert lines[3] == "GPU:        0      0        6 MB |", out
