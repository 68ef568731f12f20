"""Residency enforced on the hub's namespace (hub layer): the one hook in the fabric path.

Wraps the hub's namespace for the fabric link, so every way a spoke can ask for data
(reads and ranged fetches, warm-up and prefetch, which are reads, uploads, renames, hard
links, special files, re-tags, reads through symlinks, write leases) passes
``PlacementAuthorizer`` first. It is also the ``ChunkGate`` of the hub's chunk service
(``loomfs.hub.chunks``), so the chunk routes decide alike: a chunk map is a read of its
file, a commit from chunks a write of it, and a chunk fetched by id comes only out of a
file the site may read (a chunk found only in files refused to it counts as not held).
The decisions themselves live in ``loomfs.core.placement``; when the hub's authorizer
chain wraps every protocol, the authorizer joins that chain and this wrapper has no more
to do.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Mapping, Sequence

from .. import paths
from ..core.placement import PlacementAuthorizer
from ..core.types import Entry, EntryKind, Principal
from ..namespace.base import Namespace, Reader
from .namespace import HubNamespace

READ = "read"
WRITE = "write"


class PlacedNamespace(Namespace):
    def __init__(self, hub: HubNamespace, placement: PlacementAuthorizer) -> None:
        self.hub = hub
        self.placement = placement

    async def _write(self, who: Principal, *where: str) -> None:
        for path in where:
            await self.placement.check(who, WRITE, path)

    # -- the chunk service's gate ----------------------------------------------------------

    async def guarded(self, who: Principal) -> bool:
        return await self.placement.guards(who)

    async def check_read(self, who: Principal, path: str) -> None:
        """Refuse ``who`` the bytes of ``path``, as a read of it would (through a symlink,
        the bytes are its target's)."""
        await self.placement.check(who, READ, path)
        target = await self.hub.resolve(path)
        if target != paths.normalize(path):
            await self.placement.check(who, READ, target)

    async def check_write(self, who: Principal, path: str) -> None:
        await self._write(who, path)

    # -- the namespace ---------------------------------------------------------------------

    async def stat(self, who: Principal, path: str) -> Entry:
        await self.placement.check_metadata(who, path)
        return await self.hub.stat(who, path)

    async def list(
        self, who: Principal, path: str, *, start_after: str | None = None, limit: int | None = None
    ) -> AsyncIterator[Entry]:
        await self.placement.check_metadata(who, path)
        async for entry in self.hub.list(who, path, start_after=start_after, limit=limit):
            if not await self.placement.hidden(who, entry.path):
                yield entry

    async def read(
        self,
        who: Principal,
        path: str,
        offset: int = 0,
        length: int | None = None,
        *,
        if_version: int | None = None,
    ) -> Reader:
        await self.placement.check(who, READ, path)
        reader = await self.hub.read(who, path, offset, length, if_version=if_version)
        if reader.entry.kind is EntryKind.SYMLINK:  # the bytes are the target's
            try:
                await self.placement.check(who, READ, await self.hub.resolve(path))
            except BaseException:
                await reader.aclose()  # opened, not a byte sent
                raise
        return reader

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
        await self._write(who, path)
        return await self.hub.write(
            who, path, data, if_version=if_version, exclusive=exclusive, mode=mode
        )

    async def mkdir(
        self, who: Principal, path: str, *, parents: bool = False, exist_ok: bool = False
    ) -> Entry:
        await self._write(who, path)
        return await self.hub.mkdir(who, path, parents=parents, exist_ok=exist_ok)

    async def symlink(self, who: Principal, path: str, target: str) -> Entry:
        # the link is metadata; reading through it is checked on what it resolves to
        await self._write(who, path)
        return await self.hub.symlink(who, path, target)

    async def mknod(self, who: Principal, path: str, mode: int, rdev: int = 0) -> Entry:
        await self._write(who, path)  # no content, but a name where the site may not write
        return await self.hub.mknod(who, path, mode, rdev)

    async def link(self, who: Principal, src: str, dst: str) -> Entry:
        # as a rename: a restricted file's bytes under an unrestricted name are an escape,
        # an unrestricted file's under a restricted name a write of its data (``check``
        # then also asks every other name of the inode, so each name keeps its policies)
        await self._write(who, src, dst)
        return await self.hub.link(who, src, dst)

    async def rename(self, who: Principal, src: str, dst: str, *, overwrite: bool = False) -> Entry:
        # out of a restricted path is an escape, into one a write of its data
        await self._write(who, src, dst)
        return await self.hub.rename(who, src, dst, overwrite=overwrite)

    async def remove(
        self, who: Principal, path: str, *, recursive: bool = False, if_version: int | None = None
    ) -> None:
        await self._write(who, path)
        await self.hub.remove(who, path, recursive=recursive, if_version=if_version)

    async def set_attrs(
        self,
        who: Principal,
        path: str,
        *,
        mode: int | None = None,
        uid: int | None = None,
        gid: int | None = None,
        mtime_ns: int | None = None,
        atime_ns: int | None = None,
    ) -> Entry:
        await self._write(who, path)
        return await self.hub.set_attrs(
            who, path, mode=mode, uid=uid, gid=gid, mtime_ns=mtime_ns, atime_ns=atime_ns
        )

    async def get_tags(self, who: Principal, path: str) -> dict[str, str]:
        await self.placement.check_metadata(who, path)
        return await self.hub.get_tags(who, path)

    async def set_tags(
        self, who: Principal, path: str, set_: Mapping[str, str], remove: Sequence[str] = ()
    ) -> dict[str, str]:
        # a site the data may not reach may not untag it out of its policy either
        await self._write(who, path)
        return await self.hub.set_tags(who, path, set_, remove)

    async def lease_write(self, who: Principal, path: str) -> float:
        # a site that may not write the path may not hold others off it either
        await self._write(who, path)
        return await self.hub.lease_write(who, path)

    async def release_write(self, who: Principal, path: str) -> None:
        await self.hub.release_write(who, path)  # giving a lease up moves no data

    async def persist(self, who: Principal, path: str) -> None:
        await self.hub.persist(who, path)
