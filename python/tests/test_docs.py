"""Every command block of README.md and docs/*.md, run as a reader would run it.

A page's fenced blocks are of three sorts (docs/testing.md, "Writing pages", says how to write them):

- ```console: lines that start with ``$ `` are commands (a line ending in ``\\`` or an open
  here-document goes on to the next line); the lines after a command, up to the next one, are what
  it prints (stdout and stderr as a terminal shows them). Where a command shows output, the output
  is compared after normalising what differs between runs (`normalise`); a line ``...`` stands for
  any number of lines, and ``[..]`` for any text within a line. Every command must exit 0 (show a failure as ``cmd; echo "exit $?"``).
- ```sh / ```bash / ```shell: a script, run whole; it must exit 0.
- any other language (``text``, ``json``, ``python``, ...): not a command, not run. A fence without
  a language is refused, so that no command hides in one.

Blocks run in the page's order, in one scratch directory per page (a file the page makes in one block
is there for the next), over the simulated CUDA stack: ``gpumemhook`` on ``PATH`` is this checkout's
CLI, ``target/`` and ``scripts/`` are links to this checkout's, ``LD_LIBRARY_PATH`` names the stand-in
driver and runtime, and the segments live in a directory of the page's own.

A block that cannot run here carries a comment on the line above it, which the page's reader does not
see: ``<!-- run: gpu -->`` (needs a real GPU; the page says where its output came from),
``<!-- run: slurm -->``, ``<!-- run: self -->`` (the test command itself), or
``<!-- run: skip REASON -->``. They are skipped, and the session's summary counts them by reason.

Set ``GPUMEMHOOK_DOCS_UPDATE=1`` to write the actual output of each command whose page no longer
matches back into the page (then read the diff, and put back ``...`` and ``[..]`` where output varies).

Why not trycmd or cram: trycmd runs each command as an argument vector, without a shell (no pipes,
``VAR=value cmd``, here-documents, ``&`` or ``export``), which a README's commands need; cram and prysk
read their own indented file format, not a page's fenced blocks.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set, Tuple

import pytest

from conftest import ROOT, TARGET

PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
RUNNABLE = {"console", "sh", "bash", "shell"}
MARK = re.compile(r"^<!--\s*run:\s*(\w+)\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^(\s*)(```+)\s*([\w+-]*)")
# Counted by reason for the summary (conftest.py prints them).
SKIPPED: Dict[str, int] = {}
RAN: List[str] = []
# A block that runs longer has hung (a background program that never became ready, say).
BLOCK_SECONDS = 120


@dataclass
class Command:
    text: str  # as written, without the `$ ` prompts
    line: int  # 1-based line of its `$ `
    output: List[str] = field(default_factory=list)
    output_lines: Tuple[int, int] = (0, 0)  # the file's lines [start, end) holding the output


@dataclass
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    body: List[str]
    mark: Optional[Tuple[str, str]]
    body_start: int  # 0-based index of the body's first line in the file

    @property
    def id(self) -> str:
        return "{}:{}".format(self.page.relative_to(ROOT), self.line)

    def commands(self) -> List[Command]:
        out: List[Command] = []
        lines = self.body
        i = 0
        while i < len(lines):
            raw = lines[i]
            if raw.startswith("$ ") or raw == "$":
                start = i
                text = [raw[2:]]
                heredoc = _heredoc_end(raw[2:])
                while i + 1 < len(lines) and (heredoc or text[-1].endswith("\\")):
                    i += 1
                    text.append(lines[i])
                    if heredoc and lines[i].strip() == heredoc:
                        heredoc = None
                cmd = Command("\n".join(text), self.body_start + start + 1)
                j = i + 1
                while j < len(lines) and not lines[j].startswith("$ "):
                    cmd.output.append(lines[j])
                    j += 1
                cmd.output_lines = (self.body_start + i + 1, self.body_start + j)
                out.append(cmd)
                i = j
            else:
                i += 1
        return out


def _heredoc_end(text: str) -> Optional[str]:
    m = re.search(r"<<-?\s*['\"]?(\w+)['\"]?", text)
    return m.group(1) if m else None


def blocks_of(page: Path) -> List[Block]:
    lines = page.read_text().split("\n")
    found: List[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, ticks, lang = m.group(1), m.group(2), m.group(3)
        mark = None
        if i > 0:
            mm = MARK.match(lines[i - 1].strip())
            if mm:
                mark = (mm.group(1), mm.group(2))
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(ticks):
            j += 1
        body = [ln[len(indent):] if ln.startswith(indent) else ln for ln in lines[i + 1 : j]]
        found.append(Block(page, i + 1, lang, body, mark, i + 1))
        i = j + 1
    return found


ALL_BLOCKS = [b for page in PAGES for b in blocks_of(page)]


def test_every_fence_says_what_it_holds():
    bare = [b.id for b in ALL_BLOCKS if not b.lang]
    assert not bare, "fenced blocks without a language (console, sh, text, json, ...): {}".format(bare)
    bad = [b.id for b in ALL_BLOCKS if b.lang == "console" and not b.commands()]
    assert not bad, "console blocks with no `$ ` command: {}".format(bad)


# ---------------------------------------------------------------------------------------------
# Normalising what differs between runs.

_RULES = [
    # Addresses.
    (re.compile(r"0x[0-9a-f]{6,}"), "0x<addr>"),
    # Wall-clock times of day and dates.
    (re.compile(r"\b\d\d:\d\d:\d\d\b"), "<clock>"),
    (re.compile(r"\b\d{4}-\d\d-\d\d[T ]\d\d:\d\d(:\d\d(\.\d+)?)?Z?"), "<date>"),
    # Durations: 12.1 s, 618 ms, +5.2 s, 0.51s, 3 min 43 s, 40 µs.
    (re.compile(r"[+]?\b\d+(\.\d+)?\s?(ns|µs|us|ms|s|min|h)\b"), "<dur>"),
    # Process ids where a page shows them.
    (re.compile(r"\b(pid|process|PID)(\s+|=|: ?\"?)\d+"), r"\1\2<pid>"),
    (re.compile(r"^\d+(?=\s{2,})"), "<pid>"),
    (re.compile(r"\"pid\": \d+"), '"pid": <pid>'),
    (re.compile(r"gpumemhook-(\d+)-\d+"), r"gpumemhook-\1-<pid>"),
    (re.compile(r"\bpid=\"\d+\""), 'pid="<pid>"'),
    # Unix times in nanoseconds.
    (re.compile(r"\b1\d{18}\b"), "<unix-ns>"),
    # Event counts of a timeline change with the Python version's own allocations; they stay.
]


# Paths into a checkout's build outputs, wherever the checkout is (a clone, a worktree).
_BUILD_PATH = re.compile(r"(?<![\w.])/\S*?/(target/\S+)")


def shown_in_page(text: str, scratch: Path) -> str:
    """`text` as a page shows it: the page's scratch directory is where the reader stands (paths in it
    relative), its home `~`."""
    text = text.replace(str(scratch / ".home"), "~").replace(str(scratch) + "/", "")
    return text.replace(str(scratch), ".")


def normalise(text: str, scratch: Path) -> List[str]:
    text = _BUILD_PATH.sub(r"\1", text)
    text = shown_in_page(text, scratch).replace(str(ROOT), "<repo>")
    text = text.replace(sys.executable, "python3")
    out = []
    for line in text.split("\n"):
        for rule, repl in _RULES:
            line = rule.sub(repl, line)
        # Column widths follow the widest value: compare words, not spaces.
        out.append(" ".join(line.split()))
    while out and not out[-1]:
        out.pop()
    return out


def line_matches(want: str, got: str) -> bool:
    """Whether one line fits, where `[..]` in `want` takes any text."""
    if "[..]" not in want:
        return want == got
    pattern = ".*".join(re.escape(part) for part in want.split("[..]"))
    return re.fullmatch(pattern, got) is not None


def matches(want: List[str], got: List[str]) -> bool:
    """Whether `got` fits `want`, where a `...` line of `want` takes any number of lines."""
    if not want:
        return not got
    if want[0] == "...":
        return any(matches(want[1:], got[k:]) for k in range(len(got) + 1))
    return bool(got) and line_matches(want[0], got[0]) and matches(want[1:], got[1:])


# ---------------------------------------------------------------------------------------------
# Running a page's blocks.

_SEPARATOR = "@@gpumemhook-docs-{}@@"


def _environment(scratch: Path, sim: Path, cli: Path) -> Dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("GPUMEMHOOK_", "FAKECUDA_", "FAKENVML_", "FAKECUDART_"))
        and k not in ("LD_PRELOAD", "LD_LIBRARY_PATH", "NO_COLOR", "COLUMNS")
    }
    shm = scratch / ".shm"
    shm.mkdir(exist_ok=True)
    env.update(
        {
            "PATH": os.pathsep.join([str(cli.parent), str(Path(sys.executable).parent), env.get("PATH", "")]),
            "LD_LIBRARY_PATH": str(sim),
            "GPUMEMHOOK_NVML_LIB": str(sim / "libnvidia-ml.so.1"),
            "GPUMEMHOOK_SHM_DIR": str(shm),
            "PYTHONUNBUFFERED": "1",
            "HOME": str(scratch / ".home"),
            "NO_COLOR": "1",
            "COLUMNS": "100",
        }
    )
    return env


def _scratch_for(page: Path, base: Path) -> Path:
    scratch = base / page.stem
    if not scratch.exists():
        scratch.mkdir(parents=True)
        (scratch / ".home").mkdir()
        for name in ("target", "scripts", "tests", "python", "docs"):
            os.symlink(ROOT / name, scratch / name)
        for name in ("Cargo.toml", "Cargo.lock", "pyproject.toml", "README.md"):
            os.symlink(ROOT / name, scratch / name)
    return scratch


def run_console(block: Block, env: Dict[str, str], scratch: Path) -> List[Tuple[Command, str, int]]:
    commands = block.commands()
    script = ["exec 2>&1", "cd {}".format(_quote(str(scratch)))]
    for n, cmd in enumerate(commands):
        script.append(cmd.text)
        script.append('printf "\\n{}%s\\n" "$?"'.format(_SEPARATOR.format(n)))
    script.append("kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; true")
    proc = subprocess.Popen(
        ["bash", "-c", "\n".join(script)],
        env=env,
        cwd=str(scratch),
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        errors="replace",
        start_new_session=True,  # the block's background jobs too, to end them all on a time-out
    )
    try:
        stdout, _ = proc.communicate(timeout=BLOCK_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        stdout, _ = proc.communicate()
        pytest.fail("{}: still running after {} s; its output:\n{}".format(block.id, BLOCK_SECONDS, stdout))
    done = subprocess.CompletedProcess(proc.args, proc.returncode, stdout)
    results = []
    rest = done.stdout
    for n, cmd in enumerate(commands):
        sep = "\n" + _SEPARATOR.format(n)
        at = rest.find(sep)
        assert at >= 0, "{}: the block stopped before its command at line {} ran:\n{}".format(
            block.id, cmd.line, rest
        )
        output, rest = rest[:at], rest[at + len(sep) :]
        status_text, _, rest = rest.partition("\n")
        results.append((cmd, output, int(status_text)))
    return results


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


_UPDATES: Dict[Path, List[Tuple[Tuple[int, int], List[str]]]] = {}


@pytest.fixture(scope="module")
def docs_scratch(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("docs")


@pytest.mark.parametrize("block", [b for b in ALL_BLOCKS if b.lang in RUNNABLE], ids=lambda b: b.id)
def test_the_block_runs_as_the_page_says(block: Block, docs_scratch: Path, sim_dir: Path, cli_bin: Path):
    if block.mark and block.mark[0] != "sim":
        reason = block.mark[0]
        SKIPPED[reason] = SKIPPED.get(reason, 0) + 1
        pytest.skip("{} ({}{})".format(block.id, reason, ": " + block.mark[1] if block.mark[1] else ""))
    scratch = _scratch_for(block.page, docs_scratch)
    env = _environment(scratch, sim_dir, cli_bin)
    RAN.append(block.id)
    if block.lang != "console":
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", "\n".join(block.body)],
            env=env,
            cwd=str(scratch),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, "{} exited {}:\n{}{}".format(block.id, done.returncode, done.stdout, done.stderr)
        return
    update = os.environ.get("GPUMEMHOOK_DOCS_UPDATE") == "1"
    failures = []
    for cmd, output, status in run_console(block, env, scratch):
        if status != 0:
            failures.append("line {}: `{}` exited {}:\n{}".format(cmd.line, cmd.text, status, output))
            continue
        if not cmd.output or all(not ln.strip() for ln in cmd.output):
            continue
        want = normalise("\n".join(cmd.output), scratch)
        got = normalise(output, scratch)
        if update and not matches(want, got):
            shown = shown_in_page(output, scratch).rstrip("\n").split("\n")
            _UPDATES.setdefault(block.page, []).append((cmd.output_lines, shown))
            continue
        if not update and not matches(want, got):
            failures.append(
                "line {}: `{}` printed, normalised:\n{}\n--- where the page shows:\n{}".format(
                    cmd.line, cmd.text, "\n".join(got), "\n".join(want)
                )
            )
    assert not failures, "{}:\n".format(block.id) + "\n\n".join(failures)


def write_updates() -> None:
    """Writes the collected outputs back into their pages (GPUMEMHOOK_DOCS_UPDATE=1)."""
    for page, edits in _UPDATES.items():
        lines = page.read_text().split("\n")
        for (start, end), shown in sorted(edits, key=lambda e: e[0][0], reverse=True):
            lines[start:end] = shown
        page.write_text("\n".join(lines))


LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_every_link_between_the_pages_leads_somewhere():
    """A relative link of README.md, docs/ or scripts/README.md names a file of the repository (no
    page points outside it, and a page moved or renamed leaves no dead link behind)."""
    dead = []
    outside = []
    for page in PAGES + [SCRIPTS / "README.md"]:
        in_fence = False
        for number, line in enumerate(page.read_text().split("\n"), 1):
            if FENCE.match(line):
                in_fence = not in_fence
                continue
            if in_fence:
                continue
            for target in LINK.findall(line):
                if re.match(r"[a-z]+:", target):
                    outside.append("{}:{}: {}".format(page.relative_to(ROOT), number, target))
                    continue
                path = target.split("#")[0]
                if path and not (page.parent / path).exists():
                    dead.append("{}:{}: {}".format(page.relative_to(ROOT), number, target))
    assert not dead, "links to nothing:\n" + "\n".join(dead)
    assert not outside, "links out of the repository:\n" + "\n".join(outside)


def prose_of(page: Path) -> str:
    """The page's text outside its fenced blocks, its lines joined by spaces (a reference may break
    across lines)."""
    kept, in_fence = [], False
    for line in page.read_text().split("\n"):
        if FENCE.match(line):
            in_fence = not in_fence
        elif not in_fence:
            kept.append(line)
    return " ".join(kept)


def headings_of(page: Path) -> List[str]:
    """The page's headings as written (`#` marks dropped), fenced blocks left out."""
    found, in_fence = [], False
    for line in page.read_text().split("\n"):
        if FENCE.match(line):
            in_fence = not in_fence
        elif not in_fence and re.match(r"#{1,6} ", line):
            found.append(line.lstrip("#").strip())
    return found


