"""The CI scripts: the oracle venv is consistent with vLLM's own pins, and
`.ci/run` / `scripts/install_oracle.sh` fail clearly on a bad interpreter
or version, before installing anything."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PINS = ROOT / "scripts" / "oracle_requirements.py"
SCRIPTS = [ROOT / ".ci" / "run", *sorted((ROOT / "scripts").glob("*.sh"))]


def _run(*args: str, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=300, **kw)


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.name for p in SCRIPTS])
def test_shell_scripts_parse(script: Path) -> None:
    r = _run("bash", "-n", str(script))
    assert r.returncode == 0, r.stderr


def _in_oracle_venv() -> bool:
    # install_oracle.sh leaves vLLM's constraints file in the venv it made.
    return sys.prefix != sys.base_prefix and any(Path(sys.prefix).glob("vllm-*-constraints.txt"))


@pytest.mark.vllm()  # every oracle venv
@pytest.mark.skipif(not _in_oracle_venv(), reason="not running in an oracle venv made by scripts/install_oracle.sh")
def test_oracle_venv_is_within_vllms_pins() -> None:
    r = _run(sys.executable, str(PINS), "check")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "all within vLLM's pins" in r.stdout
    requires = metadata.requires("vllm") or []
    torch_pin = next(line for line in requires if line.replace(" ", "").startswith("torch=="))
    assert metadata.version("torch").split("+")[0] == torch_pin.split("==")[1].split(";")[0].strip()


@pytest.mark.vllm()  # every oracle venv
def test_constraints_come_from_vllms_metadata(tmp_path: Path) -> None:
    try:
        metadata.version("vllm")
    except metadata.PackageNotFoundError:
        pytest.skip("vLLM is not installed")
    out = tmp_path / "c.txt"
    r = _run(sys.executable, str(PINS), "constraints", str(out))
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in out.read_text().splitlines() if ln and not ln.startswith("#")]
    assert not any("[" in ln for ln in lines)  # pip refuses extras in constraints
    torch_pin = {"0.23.0": "torch==2.11.0", "0.33.0": "torch==2.14.0",
                 "0.34.0": "torch==2.14.0"}.get(metadata.version("vllm").split("+")[0])
    if torch_pin is not None:
        assert torch_pin in lines
        r = _run(sys.executable, str(PINS), "base-name")
        assert r.returncode == 0 and r.stdout.strip() == "torch-" + torch_pin.split("==")[1], r.stdout + r.stderr


def test_the_torch_venv_is_named_after_the_torch_requirement() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("oracle_requirements", PINS)
    assert spec is not None and spec.loader is not None
    pins = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pins)
    assert pins.base_name(pins.Requirement("torch==2.14.0")) == "torch-2.14.0"
    assert pins.base_name(pins.Requirement("torch<3,>=2.1")) == "torch-lt3-ge2.1"
    assert pins.base_name(pins.Requirement("torch==2.10.*")) == "torch-2.10.x"
    assert pins.base_name(pins.Requirement("torch")) == "torch"


@pytest.mark.vllm()  # every oracle venv
@pytest.mark.skipif(not _in_oracle_venv(), reason="not running in an oracle venv made by scripts/install_oracle.sh")
def test_oracle_venv_takes_torch_from_the_shared_torch_venv() -> None:
    """install_oracle.sh's layout: the release's venv holds vLLM, and torch
    comes from the torch venv named after vLLM's torch pin, through a .pth
    file; the release's own site-packages comes first on sys.path."""
    import sysconfig

    site = Path(sysconfig.get_path("purelib"))
    assert (site / "_oracle_torch_venv.pth").is_file()
    name = _run(sys.executable, str(PINS), "base-name").stdout.strip()
    torch_dist = Path(str(metadata.distribution("torch").locate_file(""))).resolve()
    assert any(p.name == ".venv-" + name for p in torch_dist.parents), torch_dist
    vllm_dist = Path(str(metadata.distribution("vllm").locate_file(""))).resolve()
    assert vllm_dist == site.resolve()
    assert sys.path.index(str(site)) < sys.path.index(str(torch_dist))


