"""The spoke's namespace (spoke layer): a hub's exports, near the GPUs.

The same namespace API as the hub, over a local cache and the fabric link. Metadata comes
from the hub; file data is fetched by range as reads miss and then served from the cache.

Consistency is close-to-open: every open asks the hub for the entry's current version
(one metadata round trip; leases that save it are the next step), so an open at the spoke
sees every change committed at the hub before it began. The change feed, followed as a
long poll, drops superseded versions from the cache. Writes go through to the hub (which
commits them atomically with the version precondition) and the written bytes become the
cached copy of the new version. With the link down, cached versions are still served
(counted as possibly stale); anything else is ``BackendUnavailable``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterable, AsyncIterator, Mapping, Sequence

from prometheus_client import Counter, Gauge

from .. import paths
from ..core.streams import clamp_range
from ..core.types import SYSTEM, Change, ChangeOp, Entry, EntryKind, Principal
from ..errors import BackendUnavailable, Conflict, IsADirectory, PermissionDenied
from ..namespace.base import Namespace, Reader
from ..rest.client import RestNamespace
from .cache import Cache

log = logging.getLogger(__name__)

STALE_READS = Counter(
    "loomfs_spoke_stale_reads_total", "Reads served from cache while the hub was unreachable"
)
LINK_UP = Gauge("loomfs_spoke_link_up", "1 while the spoke reaches its hub")
FEED_SEQ = Gauge("loomfs_spoke_feed_seq", "The last change-feed sequence number applied")

FEED_WAIT = 10.0
RETRY = 1.0


class SpokeNamespace(Namespace):
    def __init__(self, hub: RestNamespace, cache: Cache, attach: Sequence[str]) -> None:
        self.hub = hub
        self.cache = cache
        self.attached = [paths.normalize(p) for p in attach]
        self._known: dict[str, Entry] = {}  # the last entry seen per path, for offline reads
        self._feed: asyncio.Task[None] | None = None
        self.seq = 0
        self.online = True

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Join the change feed at its head (the cache keeps only versions it can check)."""
        self.cache.open()
        with contextlib.suppress(BackendUnavailable):
            _, self.seq = await self.hub.changes(0, 1)
        self._feed = asyncio.create_task(self._follow())

    async def close(self) -> None:
        if self._feed is not None:
            self._feed.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._feed
        await self.hub.close()
        self.cache.close()

    async def _follow(self) -> None:
        while True:
            try:
                changes, _ = await self.hub.changes(self.seq, 1000, wait=FEED_WAIT)
            except BackendUnavailable:
                self._set_online(False)
                await asyncio.sleep(RETRY)
                continue
            self._set_online(True)
            for change in changes:
                self.apply_change(change)

    def _set_online(self, online: bool) -> None:
        if online != self.online:
            log.warning("link to the hub is %s", "up" if online else "down")
        self.online = online
        LINK_UP.set(int(online))

    def apply_change(self, change: Change) -> None:
        """Drop what a change at the hub made stale."""
        if change.op is ChangeOp.MODIFY:
            self.cache.invalidate(change.path, keep_version=change.version)
        elif change.op in (ChangeOp.DELETE, ChangeOp.RENAME):
            self.cache.invalidate(change.path)
            self._known.pop(change.path, None)
        self.seq = max(self.seq, change.seq)
        FEED_SEQ.set(self.seq)

    # -- paths -----------------------------------------------------------------------------

    def _inside(self, path: str) -> str:
        path = paths.normalize(path)
        if not any(paths.is_within(path, top) for top in self.attached):
            raise PermissionDenied(f"{path} is not attached at this spoke", path=path)
        return path

    def _visible(self, path: str) -> bool:
        """Inside an attached export, or a directory on the way to one."""
        return any(
            paths.is_within(path, top) or paths.is_within(top, path) for top in self.attached
        )

    # -- the namespace API -----------------------------------------------------------------

    async def stat(self, who: Principal, path: str) -> Entry:
        path = paths.normalize(path)
        if not self._visible(path):
            raise PermissionDenied(f"{path} is not attached at this spoke", path=path)
        entry = await self.hub.stat(who, path)
        self._known[path] = entry
        return entry

    async def list(
        self, who: Principal, path: str, *, start_after: str | None = None, limit: int | None = None
    ) -> AsyncIterator[Entry]:
        path = paths.normalize(path)
        if not self._visible(path):
            raise PermissionDenied(f"{path} is not attached at this spoke", path=path)
        async for entry in self.hub.list(who, path, start_after=start_after, limit=limit):
            if self._visible(entry.path):
                yield entry

    async def _open_entry(self, who: Principal, path: str) -> Entry:
        try:
            entry = await self.hub.stat(who, path)
        except BackendUnavailable:
            known = self._known.get(path) or self._newest_cached(path)
            if known is None:
                raise
            STALE_READS.inc()
            return known
        self._known[path] = entry
        return entry

    def _newest_cached(self, path: str) -> Entry | None:
        """After a restart with the link down, the cache itself says what it holds."""
        versions = sorted(self.cache.versions(path), key=lambda f: f.version)
        if not versions:
            return None
        newest = versions[-1]
        return Entry(path, EntryKind.FILE, newest.size, 0, 0o100644, 0, 0, newest.version)

    async def read(
        self,
        who: Principal,
        path: str,
        offset: int = 0,
        length: int | None = None,
        *,
        if_version: int | None = None,
    ) -> Reader:
        path = self._inside(path)
        entry = await self._open_entry(who, path)
        if entry.is_dir:
            raise IsADirectory(f"is a directory: {path}", path=path)
        if if_version is not None and entry.version != if_version:
            raise Conflict(f"{path} is at version {entry.version}, not {if_version}", path=path)
        start, count = clamp_range(entry.size, offset, length)
        source = await self.cache.read(path, entry.version, entry.size, start, count, self._fetch)
        return Reader(entry, start, source)

    async def _fetch(self, path: str, version: int, offset: int, length: int) -> bytes:
        async with await self.hub.read(SYSTEM, path, offset, length, if_version=version) as r:
            return await r.read_all()

    async def write(
        self,
        who: Principal,
        path: str,
        data: AsyncIterable[bytes],
        *,
        if_version: int | None = None,
        exclusive: bool = False,
        mode: int | None = None,
    ) -> Entry:
        path = self._inside(path)
        spool = self.cache.incoming()
        try:
            with spool.open("wb") as out:

                async def tee() -> AsyncIterator[bytes]:
                    async for chunk in data:
                        await asyncio.to_thread(out.write, chunk)
                        yield chunk

                entry = await self.hub.write(
                    who, path, tee(), if_version=if_version, exclusive=exclusive, mode=mode
                )
            self.cache.invalidate(path, keep_version=entry.version)
            await self.cache.adopt(path, entry.version, spool)
        finally:
            spool.unlink(missing_ok=True)
        self._known[path] = entry
        return entry

    async def mkdir(
        self, who: Principal, path: str, *, parents: bool = False, exist_ok: bool = False
    ) -> Entry:
        return await self.hub.mkdir(who, self._inside(path), parents=parents, exist_ok=exist_ok)

    async def rename(self, who: Principal, src: str, dst: str, *, overwrite: bool = False) -> Entry:
        src, dst = self._inside(src), self._inside(dst)
        entry = await self.hub.rename(who, src, dst, overwrite=overwrite)
        for gone in (src, dst):
            self.cache.invalidate(gone)
            self._known.pop(gone, None)
        return entry

    async def remove(
        self, who: Principal, path: str, *, recursive: bool = False, if_version: int | None = None
    ) -> None:
        path = self._inside(path)
        await self.hub.remove(who, path, recursive=recursive, if_version=if_version)
        self.cache.invalidate(path)
        self._known.pop(path, None)

    async def get_tags(self, who: Principal, path: str) -> dict[str, str]:
        return await self.hub.get_tags(who, self._inside(path))

    async def set_tags(
        self,
        who: Principal,
        path: str,
        set_: Mapping[str, str],
        remove: Sequence[str] = (),
    ) -> dict[str, str]:
        return await self.hub.set_tags(who, self._inside(path), set_, remove)
