"""The README's code cannot rot: its Python blocks run, in order, as a
reader would paste them; its opening commands and the paths it names exist.

A Python block runs unless the line before its fence is a marker:
  <!-- readme-test: needs-vllm -->   run in its own process, skipped without vLLM
  <!-- readme-test: skip -->         not run (a fragment, shown for reading)
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MARKER = re.compile(r"<!--\s*readme-test:\s*(?P<what>[\w-]+)\s*-->")
MARKERS = {"needs-vllm", "skip"}


@dataclass
class Block:
    lang: str
    line: int  # 1-based line of the block's first code line
    code: str
    marker: str | None


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
        out.append(Block(m.group(1), i + 2, "\n".join(lines[i + 1 : end]) + "\n", mk.group("what") if mk else None))
        i = end + 1
    return out


ALL = blocks()
PY = [b for b in ALL if b.lang == "python"]
RUN = [b for b in PY if b.marker is None]
NEEDS_VLLM = [b for b in PY if b.marker == "needs-vllm"]


def _compiled(block: Block):
    # Padded so that a traceback names the README's own line numbers.
    return compile("\n" * (block.line - 1) + block.code, str(README), "exec")


def test_markers_are_known() -> None:
    for b in ALL:
        assert b.marker in MARKERS | {None}, f"README.md:{b.line}: unknown marker {b.marker!r}"


def test_the_example_is_there() -> None:
    # The Python example (several blocks) and the vLLM one must not vanish.
    assert len(RUN) >= 5, [b.line for b in RUN]
    assert len(NEEDS_VLLM) >= 1
    code = "".join(b.code for b in RUN)
    for call in ("get_computed_blocks(", "allocate_slots(", "spec_token_ids", "allow_none=True",
                 "num_computed_tokens", "append_output_token_ids(", ".free("):
        assert call in code, call


def test_opening_commands() -> None:
    first = ALL[0]
    assert first.lang == "bash"
    commands = [ln.strip() for ln in first.code.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    assert commands == ["pip install . && hybridcache replay", "bash .ci/run"]
    assert (ROOT / ".ci" / "run").is_file()


@pytest.mark.parametrize("index", range(len(RUN)), ids=[f"README.md:{b.line}" for b in RUN])
def test_python_block_runs(index: int) -> None:
    """Block `index` runs after the blocks before it, in one namespace."""
    namespace: dict[str, object] = {"__name__": "__readme__"}
    for b in RUN[:index]:
        exec(_compiled(b), namespace)
    exec(_compiled(RUN[index]), namespace)


@pytest.mark.vllm("0.23.0")
@pytest.mark.parametrize("index", range(len(NEEDS_VLLM)), ids=[f"README.md:{b.line}" for b in NEEDS_VLLM])
def test_vllm_block_runs(index: int, vllm_available: bool) -> None:
    """Blocks that need vLLM run in their own process (install() patches
    vLLM's scheduler module for the whole process)."""
    block = NEEDS_VLLM[index]
    code = "\n" * (block.line - 1) + block.code
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=ROOT / "tests")
    assert r.returncode == 0, f"README.md:{block.line} failed:\n{r.stdout}\n{r.stderr}"


PATH_RE = re.compile(r"`((?:\.ci|scripts|tests|benchmarks|python|rust|fuzz)/[^`\s]*)`")


def test_paths_named_exist() -> None:
    text = README.read_text()
    paths = {m.group(1).split("::")[0].rstrip("/.,") for m in PATH_RE.finditer(text)}
    paths = {p for p in paths if not p.startswith("tests/v1/")}  # vLLM's own test tree
    assert len(paths) > 10
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, f"README.md names paths that do not exist: {missing}"


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


def test_links_to_sections_resolve() -> None:
    text = README.read_text()
    in_code = False
    slugs = set()
    for line in text.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            slugs.add(_slug(line.lstrip("#")))
    links = set(re.findall(r"\]\(#([^)]+)\)", text))
    assert links, "no section links"
    assert not links - slugs, f"links to missing sections: {sorted(links - slugs)}"