def github_anchors(page: Path) -> Set[str]:
    """The anchors GitHub gives the page's headings: the text as rendered (code marks and link
    targets gone), lowercased, every character but letters, digits, `-`, `_` and spaces dropped,
    spaces made `-`; a repeated one gets `-1`, `-2`, ..."""
    seen: Dict[str, int] = {}
    anchors = set()
    for heading in headings_of(page):
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
        slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else "{}-{}".format(slug, n))
    return anchors


# A paragraph's bold run-in title (`**Sizes.** A size ...`, `- **Other users.** The ...`).
RUN_IN = re.compile(r"^\s*(?:- )?\*\*([^*]+?)\.?\*\*")


def names_a_section(page: Path, name: str) -> bool:
    """Whether `name` is a heading of `page`, or a paragraph's bold run-in title: as written or as
    rendered (code marks gone), whole or the part before its `:` (`Budgets in tests` of "Budgets in
    tests: `pytest --gpumem`")."""
    name = " ".join(name.split())
    run_ins = [m.group(1) for m in map(RUN_IN.match, page.read_text().split("\n")) if m]
    for heading in headings_of(page) + run_ins:
        for text in (heading, heading.replace("`", "")):
            if name in (text, text.split(":")[0].strip()):
                return True
    return False


# A section named in prose: `the README's "X"`, `the README, "X"`, `the README, section "X"`,
# `[page.md](page.md), "X"`, `"X" in [page.md](page.md)`, and `see "X"` (a section of the same page).
README_SECTION = re.compile(r"README(?:'s|,)\s+(?:section\s+)?\"([^\"]+)\"")
PAGE_SECTION = re.compile(r"\]\(([^)#\s]+\.md)\),?\s+(?:section\s+)?\"([^\"]+)\"")
SECTION_IN_PAGE = re.compile(r"\"([^\"]+)\"\s+in\s+\[[^\]]*\]\(([^)#\s]+\.md)\)")
SAME_PAGE_SECTION = re.compile(r"\b[Ss]ee\s+\"([^\"]+)\"(?!\s+in\s+\[)")
ANCHOR_LINK = re.compile(r"\]\(([^)#\s]*)#([^)\s]+)\)")


