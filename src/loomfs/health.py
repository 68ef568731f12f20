"""What ``/readyz`` reports (composition root, beside ``service``): each part a site
depends on, checked cheaply enough to be asked every few seconds.

A hub: its catalog answers, its volumes are readable (a posix volume's root can be
listed, an S3 bucket answers), its data directory has ``[site] min_free`` bytes free, its
site certificate is valid. A spoke: its link to the hub is up and the hub accepts it (not
revoked), the pinned hub certificate and its own are valid, its cache directory has room.
Where the link is down, a fresh handshake (``fabric.probe``) says why: the hub
unreachable, a hub that is not the pinned one, or a hub that no longer trusts this site.
Any part not ok makes the answer ``degraded`` with HTTP 503 and the reasons, so a load
balancer or an orchestrator's probe sees what a person reading the JSON sees.
(``/healthz`` says only that the process answers: a restart mends none of these.)
"""

from __future__ import annotations

import asyncio
import datetime
import os
import shutil
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from cryptography import x509

from .core.backends.base import Backend
from .core.backends.posix import PosixBackend
from .core.catalog.base import Catalog
from .errors import LoomError
from .hub.namespace import HubNamespace
from .spoke.namespace import SpokeNamespace

MIN_FREE = 256 << 20  # the default of [site] min_free
CHECK_TIMEOUT = 5.0  # longest a volume's storage may take to answer /readyz's question

Check = dict[str, Any]
Checks = Mapping[str, Check]
#: a fresh TLS handshake with the hub and one request: raises what is wrong with the link
Probe = Callable[[], Awaitable[None]]


def disk(directory: Path, min_free: int = MIN_FREE) -> Check:
    try:
        usage = shutil.disk_usage(directory)
    except OSError as exc:
        return {"ok": False, "path": str(directory), "error": exc.strerror or str(exc)}
    check: Check = {"ok": usage.free >= min_free, "path": str(directory), "free": usage.free}
    if not check["ok"]:
        check["error"] = f"{directory} has {usage.free} bytes free, fewer than {min_free}"
    return check


async def catalog(engine: Catalog) -> Check:
    try:
        return {"ok": True, "head": await engine.head_seq()}
    except LoomError as exc:
        return {"ok": False, "error": f"the catalog is unreachable: {exc}"}


def _unlistable(root: str) -> str | None:
    """Why a posix volume's root can't be read, if it can't (listing its first entry)."""
    try:
        with os.scandir(root) as entries:
            next(entries, None)
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


async def _unreadable(backend: Backend) -> str | None:
    """Why a volume's storage can't be read now, if it can't: a posix root is listed, an
    object store asked once (S3: HEAD of the bucket), each within ``CHECK_TIMEOUT``."""
    if isinstance(backend, PosixBackend):
        return _unlistable(backend.root)
    try:
        async with asyncio.timeout(CHECK_TIMEOUT):
            await backend.check()
    except LoomError as exc:
        return str(exc)
    except TimeoutError:
        return f"no answer within {CHECK_TIMEOUT:g} s"
    return None


async def volumes(engine: Catalog, namespace: HubNamespace) -> Check:
    try:  # the catalog's states: an import that finished is ready there first
        states = {volume.mount: volume.state.value for volume in await engine.volumes()}
    except LoomError as exc:
        return {"ok": False, "error": f"the catalog is unreachable: {exc}"}
    mounts = list(namespace.mounts.items())
    why = await asyncio.gather(*(_unreadable(mounted.backend) for _, mounted in mounts))
    broken = {mount: reason for (mount, _), reason in zip(mounts, why, strict=True) if reason}
    check: Check = {"ok": not broken, "states": states}
    if broken:
        check["error"] = "unreadable volumes: " + ", ".join(
            f"{mount} ({reason})" for mount, reason in sorted(broken.items())
        )
    return check


def certificates(files: Mapping[str, Path]) -> Check:
    """Each named PEM certificate can be read and is valid now."""
    now = datetime.datetime.now(datetime.UTC)
    wrong: list[str] = []
    until: dict[str, str] = {}
    for what, path in files.items():
        try:
            cert = x509.load_pem_x509_certificate(path.read_bytes())
        except (OSError, ValueError) as exc:
            wrong.append(f"the {what} {path} can't be read ({exc})")
            continue
        until[what] = cert.not_valid_after_utc.isoformat()
        if cert.not_valid_after_utc <= now:
            wrong.append(f"the {what} {path} expired on {until[what]}")
        elif cert.not_valid_before_utc > now:
            wrong.append(f"the {what} {path} is not valid before {cert.not_valid_before_utc}")
    check: Check = {"ok": not wrong, "valid_until": until}
    if wrong:
        check["error"] = "; ".join(wrong)
    return check


async def link(spoke: SpokeNamespace, probe: Probe | None = None) -> Check:
    check: Check = {"ok": spoke.online and spoke.link_error is None, "seq": spoke.seq,
                    "leased": spoke.leased}  # fmt: skip
    if check["ok"]:
        return check
    if spoke.link_error is not None:  # the hub answers, and refuses: a revoked site, say
        check["error"] = f"the link to the hub is refused: {spoke.link_error}"
    else:
        check["error"] = "the hub is unreachable: serving cached data only"
    if probe is not None:
        try:  # a fresh handshake tells apart: unreachable, not the pinned hub, not trusted
            await probe()
        except LoomError as exc:
            check["error"] = f"the link to the hub is down: {exc}"
    return check


async def hub_checks(
    engine: Catalog,
    namespace: HubNamespace,
    data_dir: Path,
    *,
    min_free: int = MIN_FREE,
    certs: Mapping[str, Path] | None = None,
) -> dict[str, Check]:
    checks = {
        "catalog": await catalog(engine),
        "volumes": await volumes(engine, namespace),
        "disk": disk(data_dir, min_free),
    }
    if certs:
        checks["certificates"] = certificates(certs)
    return checks


async def spoke_checks(
    spoke: SpokeNamespace,
    *,
    probe: Probe | None = None,
    min_free: int = MIN_FREE,
    certs: Mapping[str, Path] | None = None,
) -> dict[str, Check]:
    checks = {"link": await link(spoke, probe), "disk": disk(spoke.cache.directory, min_free)}
    if certs:
        checks["certificates"] = certificates(certs)
    return checks
