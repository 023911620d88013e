"""The `gpumemhook` console script (and ``python -m gpumemhook``).

It execs the real CLI, the Rust binary bundled in the package (``gpumemhook/bin/gpumemhook``, or
``target/release/gpumemhook`` in a checkout), telling it where the bundled preload library is
(``GPUMEMHOOK_LIB``). When no binary is there, a small fallback in Python keeps the essentials:
``run [--limit SIZE] -- CMD...``, ``list`` and ``library-path``.
"""

from __future__ import annotations

import os
import sys
from typing import List, Optional

from . import _native
from ._core import cli_path, library_path

_USAGE = """\
usage: gpumemhook run [--limit SIZE] [--] CMD [ARG...]   run CMD under the hook
       gpumemhook list                                  hooked processes of this user
       gpumemhook library-path                          print the preload library's path

(This is the Python fallback: the full gpumemhook CLI is not bundled in this installation.)"""


def _run(args: List[str]) -> int:
    limit: Optional[str] = None
    while args and args[0].startswith("-"):
        flag = args.pop(0)
        if flag == "--":
            break
        if flag == "--limit" and args:
            limit = args.pop(0)
        elif flag.startswith("--limit="):
            limit = flag.split("=", 1)[1]
        else:
            print("gpumemhook run: unknown option {}\n\n{}".format(flag, _USAGE), file=sys.stderr)
            return 2
    if not args:
        print(_USAGE, file=sys.stderr)
        return 2
    env = dict(os.environ)
    # As `gpumemhook run` does: the hook first, and no second copy of it from the current value.
    env["LD_PRELOAD"] = _native.preload_value(env.get("LD_PRELOAD"), library_path())
    if limit is not None:
        try:
            _native.parse_size(limit)
        except ValueError as e:
            # The one parser's line (`8 what? write 8GiB, or 8B for bytes`), before anything runs.
            print("gpumemhook run: --limit: {}".format(e), file=sys.stderr)
            return 2
        env[_native.ENV_LIMIT] = limit
    try:
        os.execvpe(args[0], args, env)
    except OSError as e:
        print("gpumemhook run: {}: {}".format(args[0], e), file=sys.stderr)
        return 127
    return 0  # not reached: exec replaced the process


def _list() -> int:
    from ._native import format_size, list_processes

    procs = list_processes()
    if not procs:
        print("no hooked processes", file=sys.stderr)
        return 0
    print("{:>8}  {:>12}  {:>12}  {}".format("PID", "USED", "PEAK", "COMMAND"))
    for p in procs:
        devices = p.active_devices() or [0]
        used = sum(p.used(d) for d in devices)
        peak = sum(p.peak(d) for d in devices)
        print("{:>8}  {:>12}  {:>12}  {}".format(p.pid, format_size(used), format_size(peak), p.command))
    return 0


def _fallback(argv: List[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "run":
        return _run(list(rest))
    if command in ("list", "ps"):
        return _list()
    if command in ("library-path", "--library-path"):
        print(library_path())
        return 0
    print("gpumemhook: unknown command {!r}\n\n{}".format(command, _USAGE), file=sys.stderr)
    return 2


def main(argv: Optional[List[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] in (["library-path"], ["--library-path"]):
        # Only the package knows where its bundled library is.
        print(library_path())
        return 0
    binary = cli_path()
    if binary is not None and os.environ.get(_native.ENV_PYTHON_CLI, "") in ("", "0"):
        env = dict(os.environ)
        try:
            env.setdefault(_native.ENV_LIB, library_path())
        except FileNotFoundError:
            pass
        os.execve(binary, [binary] + args, env)
    return _fallback(args)


if __name__ == "__main__":
    sys.exit(main())
