"""vLLM's own requirement pins, read from its installed wheel metadata, for
scripts/install_oracle.sh (run with the oracle venv's python).

  python scripts/oracle_requirements.py constraints OUT
      writes vLLM's requirements (markers of this machine applied, extras
      dropped) as a pip constraints file: every package pip installs beside
      `vllm --no-deps` then gets exactly the version range vLLM asks for
      (torch==2.11.0 for vLLM 0.23.0), so there is no resolver conflict.
  python scripts/oracle_requirements.py check
      checks that every requirement of vLLM that is installed is within
      vLLM's range, prints a one-line summary, exits 1 naming any that is not.
      Requirements left out (vLLM is installed --no-deps; only what
      vllm.v1.core imports is installed) are counted, not errors; one served
      by another distribution (SUBSTITUTES) is named.
"""

from __future__ import annotations

import sys
from importlib import metadata

try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
except ImportError:  # a bare venv: pip's vendored copy
    from pip._vendor.packaging.requirements import Requirement  # type: ignore[no-redef]
    from pip._vendor.packaging.utils import canonicalize_name  # type: ignore[no-redef]


# Requirements in a vLLM release's metadata that the oracle venv serves with
# another distribution, by vLLM version: {requirement: (distribution, why)}.
# Checked explicitly: the substitute must be installed (and the requirement
# itself is not, so its range does not apply to anything installed).
SUBSTITUTES: dict[str, dict[str, tuple[str, str]]] = {
    "0.33.0": {
        # vLLM 0.33.0 asks for oss-harmony>=0.0.11, but what its import needs
        # is the module openai_harmony, which openai-harmony provides
        # (../shared/reference/vllm-0.23-to-0.33.md section 5).
        "oss-harmony": ("openai-harmony", "provides the openai_harmony module vLLM imports"),
    },
}


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


def _installed_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def check() -> int:
    reqs = vllm_requirements()
    installed, bad, served = [], [], []
    substitutes = SUBSTITUTES.get(metadata.version("vllm").split("+")[0], {})
    for req in reqs:
        version = _installed_version(req.name)
        sub = substitutes.get(canonicalize_name(req.name))
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
    else:
        sys.exit(__doc__)
