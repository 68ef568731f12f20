"""Mount and run the FUSE front-end (protocol layer): checks, options, signals, unmount.

A crashed daemon leaves its mount point answering "Transport endpoint is not connected";
that is found before mounting and reported with the command that clears it. SIGTERM and
SIGINT end the request loop; files still open for writing are saved, and the mount is
always taken down on the way out.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import signal
import stat
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path

from ...errors import AlreadyExists, InvalidArgument, LoomError, NotADirectory, NotSupported
from ...namespace.base import Namespace
from .follow import FOLLOWING_TIMEOUT, FeedInvalidator, Poll
from .ops import CACHE_TIMEOUT, Callers, LoomOperations
from .session import Session

log = logging.getLogger(__name__)


class StaleMount(LoomError):
    """A previous mount at this path died without unmounting."""

    code = "StaleMount"
    errno = errno.ENOTCONN


def check_mountpoint(mountpoint: Path) -> None:
    """Refuse a mount point that can't be used, saying how to fix it."""
    if not os.path.exists("/dev/fuse"):
        raise NotSupported(
            "/dev/fuse is missing: install FUSE 3 (apt-get install fuse3) and load the "
            "module (modprobe fuse), or give the container the device"
        )
    try:
        st = os.stat(mountpoint)
        if stat.S_ISDIR(st.st_mode):
            # a dead mount's root attributes may still be cached; listing asks the kernel
            with os.scandir(mountpoint) as listing:
                next(listing, None)
    except OSError as exc:
        if exc.errno == errno.ENOTCONN:
            raise StaleMount(
                f"{mountpoint} is a stale FUSE mount (its daemon died); clear it with: "
                f"fusermount3 -u {mountpoint}",
                path=str(mountpoint),
            ) from exc
        if exc.errno == errno.ENOENT:
            raise InvalidArgument(f"mount point {mountpoint} does not exist") from exc
        raise
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectory(f"mount point {mountpoint} is not a directory")
    if os.path.ismount(mountpoint):
        raise AlreadyExists(f"{mountpoint} is already a mount point; unmount it first")


def mount_options(*, allow_other: bool, kernel_checks: bool = True) -> set[str]:
    options = {"fsname=loomfs", "subtype=loomfs", "nosuid", "nodev"}
    if kernel_checks:
        options.add("default_permissions")
    if allow_other:
        options.add("allow_other")
    return options


@contextlib.asynccontextmanager
async def mounted(
    ns: Namespace,
    mountpoint: Path,
    *,
    spool_dir: Path,
    allow_other: bool = False,
    callers: Callers | None = None,
    follow: Poll | None = None,
    passthrough: bool = True,
    protocol: str = "fuse",
    defer_creates: bool = False,
) -> AsyncIterator[tuple[Session, LoomOperations]]:
    """``ns`` mounted at ``mountpoint`` for as long as the block runs; the block serves it
    (``session.serve(ops)``) until ``session.terminate()``. With ``follow`` (the site's
    change feed) the kernel caches names and attributes for long and is told at once when
    they go stale. ``passthrough``: the kernel reads files whose bytes sit whole in a
    local file from that file, where it can. ``protocol``: its requests' name in the
    metrics. ``defer_creates``: a file created through the mount enters the namespace at
    its first close (``ops.py``)."""
    check_mountpoint(mountpoint)
    spool_dir.mkdir(parents=True, exist_ok=True)
    timeout = CACHE_TIMEOUT if follow is None else FOLLOWING_TIMEOUT
    callers = callers or Callers()
    options = mount_options(allow_other=allow_other, kernel_checks=callers.kernel_checks)
    session = Session(mountpoint, options, passthrough=passthrough, protocol=protocol)
    ops = LoomOperations(
        ns, session, str(spool_dir), timeout, following=follow is not None, callers=callers,
        defer_creates=defer_creates,
    )  # fmt: skip
    session.mount()
    follower = None
    if follow is not None:
        invalidator = FeedInvalidator(session, ops.inodes, follow, ops.own)
        follower = asyncio.create_task(invalidator.run())
    log.info("mounted", extra={"mountpoint": str(mountpoint)})
    try:
        yield session, ops
    finally:
        if follower is not None:
            follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await follower
        await ops.aclose()
        session.unmount()
        log.info("unmounted", extra={"mountpoint": str(mountpoint)})


async def serve(
    ns: Namespace,
    mountpoint: Path,
    *,
    spool_dir: Path,
    allow_other: bool = False,
    uid_map: Mapping[int, str] | None = None,
    on_ready: Callable[[], None] | None = None,
    follow: Poll | None = None,
    passthrough: bool = True,
    defer_creates: bool = False,
) -> None:
    """Mount ``ns`` at ``mountpoint`` (see ``mounted``) and serve until unmounted,
    SIGTERM or SIGINT."""
    async with mounted(
        ns, mountpoint, spool_dir=spool_dir, allow_other=allow_other,
        callers=Callers(uid_map=dict(uid_map or {})), follow=follow, passthrough=passthrough,
        defer_creates=defer_creates,
    ) as (session, ops):  # fmt: skip
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, session.terminate)
        try:
            if on_ready is not None:
                on_ready()
            await session.serve(ops)
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
