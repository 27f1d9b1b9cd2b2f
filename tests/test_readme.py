"""The documentation's code cannot rot: the Python blocks of README.md and of
every docs/*.md run, in order, one namespace per file, as a reader would
paste them; the README opens with the commands that work on a fresh machine;
the `hybridcache` commands shown parse; the paths and links named exist; and
neither the README nor docs/ speak of how the project is developed.

A Python block runs unless the line before its fence is a marker:
  <!-- readme-test: needs-vllm -->   run in its own process, under whichever
                                     supported vLLM is installed; skipped without vLLM
  <!-- readme-test: skip -->         not run (a fragment, shown for reading)
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
FILES = [README, *DOCS]
MARKER = re.compile(r"<!--\s*readme-test:\s*(?P<what>[\w-]+)\s*-->")
MARKERS = {"needs-vllm", "skip"}


@dataclass
class Block:
    lang: str
    line: int  # 1-based line of the block's first code line
    code: str
    marker: str | None
    path: Path = README

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks(path: Path = README) -> list[Block]:
    lines = path.read_text().splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = re.match(r"^```(\S*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        prev = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        mk = MARKER.search(prev)
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        out.append(Block(m.group(1), i + 2, "\n".join(lines[i + 1 : end]) + "\n", mk.group("what") if mk else None,
                         path))
        i = end + 1
    return out


ALL = {p: blocks(p) for p in FILES}
RUN = [(p, i) for p in FILES for i, _ in enumerate(b for b in ALL[p] if b.lang == "python" and b.marker is None)]
NEEDS_VLLM = [b for p in FILES for b in ALL[p] if b.lang == "python" and b.marker == "needs-vllm"]


def _run_blocks(path: Path) -> list[Block]:
    return [b for b in ALL[path] if b.lang == "python" and b.marker is None]


def _compiled(block: Block):
    # Padded so that a traceback names the file's own line numbers.
    return compile("\n" * (block.line - 1) + block.code, str(block.path), "exec")


def test_every_doc_is_read() -> None:
    names = {p.name for p in DOCS}
    assert {"usage.md", "compatibility.md", "performance.md", "reliability.md", "architecture.md",
            "development.md"} <= names, names


def test_markers_are_known() -> None:
    for p in FILES:
        for b in ALL[p]:
            assert b.marker in MARKERS | {None}, f"{b.where}: unknown marker {b.marker!r}"


def test_the_examples_are_there() -> None:
    """The README's short example and its vLLM snippets, and usage.md's whole
    walk-through (several blocks), must not vanish."""
    calls = ("get_computed_blocks(", "allocate_slots(", "spec_token_ids", "allow_none=True",
             "num_computed_tokens", "append_output_token_ids(", ".free(")
    readme = "".join(b.code for b in _run_blocks(README))
    usage = _run_blocks(ROOT / "docs" / "usage.md")
    assert len(usage) >= 5, [b.line for b in usage]
    for call in calls:
        assert call in readme, f"README.md: {call}"
        assert call in "".join(b.code for b in usage), f"docs/usage.md: {call}"
    readme_vllm = "".join(b.code for b in NEEDS_VLLM if b.path == README)
    for what in ("hybridcache.vllm.install()", "facade_class()", "HYBRIDCACHE_ENABLE"):
        assert what in readme_vllm, what


def test_opening_commands() -> None:
    """The README starts with two commands that work on a fresh machine: one
    that shows the gain against vLLM, one that installs and passes the tests."""
    lines = README.read_text().splitlines()
    first = ALL[README][0]
    assert first.lang == "bash"
    assert first.line <= 4, "the commands must open the README, right under its title"
    assert lines[0].startswith("# ")
    commands = [ln.strip() for ln in first.code.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    assert commands == ["bash scripts/try.sh", "bash .ci/run"]
    assert (ROOT / "scripts" / "try.sh").is_file()
    assert (ROOT / ".ci" / "run").is_file()


def test_readme_is_a_page_not_a_log() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 260, len(lines)
    long = [(n, len(ln)) for n, ln in enumerate(lines, 1) if len(ln) > 200]
    assert not long, f"README.md lines over 200 characters: {long}"


@pytest.mark.parametrize("path, index", RUN, ids=[f"{p.relative_to(ROOT)}:{_run_blocks(p)[i].line}" for p, i in RUN])
def test_python_block_runs(path: Path, index: int) -> None:
    """Block `index` of `path` runs after the blocks before it, in one namespace."""
    namespace: dict[str, object] = {"__name__": "__readme__"}
    run = _run_blocks(path)
    for b in run[:index]:
        exec(_compiled(b), namespace)
    exec(_compiled(run[index]), namespace)


@pytest.mark.vllm()
@pytest.mark.parametrize("index", range(len(NEEDS_VLLM)), ids=[b.where for b in NEEDS_VLLM])
def test_vllm_block_runs(index: int, vllm_available: bool) -> None:
    """Blocks that need vLLM run in their own process (install() patches
    vLLM's scheduler module for the whole process)."""
    block = NEEDS_VLLM[index]
    code = "\n" * (block.line - 1) + block.code
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=ROOT / "tests")
    assert r.returncode == 0, f"{block.where} failed:\n{r.stdout}\n{r.stderr}"


