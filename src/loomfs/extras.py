"""Which optional extra of the loomfs package brings a module (packaging; any layer asks).

A plain ``pip install loomfs`` leaves out the extras (``chunks``, ``s3``, ``sftp``...), so a
command that needs one of their packages fails to import it; ``install_hint`` turns that
failure into what to run. The extras are read from the installed package's metadata, the
one place pyproject.toml's ``optional-dependencies`` land, so no second list can drift.
"""

from __future__ import annotations

import functools
import re
from importlib import metadata

# 'numpy>=1.26; extra == "chunks"': the distribution's name, and the extra naming it
_REQUIREMENT = re.compile(r'^\s*([A-Za-z0-9][A-Za-z0-9._-]*).*;.*extra\s*==\s*"([^"]+)"')


@functools.cache
def _extras() -> dict[str, str]:
    """Module name -> the first extra that lists its distribution (``chunks`` before
    ``bench`` for numpy: pyproject's order); extras made of other extras name none."""
    try:
        requirements = metadata.requires("loomfs") or []
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return {}
    found: dict[str, str] = {}
    for line in requirements:
        match = _REQUIREMENT.match(line)
        if match is None:
            continue
        name = match.group(1).lower().replace("-", "_").replace(".", "_")
        if name != "loomfs":
            found.setdefault(name, match.group(2))
    return found


def install_hint(exc: ImportError) -> str | None:
    """What to run for a module an optional extra brings that is not installed; None for
    any other import failure (a bug, or a broken install: its traceback helps)."""
    if not isinstance(exc, ModuleNotFoundError) or not exc.name:
        return None
    top = exc.name.partition(".")[0]
    extra = _extras().get(top.lower())
    if extra is None:
        return None
    return f"this needs {top}, from loomfs's {extra!r} extra: pip install 'loomfs[{extra}]'"