def section_references(page: Path) -> Iterator[Tuple[Path, str, str]]:
    """`(page it names, section or #anchor, the reference as written)` of every reference to a
    section in `page`'s prose."""
    text = prose_of(page)
    for m in README_SECTION.finditer(text):
        yield ROOT / "README.md", m.group(1), m.group(0)
    for m in PAGE_SECTION.finditer(text):
        yield (page.parent / m.group(1)).resolve(), m.group(2), m.group(0)
    for m in SECTION_IN_PAGE.finditer(text):
        yield (page.parent / m.group(2)).resolve(), m.group(1), m.group(0)
    for m in SAME_PAGE_SECTION.finditer(text):
        yield page, m.group(1), m.group(0)
    for m in ANCHOR_LINK.finditer(text):
        target = (page.parent / m.group(1)).resolve() if m.group(1) else page
        if target.suffix == ".md":
            yield target, "#" + m.group(2), m.group(0)


def test_every_reference_to_a_section_names_one_that_exists():
    """A "see X" of README.md or docs/ (quoted, after the page it is in, or a `#anchor` link as
    GitHub renders anchors) names a section of that page."""
    missing = []
    for page in PAGES:
        for target, section, written in section_references(page):
            if not target.exists():
                continue  # a dead link: test_every_link_between_the_pages_leads_somewhere
            if section.startswith("#"):
                found = section[1:] in github_anchors(target)
            else:
                found = names_a_section(target, section)
            if not found:
                missing.append("{}: {} (no such section in {})".format(
                    page.relative_to(ROOT), written, target.relative_to(ROOT)))
    assert not missing, "references to sections that do not exist:\n" + "\n".join(missing)