def _shown_commands() -> list[tuple[str, list[str]]]:
    """Every `hybridcache replay|bench|verify ...` the documentation shows: in
    shell blocks (continuation lines joined) and in inline code."""
    found = []
    for p in FILES:
        for b in ALL[p]:
            if b.lang not in ("bash", "sh", "shell"):
                continue
            for line in b.code.replace("\\\n", " ").splitlines():
                words = shlex.split(line, comments=True)
                while words and re.match(r"^[A-Z_]+=", words[0]):
                    words = words[1:]
                if words[:1] == ["hybridcache"] and len(words) > 1:
                    found.append((b.where, words[1:]))
        text = p.read_text()
        for m in re.finditer(r"`hybridcache ((?:replay|bench|verify)[^`]*)`", text):
            args = m.group(1)
            if any(c in args for c in "[…|") or " " not in args:
                continue  # a usage line, or the command's name
            found.append((f"{p.relative_to(ROOT)}", shlex.split(args)))
    return found


def test_commands_shown_parse() -> None:
    from hybridcache.__main__ import build_parser

    shown = _shown_commands()
    assert any(args[:1] == ["verify"] for _, args in shown)
    assert any("--step" in args for _, args in shown)
    for where, args in shown:
        try:
            build_parser().parse_args(args)
        except SystemExit as e:
            if e.code == 0 and args[:1] in (["--version"], ["--help"], ["-h"]):
                continue  # printed, as asked
            raise AssertionError(f"{where}: `hybridcache {' '.join(args)}` does not parse") from e


PATH_RE = re.compile(r"`((?:\.ci|scripts|tests|benchmarks|python|rust|fuzz|dev)/[^`\s]*)`")


def test_paths_named_exist() -> None:
    named = 0
    missing = []
    for p in FILES:
        paths = {m.group(1).split("::")[0].rstrip("/.,") for m in PATH_RE.finditer(p.read_text())}
        paths = {x for x in paths if not x.startswith("tests/v1/")}  # vLLM's own test tree
        named += len(paths)
        missing += [f"{p.relative_to(ROOT)}: {x}" for x in sorted(paths) if not (ROOT / x).exists()]
    assert named > 40
    assert not missing, f"paths named that do not exist: {missing}"


def test_block_parser_reads_markers(tmp_path: Path) -> None:
    md = tmp_path / "x.md"
    md.write_text("text\n\n<!-- readme-test: needs-vllm -->\n```python\nx = 1\n```\n```bash\nls\n```\n")
    got = blocks(md)
    assert [(b.lang, b.line, b.code, b.marker) for b in got] == [
        ("python", 5, "x = 1\n", "needs-vllm"),
        ("bash", 8, "ls\n", None),
    ]


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    in_code = False
    slugs = set()
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            slugs.add(_slug(line.lstrip("#")))
    return slugs


def _prose(path: Path) -> str:
    """The file without its code blocks."""
    return re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)


def test_links_resolve() -> None:
    """Every relative link of the README and docs/ names a file that exists,
    and every #anchor a heading of its file."""
    bad = []
    links = 0
    for p in FILES:
        for target in re.findall(r"\]\(([^)\s]+)\)", _prose(p)):
            if re.match(r"^[a-z]+://", target):
                continue
            links += 1
            file_part, _, anchor = target.partition("#")
            dest = (p.parent / file_part).resolve() if file_part else p
            if not dest.exists():
                bad.append(f"{p.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                bad.append(f"{p.relative_to(ROOT)}: {target} (no such heading)")
    assert links > 30
    assert not bad, bad


PROCESS_WORDS = re.compile(r"\bstops? \d|\bissues? \d|\boracles?\b|\bpeer\b|\bhelpers?\b|\bthe floor\b", re.I)


def test_no_development_process_vocabulary() -> None:
    """The README and docs/ describe the product, not how it was made. Code
    (file names, identifiers) in backticks and code blocks is exempt."""
    hits = []
    for p in FILES:
        for n, line in enumerate(_prose(p).splitlines(), 1):
            text = re.sub(r"`[^`]*`", "", line)
            if m := PROCESS_WORDS.search(text):
                hits.append(f"{p.relative_to(ROOT)}: {m.group(0)!r} in {line.strip()[:100]!r}")
    assert not hits, hits