def test_ci_run_names_a_missing_interpreter() -> None:
    env = {**os.environ, "PYTHON": "/nonexistent/python3"}
    r = _run("bash", str(ROOT / ".ci" / "run"), env=env, cwd=ROOT)
    assert r.returncode != 0
    assert "base interpreter '/nonexistent/python3' not found" in r.stderr
    assert "== tools" not in r.stdout  # nothing after the check ran
    # The phase table closes every run, a failed one too, naming the phase.
    table = r.stdout.split("== phases\n", 1)[1].splitlines()
    assert table[0].endswith(" s  python and venvs  (FAILED, exit 1)"), table
    assert table[1].endswith(" s  total"), table


def test_check_wheel_refuses_a_wheel_not_tagged_manylinux_2_28(tmp_path: Path) -> None:
    wheel = tmp_path / "vllm_hybridcache-0.1.0-cp310-abi3-manylinux_2_34_x86_64.whl"
    wheel.write_bytes(b"")
    r = _run("bash", str(ROOT / "scripts" / "check_wheel.sh"), str(wheel))
    assert r.returncode != 0
    assert "is not tagged manylinux_2_28_" in r.stderr


def test_install_oracle_refuses_an_unknown_version(tmp_path: Path) -> None:
    r = _run("bash", str(ROOT / "scripts" / "install_oracle.sh"), "0.0.1", str(tmp_path / "venv"))
    assert r.returncode != 0
    assert "no package list for vLLM 0.0.1" in r.stderr
    assert not (tmp_path / "venv").exists()


@pytest.mark.vllm()  # every oracle venv
@pytest.mark.skipif(not _in_oracle_venv(), reason="not running in an oracle venv made by scripts/install_oracle.sh")
def test_oracle_venv_runs_the_triton_interpreter() -> None:
    """CI's Triton kernel tests run under Triton's CPU interpreter; in the
    oracle venv they must run, not skip (torch 2.11.0's Triton 3.6 needs
    numpy < 2.4, pinned in scripts/oracle/vllm-0.23.0.txt; torch 2.14.0's
    Triton 3.8 runs under vLLM 0.33.0's numpy 2.4.6)."""
    pytest.importorskip("torch")
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        import test_kernels
    finally:
        sys.path.remove(str(ROOT / "tests"))
    assert test_kernels.triton_interpreter_skip_reason() is None


def _ci_oracles() -> list[str]:
    """.ci/run's ORACLES, by the command it reads them with (the table of
    releases, without the native module)."""
    line = next(ln for ln in (ROOT / ".ci" / "run").read_text().splitlines() if ln.startswith("read -r -a ORACLES"))
    command = line.split('-c "', 1)[1].rsplit('")"', 1)[0]
    out = subprocess.run([sys.executable, "-c", command], cwd=ROOT, capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_every_ci_oracle_has_its_lists_manifest_and_tables() -> None:
    """Each release in .ci/run's ORACLES: its package list, its tests'
    manifest (an sdist hash, the files with their hashes, test files among
    them), its peer-suite tables and the model configs those name."""
    import importlib.util
    import json

    oracles = _ci_oracles()
    assert oracles[:2] == ["0.23.0", "0.33.0"]
    spec = importlib.util.spec_from_file_location("run_vllm_peer_tests", ROOT / "scripts" / "run_vllm_peer_tests.py")
    assert spec is not None and spec.loader is not None
    runner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runner)
    for v in oracles:
        assert (ROOT / "scripts" / "oracle" / f"vllm-{v}.txt").is_file(), v
        manifest = (ROOT / "scripts" / "vllm_tests" / f"vllm-{v}.sha256").read_text().splitlines()
        assert any(ln.startswith(f"# sdist vllm-{v}.tar.gz sha256 ") for ln in manifest), v
        entries = [ln.split() for ln in manifest if ln and not ln.startswith("#")]
        assert entries and all(len(e) == 2 and len(e[0]) == 64 for e in entries), v
        files = runner.release_test_files(v)
        assert any(f.name == "test_prefix_caching.py" for f in files), v
        tables = runner.release_tables(v)
        for name in ("ENV", "HF_MODELS", "SWAP_SCHEDULER", "INTERNALS", "VIEWS", "UNSUPPORTED", "NOT_IMPLEMENTED"):
            assert hasattr(tables, name), (v, name)
        for model in tables.HF_MODELS:
            config = json.loads((ROOT / "scripts" / "vllm_tests" / "hf" / model / "config.json").read_text())
            assert config["architectures"] and config["model_type"], model


