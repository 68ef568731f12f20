"""The spoke's write journal (spoke layer): nothing acknowledged is lost.

A write at a spoke is durable here before it is acknowledged: the bytes go to a journal
file and are fsynced, then a small record naming the path, the version the writer based
its change on, and the options is written atomically (temp, fsync, rename, fsync of the
directory). Only then does ``append`` return. Records are replayed in order by the
uploader; a record is removed only after the hub committed it. A spoke killed at any
point therefore either never acknowledged a write or still holds it on restart.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Pending:
    """One acknowledged write not yet committed at the hub."""

    seq: int
    path: str
    #: the hub version the change was made against (None: the path did not exist then)
    base_version: int | None
    #: the writer's own preconditions, used while it waits for the commit
    if_version: int | None
    exclusive: bool
    mode: int | None
    time_ns: int
    #: acknowledged before the hub committed it (async mode, or the link was down): a
    #: conflict then keeps both versions instead of failing a writer who has moved on
    early: bool

    def data_name(self) -> str:
        return f"{self.seq:012d}.data"


class Journal:
    """The records live on disk; an in-memory copy answers the hot questions (is there a
    pending write of this path?) without touching the directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        for leftover in directory.glob("*.tmp"):
            leftover.unlink()  # a record that never became durable was never acknowledged
        self._records: dict[int, Pending] = {}
        self._rebased: dict[tuple[str, int | None], int] = {}
        self._lock = threading.Lock()  # commits run in worker threads
        for record in sorted(directory.glob("*.json")):
            pending = Pending(**json.loads(record.read_text()))
            if self.data_path(pending).exists():
                self._records[pending.seq] = pending
            else:  # committed at the hub and adopted into the cache just before a crash
                record.unlink()
        spools = [int(p.stem) for p in directory.glob("*.data")]
        self._next = max([*self._records, *spools], default=0) + 1

    def __iter__(self) -> Iterator[Pending]:
        return iter(sorted(self._records.values(), key=lambda p: p.seq))

    def __len__(self) -> int:
        return len(self._records)

    def get(self, seq: int) -> Pending | None:
        return self._records.get(seq)

    def pending(self, path: str) -> Pending | None:
        """The newest unsent write of ``path``: what a read at this spoke must see."""
        found = [p for p in self._records.values() if p.path == path]
        return max(found, key=lambda p: p.seq) if found else None

    def data_path(self, pending: Pending) -> Path:
        return self.directory / pending.data_name()

    def reserve(self) -> tuple[int, Path]:
        """A sequence number and the data file to spool the bytes into."""
        seq = self._next
        self._next += 1
        return seq, self.directory / f"{seq:012d}.data"

    def commit(self, pending: Pending) -> Pending:
        """Make a spooled write durable; after this returns it may be acknowledged."""
        fd = os.open(self.data_path(pending), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        with self._lock:  # against a rebase between resolving the base and recording it
            base = pending.base_version
            while (pending.path, base) in self._rebased:
                base = self._rebased[(pending.path, base)]
            pending = replace(pending, base_version=base)
            self._write_record(pending)
            self._records[pending.seq] = pending
        return pending

    def _write_record(self, pending: Pending) -> None:
        record = self.directory / f"{pending.seq:012d}.json"
        temp = record.with_suffix(".tmp")
        with temp.open("w") as out:
            json.dump(asdict(pending), out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, record)
        self._fsync_dir()

    def rebase(self, committed: Pending, new_base: int) -> None:
        """Later writes of the path made on top of ``committed``, now committed as
        ``new_base``, are based on that version (else they would conflict with it). This
        holds for writes still being spooled, too: ``commit`` follows the same step."""
        path, old_base = committed.path, committed.base_version
        with self._lock:
            self._rebased[(path, old_base)] = new_base
            for pending in list(self):
                later = pending.seq > committed.seq
                if later and pending.path == path and pending.base_version == old_base:
                    moved = replace(pending, base_version=new_base)
                    self._write_record(moved)
                    self._records[pending.seq] = moved

    def remove(self, pending: Pending) -> None:
        """Forget a write the hub has committed (record first: a data file without its
        record is ignored, a record without data never happens)."""
        self._records.pop(pending.seq, None)
        (self.directory / f"{pending.seq:012d}.json").unlink(missing_ok=True)
        self.data_path(pending).unlink(missing_ok=True)
        (self.directory / f"{pending.seq:012d}.sending").unlink(missing_ok=True)
        self._fsync_dir()

    def mark_sending(self, pending: Pending) -> None:
        """Note that an upload is under way: after a crash the hub may or may not have
        committed it, and replay has to find out before sending it again."""
        (self.directory / f"{pending.seq:012d}.sending").touch()
        self._fsync_dir()

    def was_sending(self, pending: Pending) -> bool:
        return (self.directory / f"{pending.seq:012d}.sending").exists()

    def discard(self, seq: int) -> None:
        """Drop a spool that never became a record (the write failed before commit)."""
        (self.directory / f"{seq:012d}.data").unlink(missing_ok=True)

    def _fsync_dir(self) -> None:
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
