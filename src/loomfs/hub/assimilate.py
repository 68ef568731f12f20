"""Assimilation (hub layer): import and rescan a volume's metadata without reading data.

One algorithm serves the first import, every rescan, and the re-sync of a subtree that an
inotify event points at. The backend scans in byte order of sort keys; each batch goes to
the catalog as ``Put``s, and the catalog decides per row whether it is new, changed (new
version), changed only in mode/owner, or unchanged. While a volume is first imported, the
last committed sort key is stored in the same transaction as the batch, so a killed import
resumes right after it. A scan from the start ends with a sweep: rows that existed before
the scan and were not seen by it are gone from the volume, and are deleted (after a final
stat confirms it, since a rename through the hub may have moved one meanwhile). What the
scan cannot read (a directory without permission) is skipped, counted and named in the
stats, and left in the catalog as it was: one unreadable directory does not stop an import.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .. import paths
from ..core.backends.base import Backend
from ..core.catalog.base import Catalog, Delete, Put, ScanRow, VolumeUpdate
from ..core.types import EntryKind, ObjectInfo, Volume, VolumeState
from ..errors import LoomError, NotFound

_DEFAULT_MODE = {EntryKind.FILE: 0o100644, EntryKind.DIR: 0o40755, EntryKind.SYMLINK: 0o120777}
_SWEEP_PAGE = 10000
_DELETE_BATCH = 1000
SKIPPED_KEPT = 100  # unreadable paths a scan names (it counts them all)

log = logging.getLogger(__name__)


def path_of(mount: str, key: str) -> str:
    return paths.join(mount, key) if key else mount


def scan_rows(mount: str, batch: Sequence[ObjectInfo]) -> list[ScanRow]:
    """The catalog rows of objects as the backend reports them (keys below the mount).

    The one place that says what the catalog records of an object: a directory has no
    size, etag or link count of its own (its count moves with every subdirectory, which
    is no change of the directory); a backend that knows no mode or owner gets defaults. A scan
    runs this for every object, so it is one loop over plain tuples.
    """
    base = mount + "/"
    rows: list[ScanRow] = []
    append = rows.append
    for (key, kind, size, mtime_ns, etag, inode, mode, uid, gid, link_target, rdev, nlink,
         atime_ns, ctime_ns) in batch:  # fmt: skip
        parent, _, name = (base + key).rpartition("/")
        is_dir = kind is EntryKind.DIR
        append((parent, name, kind.value, 0 if is_dir else size, mtime_ns,
                _DEFAULT_MODE[kind] if mode is None else mode, uid or 0, gid or 0,
                None if is_dir else etag, inode, link_target, rdev, 1 if is_dir else nlink,
                atime_ns, ctime_ns))  # fmt: skip
    return rows


def put_for(mount: str, info: ObjectInfo, **flags: bool | int | None) -> Put:
    """The catalog row for one object (a single write); any key, the root's too."""
    facts = scan_rows(mount, [info])[0][3:]  # the row's parent and name don't fit the root
    return Put(path_of(mount, info.key), info.kind, *facts, **flags)  # type: ignore[arg-type]


@dataclass(slots=True)
class ScanStats:
    """Progress of one scan, reported after every batch."""

    mount: str
    scanned: int = 0
    created: int = 0
    modified: int = 0
    meta: int = 0
    deleted: int = 0
    resumed_after: str | None = None
    started: float = field(default_factory=time.monotonic)
    elapsed: float = 0.0
    done: bool = False
    skipped: int = 0  # directories and entries that could not be read, left as they were
    skipped_paths: list[str] = field(default_factory=list)  # the first SKIPPED_KEPT of them

    def skip(self, path: str) -> None:
        self.skipped += 1
        if len(self.skipped_paths) < SKIPPED_KEPT:
            self.skipped_paths.append(path)

    def as_dict(self) -> dict[str, object]:
        return {
            "mount": self.mount,
            "scanned": self.scanned,
            "created": self.created,
            "modified": self.modified,
            "meta": self.meta,
            "deleted": self.deleted,
            "resumed_after": self.resumed_after,
            "elapsed": round(self.elapsed, 3),
            "rate": round(self.scanned / self.elapsed) if self.elapsed > 0 else 0,
            "skipped": self.skipped,
            "skipped_paths": list(self.skipped_paths),
            "done": self.done,
        }


