"""The vLLM side of the differential tools: importing vLLM (the oracle)
quietly, checking that it is a release the caller accepts (rows of
`hybridcache.releases`), naming the release the user commands compare
against, and keeping its and torch's log lines out of a run.

Nothing here imports vLLM or torch at module import time.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from typing import Any

from hybridcache import releases

# Loggers of the optional packages whose chatter the tools keep out of sight.
NOISY_LOGGERS = ("vllm", "torch")


@contextlib.contextmanager
def quiet_logs(level: int = logging.ERROR) -> Iterator[None]:
    """Only log records of `level` and above get out inside the block: vLLM's
    and torch's loggers are set to `level`, and because torch and vLLM reset
    their loggers when first imported (hybridcache's manager imports vLLM's
    stats class lazily), lower records are dropped process-wide for the
    block's duration. Keeps out e.g. vLLM's ``Failed to reset prefix cache``
    warnings, which a trace with prefix-cache resets provokes by design."""
    loggers = [logging.getLogger(name) for name in NOISY_LOGGERS]
    saved = [lg.level for lg in loggers]
    previous = logging.root.manager.disable
    for lg in loggers:
        lg.setLevel(max(level, lg.getEffectiveLevel()))
    logging.disable(max(previous, level - 1))
    try:
        yield
    finally:
        logging.disable(previous)
        for lg, old in zip(loggers, saved):
            lg.setLevel(old)


def load_vllm(accepted: Any) -> tuple[str | None, str]:
    """(version, note): version is set when the manager of a vLLM release
    in `accepted` (rows of `hybridcache.releases`) imports.

    The import is silent: torch's and vLLM's import-time log lines are
    dropped, and vLLM's logger (which binds to stdout at import) is pointed
    at stderr, so the output of ``--json`` stays machine-readable."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    already = "vllm.v1.core.kv_cache_manager" in sys.modules
    previous = logging.root.manager.disable
    try:
        if not already:
            # torch and vLLM configure their loggers while importing (levels
            # set beforehand are reset), so silence logging as a whole until
            # the import is done.
            logging.disable(logging.WARNING)
        with contextlib.redirect_stdout(sys.stderr):
            import vllm
            import vllm.v1.core.kv_cache_manager  # noqa: F401
    except Exception as e:  # ImportError, or a broken install
        return None, f"vLLM not installed ({type(e).__name__}: {e})".splitlines()[0]
    finally:
        logging.disable(previous)
    version = getattr(vllm, "__version__", "?")
    release = releases.find(version)
    if release is None or release not in tuple(accepted):
        return None, f"vLLM {version} is installed, not {' or '.join(r.version for r in accepted)}"
    return version, f"vLLM {version}"


def tool_release(tool: str, use_vllm: bool = True) -> tuple[releases.Release | None, str]:
    """(release, note): the installed vLLM's row of `hybridcache.releases`
    when hybridcache supports it (the tools then compare against that
    release's manager), else None and why, in one line: not used, not
    installed, or `releases.require`'s message listing the supported releases."""
    if not use_vllm:
        return None, "vLLM not used (--no-vllm)"
    version, note = load_vllm(releases.RELEASES)
    if version is not None:
        return releases.find(version), note
    installed = getattr(sys.modules.get("vllm"), "__version__", None)
    if installed is not None:  # imported, but not a release hybridcache supports
        try:
            releases.require(installed, tool)
        except RuntimeError as e:
            note = str(e)
    return None, note