def test_the_readme_stays_under_2500_words():
    words = len((ROOT / "README.md").read_text().split())
    assert words < 2500, "README.md has {} words; the first page stays under 2,500".format(words)


# ---------------------------------------------------------------------------------------------
# scripts/ and its README.

SCRIPTS = ROOT / "scripts"
# The first cell of a table row of scripts/README.md: a path under scripts/.
LISTED = re.compile(r"^\| `([^`]+)` \|")
SHELL_NAME = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
PYTHON_NAME = re.compile(r"^[a-z0-9]+(_[a-z0-9]+)*\.py$")
TOP_LEVEL_MOST = 12


def _scripts_files() -> List[Path]:
    """Every file under scripts/, less what running them leaves (bytecode caches)."""
    found = []
    for path in sorted(SCRIPTS.rglob("*")):
        rel = path.relative_to(SCRIPTS)
        if any(part == "__pycache__" or part.startswith(".") for part in rel.parts):
            continue
        if path.is_file():
            found.append(path)
    return found


def test_scripts_are_named_by_one_rule_and_listed_in_their_readme():
    """scripts/README.md's naming rule holds and its tables list exactly the files there are: a
    shell script or folder is lowercase words joined by `-` with no extension, a Python file
    lowercase words joined by `_` ending in `.py`; no name repeats its folder; at most 12 entries at
    the top and in each folder; every shell script parses (`bash -n`) and every Python file compiles."""
    top = [p.name for p in SCRIPTS.iterdir() if p.name != "__pycache__" and not p.name.startswith(".")]
    assert len(top) <= TOP_LEVEL_MOST, "scripts/ holds {} entries at the top (at most {}): {}".format(
        len(top), TOP_LEVEL_MOST, sorted(top)
    )
    # Each folder too: a flat folder past that is split by what its scripts are for (as gpu/ is).
    crowded = []
    for folder in [SCRIPTS] + [p for p in SCRIPTS.rglob("*") if p.is_dir()]:
        if folder.name == "__pycache__":
            continue
        entries = [p.name for p in folder.iterdir() if p.name != "__pycache__" and not p.name.startswith(".")]
        if len(entries) > TOP_LEVEL_MOST:
            crowded.append("{} ({} entries)".format(folder.relative_to(SCRIPTS.parent), len(entries)))
    assert not crowded, "folders of scripts/ with more than {} entries: {}".format(TOP_LEVEL_MOST, crowded)

    listed = set()
    for line in (SCRIPTS / "README.md").read_text().split("\n"):
        m = LISTED.match(line)
        if m:
            listed.add(m.group(1))
    files = {str(p.relative_to(SCRIPTS)) for p in _scripts_files()}
    folders = {name + "/" for name in top if (SCRIPTS / name).is_dir()}
    missing = sorted(files - listed)
    assert not missing, "files of scripts/ that scripts/README.md does not list: {}".format(missing)
    stale = sorted(listed - files - folders)
    assert not stale, "scripts/README.md lists what scripts/ does not hold: {}".format(stale)

    misnamed = []
    broken = []
    for path in _scripts_files():
        rel = path.relative_to(SCRIPTS)
        if str(rel) == "README.md":
            continue
        for folder in rel.parts[:-1]:
            if not SHELL_NAME.match(folder):
                misnamed.append("{} (folder {})".format(rel, folder))
        name = rel.name
        parent = rel.parts[-2] if len(rel.parts) > 1 else None
        if parent and (name.split(".")[0] == parent or re.match(re.escape(parent) + r"[-_]", name)):
            misnamed.append("{} (repeats its folder)".format(rel))
        if name.endswith(".py"):
            if not PYTHON_NAME.match(name):
                misnamed.append(str(rel))
            try:
                compile(path.read_text(), str(path), "exec")
            except SyntaxError as e:
                broken.append("{}: {}".format(rel, e))
        elif SHELL_NAME.match(name):
            done = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
            if done.returncode != 0:
                broken.append("{}: {}".format(rel, done.stderr.strip()))
        else:
            misnamed.append(str(rel))
    assert not misnamed, "names against scripts/README.md's rule: {}".format(misnamed)
    assert not broken, "scripts that do not parse:\n" + "\n".join(broken)