Progress = Callable[[ScanStats], None]


class Assimilator:
    def __init__(self, catalog: Catalog, batch_size: int = 2000) -> None:
        self.catalog = catalog
        self.batch_size = batch_size

    async def sync(
        self,
        volume: Volume,
        backend: Backend,
        *,
        prefix: str = "",
        progress: Progress | None = None,
    ) -> ScanStats:
        """Bring the catalog in line with the volume below ``prefix`` ('' = whole volume)."""
        importing = volume.state is VolumeState.IMPORTING and not prefix
        resume_after = volume.checkpoint if importing else None
        stats = ScanStats(volume.mount, resumed_after=resume_after)
        top = path_of(volume.mount, prefix)
        # a resumed import sweeps nothing: the rows before its checkpoint were just written
        sweeping = resume_after is None
        max_id = await self.catalog.max_id() if sweeping else 0
        seen = bytearray(max_id + 1) if sweeping else bytearray()

        root = await backend.stat(prefix)
        await self.catalog.apply([put_for(volume.mount, root)])

        def skipped(key: str, exc: LoomError) -> None:  # in the scan's thread
            log.warning(
                "cannot read; left out of the scan",
                extra={"mount": volume.mount, "key": key, "error": str(exc)},
            )
            stats.skip(path_of(volume.mount, key))

        async for batch in backend.scan(prefix, start_after=resume_after, skipped=skipped):
            update = VolumeUpdate(volume.id, checkpoint=batch[-1].sort_key) if importing else None
            applied = await self.catalog.apply_scan(scan_rows(volume.mount, batch), update)
            for row_id in applied.seen:
                if row_id <= max_id:
                    seen[row_id] = 1
            stats.created += applied.created
            stats.modified += applied.modified
            stats.meta += applied.meta
            stats.scanned += len(batch)
            self._report(stats, progress)
        if sweeping:
            stats.deleted += await self._sweep(volume, backend, top, max_id, seen, stats)
        if not prefix:
            await self.catalog.update_volume(
                VolumeUpdate(
                    volume.id,
                    state=VolumeState.READY,
                    clear_checkpoint=True,
                    last_scan_ns=time.time_ns(),
                )
            )
        stats.done = True
        self._report(stats, progress)
        return stats

    @staticmethod
    def _report(stats: ScanStats, progress: Progress | None) -> None:
        stats.elapsed = time.monotonic() - stats.started
        if progress is not None:
            progress(stats)

    async def _sweep(
        self,
        volume: Volume,
        backend: Backend,
        top: str,
        max_id: int,
        seen: bytearray,
        stats: ScanStats,
    ) -> int:
        """Delete rows below ``top`` that existed before the scan and that it did not see
        (what it could not read, and what is below that, stays as it was)."""
        unread = set(stats.skipped_paths)
        gone: set[str] = set()
        after: tuple[str, str] | None = None
        while rows := await self.catalog.subtree_ids(top, after, _SWEEP_PAGE, max_id):
            gone.update(
                path
                for row_id, path in rows
                if not seen[row_id]
                and path not in unread
                and not any(a in unread for a in paths.ancestors(path))
            )
            after = paths.split(rows[-1][1])
        # a vanished directory takes its children with it: confirm and delete only the tops
        tops = sorted(p for p in gone if not any(a in gone for a in paths.ancestors(p)))
        confirmed: list[str] = []
        for path in tops:
            try:
                await backend.stat(paths.relative(path, volume.mount))
            except NotFound:
                confirmed.append(path)
            except LoomError:  # can't tell (past SKIPPED_KEPT unreadable ones): keep it
                pass
        for i in range(0, len(confirmed), _DELETE_BATCH):
            await self.catalog.apply(
                [
                    Delete(p, recursive=True, missing_ok=True)
                    for p in confirmed[i : i + _DELETE_BATCH]
                ]
            )
        removed = set(confirmed)
        return sum(1 for p in gone if p in removed or any(a in removed for a in paths.ancestors(p)))
