"""What ``/healthz`` reports (composition root, beside ``service``): each part a site
depends on, checked cheaply enough to be asked every few seconds.

A hub: its catalog answers, its volumes are there (a posix volume's root is a directory),
its data directory has room. A spoke: its link to the hub is up, its cache directory has
room. Any part not ok makes the answer ``degraded`` with HTTP 503, so a load balancer or
an orchestrator's probe sees what a person reading the JSON sees.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from .core.backends.posix import PosixBackend
from .core.catalog.base import Catalog
from .errors import LoomError
from .hub.namespace import HubNamespace
from .spoke.namespace import SpokeNamespace

MIN_FREE = 256 << 20  # below this many free bytes a data or cache directory counts as full

Check = dict[str, Any]


def disk(directory: Path) -> Check:
    try:
        usage = shutil.disk_usage(directory)
    except OSError as exc:
        return {"ok": False, "path": str(directory), "error": exc.strerror or str(exc)}
    check: Check = {"ok": usage.free >= MIN_FREE, "path": str(directory), "free": usage.free}
    if not check["ok"]:
        check["error"] = f"{usage.free} bytes free, fewer than {MIN_FREE}"
    return check


async def catalog(engine: Catalog) -> Check:
    try:
        return {"ok": True, "head": await engine.head_seq()}
    except LoomError as exc:
        return {"ok": False, "error": str(exc)}


async def volumes(engine: Catalog, namespace: HubNamespace) -> Check:
    try:  # the catalog's states: an import that finished is ready there first
        states = {volume.mount: volume.state.value for volume in await engine.volumes()}
    except LoomError as exc:
        return {"ok": False, "error": str(exc)}
    missing = [
        mount
        for mount, mounted in namespace.mounts.items()
        if isinstance(mounted.backend, PosixBackend) and not os.path.isdir(mounted.backend.root)
    ]
    check: Check = {"ok": not missing, "states": states}
    if missing:
        check["error"] = f"the directories of {', '.join(missing)} are gone or unreachable"
    return check


def link(spoke: SpokeNamespace) -> Check:
    check: Check = {"ok": spoke.online, "seq": spoke.seq, "leased": spoke.leased}
    if not spoke.online:
        check["error"] = "the hub is unreachable: serving cached data only"
    return check


async def hub_checks(engine: Catalog, namespace: HubNamespace, data_dir: Path) -> dict[str, Check]:
    return {
        "catalog": await catalog(engine),
        "volumes": await volumes(engine, namespace),
        "disk": disk(data_dir),
    }


async def spoke_checks(spoke: SpokeNamespace) -> dict[str, Check]:
    return {"link": link(spoke), "disk": disk(spoke.cache.directory)}