def test_install_hf_models_lays_out_the_hub_cache(tmp_path: Path) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("run_vllm_peer_tests", ROOT / "scripts" / "run_vllm_peer_tests.py")
    assert spec is not None and spec.loader is not None
    runner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runner)
    runner.install_hf_models(("facebook/opt-125m",), tmp_path)
    repo = tmp_path / "hub" / "models--facebook--opt-125m"
    revision = (repo / "refs" / "main").read_text()
    assert len(revision) == 40
    assert (repo / "snapshots" / revision / "config.json").read_bytes() == (
        ROOT / "scripts" / "vllm_tests" / "hf" / "facebook" / "opt-125m" / "config.json").read_bytes()


def _probe_wheel(folder: Path, version: str) -> Path:
    """A minimal pure-Python wheel, distribution `overlay-probe`, whose
    module says its version."""
    import base64
    import hashlib
    import zipfile

    info = f"overlay_probe-{version}.dist-info"
    files = {
        "overlay_probe.py": f"VERSION = {version!r}\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: overlay-probe\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(text.encode())}")
    files[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    path = folder / f"overlay_probe-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return path


def test_an_overlay_venv_shadows_its_base_and_leaves_it_alone(tmp_path: Path) -> None:
    """The safe binding is tested in an overlay of the first oracle venv
    (scripts/test_safe_build.sh with VENV=, as CI runs it), so that venv
    keeps the release wheel: a distribution force-reinstalled into the
    overlay, at a version its base already holds, shadows the base's copy
    there and leaves the base's as it was."""
    def overlay(base: Path, venv: Path) -> Path:
        r = _run("bash", str(ROOT / "scripts" / "overlay_venv.sh"), str(base), str(venv))
        assert r.returncode == 0, r.stderr
        return venv / "bin" / "python"

    def pip_install(python: Path, wheel: Path) -> None:
        r = _run(str(python), "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--force-reinstall",
                 "--disable-pip-version-check", str(wheel))
        assert r.returncode == 0, r.stdout + r.stderr

    def probe(python: Path) -> str:
        code = "import overlay_probe, sys; from importlib import metadata; print(overlay_probe.VERSION, metadata.version('overlay-probe'), overlay_probe.__file__.startswith(sys.prefix))"
        r = _run(str(python), "-c", code, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        return r.stdout.strip()

    # The base: itself an overlay of the venv running this test (for its pip),
    # which stays untouched.
    base = overlay(Path(sys.prefix), tmp_path / "base")
    pip_install(base, _probe_wheel(tmp_path, "1.0"))
    assert probe(base) == "1.0 1.0 True"
    top = overlay(tmp_path / "base", tmp_path / "top")
    assert probe(top) == "1.0 1.0 False"  # the base's copy, seen through the overlay
    pip_install(top, _probe_wheel(tmp_path, "1.0.post1"))
    assert probe(top) == "1.0.post1 1.0.post1 True"
    assert probe(base) == "1.0 1.0 True"
    script = (ROOT / "scripts" / "test_safe_build.sh").read_text()
    assert 'bash scripts/overlay_venv.sh "$VENV" "$venv"' in script
