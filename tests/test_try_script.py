"""scripts/try.sh, the README's first command: its arguments, its defaults and
the steps it runs (checked through --dry-run, which installs nothing), and
that every hybridcache command it runs parses with the installed CLI."""

from __future__ import annotations

import runpy
import shlex
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "try.sh"
VERSIONS = runpy.run_path(str(ROOT / "python" / "hybridcache" / "releases" / "table.py"))["VERSIONS"]


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60,
                          env=env, cwd="/")


def _steps(out: str) -> list[str]:
    return [ln.strip() for ln in out.splitlines() if ln.startswith("  ")]


def test_dry_run_defaults_to_the_newest_release_and_the_ci_venv() -> None:
    r = _run("--dry-run")
    assert r.returncode == 0, r.stderr
    newest = VERSIONS[-1]
    minor = ".".join(newest.split(".")[:2])
    venv = ROOT / f".venv-vllm-{minor}"
    assert f"vLLM {newest} in {venv}" in r.stdout
    steps = _steps(r.stdout)
    assert steps[0].endswith(f"bash scripts/install_oracle.sh {newest} {venv}")
    assert steps[-2:] == [f"{venv}/bin/hybridcache replay", f"{venv}/bin/hybridcache bench --quick"]
    assert f"put {ROOT}/dev on {venv}'s path" in r.stdout  # bench --step needs the development package


@pytest.mark.parametrize("version", VERSIONS)
def test_dry_run_takes_any_supported_release_and_a_venv(version: str, tmp_path: Path) -> None:
    r = _run("--dry-run", version, str(tmp_path / "v"))
    assert r.returncode == 0, r.stderr
    steps = _steps(r.stdout)
    assert steps[0].endswith(f"install_oracle.sh {version} {tmp_path / 'v'}")
    assert all(str(tmp_path / "v") in s for s in steps[1:])


def test_relative_venv_is_made_absolute(tmp_path: Path) -> None:
    r = subprocess.run(["bash", str(SCRIPT), "--dry-run", VERSIONS[0], "rel-venv"], capture_output=True,
                       text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    # The script runs from the repository root, so a relative VENV is taken from there.
    assert f"{ROOT}/rel-venv/bin/hybridcache replay" in r.stdout


@pytest.mark.parametrize("args, message", [
    (("0.22.0",), "vLLM 0.22.0 is not supported; supported: " + " ".join(VERSIONS)),
    (("--bogus",), "unknown option --bogus"),
    (("0.23.0", "v", "extra"), "at most two arguments"),
])
def test_bad_arguments_exit_2_with_a_message(args: tuple[str, ...], message: str) -> None:
    r = _run(*args)
    assert r.returncode == 2
    assert message in r.stderr
    assert r.stdout == ""


def test_help_lists_the_supported_releases() -> None:
    r = _run("--help")
    assert r.returncode == 0
    assert "bash scripts/try.sh [--dry-run] [VERSION] [VENV]" in r.stdout
    assert "supported vLLM releases: " + " ".join(VERSIONS) in r.stdout


def test_without_cargo_it_stops_before_installing(tmp_path: Path) -> None:
    # A PATH with bash, python3 and the coreutils the script uses, but no cargo.
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in ("python3", "sed", "cut", "dirname"):
        found = subprocess.run(["bash", "-c", f"command -v {tool}"], capture_output=True, text=True).stdout.strip()
        assert found, tool
        (bindir / tool).symlink_to(found)
    env = {"PATH": str(bindir), "HOME": str(tmp_path)}
    r = subprocess.run(["/bin/bash", str(SCRIPT), VERSIONS[0], str(tmp_path / "v")], capture_output=True,
                       text=True, timeout=60, env=env, cwd="/")
    assert r.returncode == 1
    assert "cargo is not on PATH" in r.stderr
    assert not (tmp_path / "v").exists()


def test_its_hybridcache_commands_parse() -> None:
    from hybridcache.__main__ import build_parser

    steps = _steps(_run("--dry-run").stdout)
    commands = [shlex.split(s) for s in steps if s.split()[0].endswith("/bin/hybridcache")]
    assert [c[1] for c in commands] == ["--version", "replay", "bench"]
    for argv in commands[1:]:
        build_parser().parse_args(argv[1:])  # SystemExit(2) on an unknown flag
