"""NFS write spools (protocol layer): WRITEs gathered per file until they are committed.

NFS has no open or close, and the namespace writes whole files atomically, so the writes of
a file go into a local spool file (unlinked at once: a crash leaves nothing behind), which
starts as a copy of the file's current content. ``commit`` writes the spool to the namespace
as one new version: readers over every protocol see the old or the new file, never a part.
That happens on COMMIT, before a FILE_SYNC or DATA_SYNC write is answered, and ``delay``
seconds after the last write of a spool nobody commits. A committed spool of a large file
stays as the clean copy of the version it made, so the file's next writes do not copy it
again, until it is idle; a small one is let go at once, so many small files hold no
descriptors. A spool always starts from the file as it is then, never from a version its
write saw earlier, so no write is lost to a commit that landed in between.

A commit that fails after its writes were answered (the idle commit, say) is kept and
answered to the file's next WRITE or COMMIT, so a client never hears that uncommitted
data is safe.

A spool holds one user's writes: it is committed as that user, so the namespace decides
every byte as its writer's. Another user's write into it commits it first (as its
writer), and what the namespace refuses its writer is dropped, never left for someone
else's commit to carry in.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

from ... import paths
from ...core.streams import LocalFile
from ...core.types import Entry, Principal
from ...errors import LoomError, PermissionDenied, from_oserror
from ...namespace.base import Namespace

log = logging.getLogger(__name__)

#: a committed spool at least this large stays as the clean copy of its version for a while
KEEP_CLEAN = 8 << 20


class Spool:
    def __init__(self, object_id: int, path: str, fd: int, version: int) -> None:
        self.object_id = object_id
        self.path = path
        self.fd = fd
        #: the namespace version whose content the spool holds while it is clean
        self.version = version
        self.dirty = False
        self.who: Principal | None = None
        self.mtime_ns = time.time_ns()
        self.lock = asyncio.Lock()
        self.timer: asyncio.TimerHandle | None = None

    @property
    def size(self) -> int:
        return os.fstat(self.fd).st_size


class Spools:
    def __init__(self, ns: Namespace, directory: Path, delay: float) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.ns = ns
        self.directory = directory
        self.delay = delay
        self._spools: dict[int, Spool] = {}
        self._opening: dict[int, asyncio.Task[Spool]] = {}
        self._failed: dict[int, LoomError] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def dirty(self, object_id: int) -> Spool | None:
        """The spool of a file with uncommitted writes: what its reads and size come from."""
        spool = self._spools.get(object_id)
        return spool if spool is not None and spool.dirty else None

    def failure(self, object_id: int) -> None:
        """Raise (once) the error of a commit of this file nobody has been told of."""
        failed = self._failed.pop(object_id, None)
        if failed is not None:
            raise failed

    async def _open(self, who: Principal, object_id: int, path: str, entry: Entry | None) -> Spool:
        """The file's spool, made where there is none; ``entry``: the file as its caller
        just found it (None: as it is now, whatever the caller saw)."""
        spool = self._spools.get(object_id)
        # versions only grow: a clean copy at least as new as what the caller saw is current
        # (the caller's look may predate a commit of this server's)
        current = entry is None or (spool is not None and spool.version >= entry.version)
        if spool is not None and (spool.dirty or current):
            return spool
        if spool is not None:  # a clean copy of a version that is no longer the file's
            self._drop(spool)
        task = self._opening.get(object_id)
        if task is None:
            task = self._opening[object_id] = asyncio.create_task(self._fill(who, object_id, path))
            task.add_done_callback(lambda _: self._opening.pop(object_id, None))
        return await asyncio.shield(task)

    async def _fill(self, who: Principal, object_id: int, path: str) -> Spool:
        try:
            fd, name = tempfile.mkstemp(dir=self.directory, prefix="nfs-")
        except OSError as exc:
            raise from_oserror(exc, path, disk=f"the NFS spool {self.directory}") from exc
        os.unlink(name)
        try:
            # the file as it is now, not as the caller saw it: a commit may have come between
            async with await self.ns.read(who, path) as reader:
                version, pos = reader.entry.version, 0
                async for chunk in reader.chunks():
                    pos += await asyncio.to_thread(os.pwrite, fd, chunk, pos)
        except BaseException:
            os.close(fd)
            raise
        spool = self._spools[object_id] = Spool(object_id, path, fd, version)
        return spool

    @contextlib.asynccontextmanager
    async def _held(self, who: Principal, object_id: int, entry: Entry) -> AsyncIterator[Spool]:
        """The file's spool, locked, for ``who`` to write into: another user's writes in
        it are committed first, as theirs."""
        seen: Entry | None = entry
        while True:
            spool = await self._open(who, object_id, entry.path, seen)
            async with spool.lock:
                if spool.fd >= 0 and spool.dirty and spool.who not in (None, who):
                    try:
                        await self._commit_locked(spool, keep=True)
                    except PermissionDenied as exc:  # dropped: ``who`` starts from the file
                        log.warning(
                            "an nfs write its writer may not make was dropped: %s", exc.message,
                            extra={"path": spool.path, "code": exc.code},
                        )  # fmt: skip
                if spool.fd >= 0:
                    spool.path = entry.path
                    yield spool
                    return
            # committed and let go while this call waited: the next spool starts from the
            # file with that commit, whatever ``entry`` says
            seen = None

    async def write(
        self, who: Principal, object_id: int, entry: Entry, offset: int, data: memoryview
    ) -> Spool:
        self.failure(object_id)
        async with self._held(who, object_id, entry) as spool:
            try:
                os.pwrite(spool.fd, data, offset)
            except OSError as exc:
                raise from_oserror(exc, entry.path, disk=f"the NFS spool {self.directory}") from exc
            spool.dirty, spool.who, spool.mtime_ns = True, who, time.time_ns()
            self._schedule(spool)
        return spool

    async def truncate(self, who: Principal, object_id: int, entry: Entry, size: int) -> Entry:
        """Set the file's size and commit it (SETATTR is synchronous)."""
        self.failure(object_id)
        async with self._held(who, object_id, entry) as spool:
            try:
                os.ftruncate(spool.fd, size)
            except OSError as exc:  # EFBIG: past what the spool's disk holds
                raise from_oserror(exc, entry.path, disk=f"the NFS spool {self.directory}") from exc
            spool.dirty, spool.who = True, who
        committed = await self.commit(object_id)
        assert committed is not None
        return committed

    def _schedule(self, spool: Spool) -> None:
        if spool.timer is not None:
            spool.timer.cancel()
        loop = asyncio.get_running_loop()
        spool.timer = loop.call_later(self.delay, self._idle, spool)

    def _idle(self, spool: Spool) -> None:
        spool.timer = None
        task = asyncio.create_task(self._idle_commit(spool))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _idle_commit(self, spool: Spool) -> None:
        if self._spools.get(spool.object_id) is not spool:
            return
        if not spool.dirty:
            self._drop(spool)  # a clean copy nobody wrote to for a while
            return
        try:
            await self.commit(spool.object_id)
        except LoomError as exc:
            log.warning(
                "an idle nfs write could not be committed: %s", exc.message,
                extra={"path": spool.path, "code": exc.code},
            )  # fmt: skip
            self._failed[spool.object_id] = exc
        if spool.timer is None and self._spools.get(spool.object_id) is spool:
            self._schedule(spool)  # drop the clean copy later

    async def commit(self, object_id: int) -> Entry | None:
        """Write the file's spool as its new version; None: nothing was uncommitted."""
        self.failure(object_id)
        spool = self._spools.get(object_id)
        if spool is None:
            return None
        async with spool.lock:
            return await self._commit_locked(spool, keep=False)

    async def _commit_locked(self, spool: Spool, *, keep: bool) -> Entry | None:
        """Commit ``spool`` (locked) as its writer; ``keep``: hold it open even if small
        (the caller writes into it next)."""
        if not spool.dirty or spool.who is None:
            return None
        try:
            entry = await self.ns.write(spool.who, spool.path, LocalFile(spool.fd))
        except PermissionDenied:
            # never to land as its writer's: dropped, not left for another's commit
            self._drop(spool)
            raise
        # any other failure leaves the spool dirty: the client's next COMMIT tries again
        spool.dirty, spool.version = False, entry.version
        if not keep and spool.size < KEEP_CLEAN:  # cheap to copy again: no descriptor held
            self._drop(spool)
        return entry

    async def commit_within(self, top: str) -> None:
        """Commit every file at or below ``top`` (before it is renamed: a spool keeps
        the name it was written under until its next write)."""
        for spool in list(self._spools.values()):
            if spool.dirty and paths.is_within(spool.path, top):
                await self.commit(spool.object_id)

    def moved(self, object_id: int, path: str) -> None:
        """The file was renamed over another protocol: its writes land at its new name."""
        spool = self._spools.get(object_id)
        if spool is not None:
            spool.path = path

    def discard(self, object_id: int) -> None:
        """The file is gone: what was not committed of it goes too."""
        spool = self._spools.get(object_id)
        if spool is not None:
            self._drop(spool)
        self._failed.pop(object_id, None)

    def _drop(self, spool: Spool) -> None:
        if spool.timer is not None:
            spool.timer.cancel()
        if self._spools.get(spool.object_id) is spool:
            del self._spools[spool.object_id]
        with contextlib.suppress(OSError):
            os.close(spool.fd)
        spool.fd = -1

    async def close(self) -> None:
        """Commit what is left (a clean stop loses no write), then release every spool."""
        for spool in list(self._spools.values()):
            if spool.dirty:
                try:
                    await self.commit(spool.object_id)
                except LoomError as exc:
                    log.warning(
                        "an nfs write could not be committed at stop: %s", exc.message,
                        extra={"path": spool.path, "code": exc.code},
                    )  # fmt: skip
            self._drop(spool)
        for task in list(self._tasks):
            task.cancel()
