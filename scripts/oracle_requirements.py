"""vLLM's own requirement pins, read from its installed wheel metadata, for
scripts/install_oracle.sh (run with the oracle venv's python).

  python scripts/oracle_requirements.py constraints OUT
      writes vLLM's requirements (markers of this machine applied, extras
      dropped) as a pip constraints file: every package pip installs beside
      `vllm --no-deps` then gets exactly the version range vLLM asks for
      (torch among them), so there is no resolver conflict.
  python scripts/oracle_requirements.py check
      checks that every requirement of vLLM that is installed is within
      vLLM's range, prints a one-line summary, exits 1 naming any that is not.
      Requirements left out (vLLM is installed --no-deps; only what
      vllm.v1.core imports is installed) are counted, not errors; one served
      by another distribution (a `# substitute:` line of the release's
      package list) is named.
  python scripts/oracle_requirements.py torch-requirement
      prints vLLM's torch requirement (e.g. torch==2.14.0).
  python scripts/oracle_requirements.py base-name
      prints the name of the torch venv that releases with this torch
      requirement share (torch-2.14.0 for torch==2.14.0).
  python scripts/oracle_requirements.py torch-ok REQUIREMENT
      (run with the torch venv's python) exits 0 iff torch imports there at a
      version REQUIREMENT allows.
  python scripts/oracle_requirements.py outside
      prints, one a line, vLLM's requirement (name and range) of each
      installed package outside vLLM's range, for pip to install.
"""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
except ImportError:  # a bare venv: pip's vendored copy
    from pip._vendor.packaging.requirements import Requirement  # type: ignore[no-redef]
    from pip._vendor.packaging.utils import canonicalize_name  # type: ignore[no-redef]


# A release's package list (scripts/oracle/vllm-VERSION.txt) names each
# requirement of its metadata that the oracle venv serves with another
# distribution, on a line `# substitute: REQUIREMENT = DISTRIBUTION: why`
# (a comment to pip). Checked explicitly: the substitute must be installed
# (and the requirement itself is not, so its range does not apply to
# anything installed).
SUBSTITUTE_PREFIX = "# substitute:"
LISTS = Path(__file__).resolve().parent / "oracle"


def substitutes(version: str) -> dict[str, tuple[str, str]]:
    """{requirement: (distribution, why)} from vLLM `version`'s package list
    (none without a list)."""
    path = LISTS / f"vllm-{version}.txt"
    out: dict[str, tuple[str, str]] = {}
    if not path.is_file():
        return out
    for line in path.read_text().splitlines():
        if line.startswith(SUBSTITUTE_PREFIX):
            requirement, _, rest = line[len(SUBSTITUTE_PREFIX):].partition("=")
            provider, _, why = rest.partition(":")
            out[canonicalize_name(requirement.strip())] = (provider.strip(), why.strip())
    return out


def vllm_requirements() -> list[Requirement]:
    """vLLM's unconditional requirements on this machine (no extras)."""
    out = []
    for line in metadata.requires("vllm") or []:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        out.append(req)
    return out


def constraints(path: str) -> None:
    lines = []
    for req in vllm_requirements():
        # pip refuses extras in constraints; the range is what matters.
        lines.append(f"{req.name}{req.specifier}" if req.specifier else req.name)
    with open(path, "w") as f:
        f.write("# vLLM %s's requirements (from its wheel metadata), as constraints\n" % metadata.version("vllm"))
        f.write("\n".join(lines) + "\n")


def torch_requirement() -> Requirement:
    """vLLM's requirement on torch (every release names one)."""
    for req in vllm_requirements():
        if canonicalize_name(req.name) == "torch":
            return req
    raise SystemExit(f"vLLM {metadata.version('vllm')} names no torch requirement")


_SPEC_WORDS = {"==": "", ">=": "ge", "<=": "le", "~=": "compat", "!=": "ne", ">": "gt", "<": "lt"}


def base_name(req: Requirement | None = None) -> str:
    """The shared torch venv's name for vLLM's torch requirement (or `req`):
    `torch-VERSION` for an exact pin, else the range spelled out
    (`torch-lt3-ge2.1`), `torch` for none."""
    spec = sorted((req or torch_requirement()).specifier, key=str)
    if not spec:
        return "torch"
    parts = []
    for s in spec:
        parts.append(_SPEC_WORDS.get(s.operator, "op") + s.version.replace("*", "x"))
    return "torch-" + "-".join(parts)


def torch_ok(requirement: str) -> int:
    """0 iff torch imports in this interpreter at a version `requirement` allows."""
    try:
        import torch
    except Exception as e:  # noqa: BLE001 - any import failure means "not usable"
        print(f"oracle: torch does not import in {sys.prefix}: {e!r}", file=sys.stderr)
        return 1
    version = torch.__version__.split("+")[0]
    if not Requirement(requirement).specifier.contains(version, prereleases=True):
        print(f"oracle: torch {version} in {sys.prefix} is outside {requirement}", file=sys.stderr)
        return 1
    return 0


def outside() -> list[str]:
    """vLLM's range of each installed requirement whose version it excludes."""
    out = []
    for req in vllm_requirements():
        version = _installed_version(req.name)
        if version is not None and req.specifier and not req.specifier.contains(version, prereleases=True):
            out.append(f"{req.name}{req.specifier}")
    return out


def _installed_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def check() -> int:
    reqs = vllm_requirements()
    installed, bad, served = [], [], []
    served_by = substitutes(metadata.version("vllm").split("+")[0])
    for req in reqs:
        version = _installed_version(req.name)
        sub = served_by.get(canonicalize_name(req.name))
        if sub is not None and version is None:
            provider, why = sub
            provided = _installed_version(provider)
            if provided is None:
                bad.append(f"{req.name}{req.specifier} is served by {provider}, which is not installed")
            else:
                served.append(f"{req.name}{req.specifier} served by {provider} {provided} ({why})")
            continue
        if version is None:
            continue
        installed.append(canonicalize_name(req.name))
        if req.specifier and not req.specifier.contains(version, prereleases=True):
            bad.append(f"{req.name} {version} (vLLM wants {req.specifier})")
    torch = metadata.version("torch") if "torch" in installed else "not installed"
    if "torch" in installed:
        where = Path(str(metadata.distribution("torch").locate_file(""))).resolve()
        if not where.is_relative_to(Path(sys.prefix).resolve()):
            torch += f" (from {where})"
    print(
        f"oracle: vLLM {metadata.version('vllm')} with torch {torch} in {sys.prefix}: "
        f"{len(installed)} of vLLM's {len(reqs)} requirements installed, "
        f"{'all' if not bad else len(installed) - len(bad)} within vLLM's pins"
        + (f", {len(served)} served by another package" if served else "")
        + f"; the other {len(reqs) - len(installed) - len(served)} are left out on purpose (vLLM is installed --no-deps, "
        "only what vllm.v1.core imports is needed)"
    )
    for s in served:
        print(f"oracle: {s}")
    for b in bad:
        print(f"oracle: version conflict: {b}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "constraints":
        constraints(sys.argv[2])
    elif len(sys.argv) == 2 and sys.argv[1] == "check":
        sys.exit(check())
    elif len(sys.argv) == 2 and sys.argv[1] == "torch-requirement":
        req = torch_requirement()
        print(f"{req.name}{req.specifier}")
    elif len(sys.argv) == 2 and sys.argv[1] == "base-name":
        print(base_name())
    elif len(sys.argv) == 3 and sys.argv[1] == "torch-ok":
        sys.exit(torch_ok(sys.argv[2]))
    elif len(sys.argv) == 2 and sys.argv[1] == "outside":
        for line in outside():
            print(line)
    else:
        sys.exit(__doc__)
