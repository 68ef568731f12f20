"""The spoke's write journal (spoke layer): nothing acknowledged is lost.

A write at a spoke is durable here before it is acknowledged: the bytes go to a journal
file and are fsynced, then a small record naming the path, the version the writer based
its change on, the writer's own preconditions, the options and the write's idempotency
key is written atomically (temp, fsync, rename, fsync of the directory). Only then does
``commit`` return. Records are replayed in order by the uploader; a record is removed only
after the hub committed it (or finally refused it). A spoke killed at any point therefore
either never acknowledged a write or still holds it on restart, and the key lets the hub
answer a replay of a write it already committed (its answer lost) instead of landing it
twice.

With a ``BlockCipher`` (a sealed cache) the journaled bytes are sealed too, frame by frame
(``loomfs.spoke.sealed``); each record says whether its data is, so a journal written
before the key was configured still replays.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Protocol

from ..core.streams import ByteSource, LocalFileSource, fsync_dir
from ..errors import BackendUnavailable, CorruptData
from .sealed import (
    BlockCipher,
    SealedFile,
    SealedSource,
    SealedWriter,
    journal_context,
    read_frame,
    sealed_size,
)


@dataclass(frozen=True, slots=True)
class Pending:
    """One acknowledged write not yet committed at the hub."""

    seq: int
    path: str
    #: the hub version the change was made against (None: the path did not exist then)
    base_version: int | None
    #: the writer's own preconditions: the hub's commit checks them, in every mode
    if_version: int | None
    exclusive: bool
    mode: int | None
    time_ns: int
    #: acknowledged before the hub committed it (async mode, or the link was down): a
    #: conflict then keeps both versions instead of failing a writer who has moved on
    early: bool
    #: the data file holds sealed frames (the spoke's cache key), not the plain bytes
    sealed: bool = False
    #: who wrote it (None: the spoke itself; journals written before users were kept)
    user: str | None = None
    protocol: str = "internal"
    #: the write's idempotency key, sent with every try (journals written before keys
    #: were kept get one when loaded)
    write_id: str = ""
    #: the key is the writer's client's (a repeat of a request), not one made here: the
    #: hub may answer it with an earlier write of other bytes, so these fill no cache
    client_key: bool = False
    #: the tags the write sets with its content (``WriteTags.as_json``), committed with it
    tags: dict[str, object] | None = None

    @property
    def conditional(self) -> bool:
        """Whether the writer gave a precondition (its refusal is final, never a copy)."""
        return self.if_version is not None or self.exclusive

    def data_name(self) -> str:
        return f"{self.seq:012d}.data"


def new_write_id() -> str:
    """A write's idempotency key: 128 random bits."""
    return secrets.token_hex(16)


class Spool(Protocol):
    """Where a write's bytes go before it is committed; synchronous, for a worker thread."""

    def write(self, data: bytes, /) -> object: ...

    def close(self) -> None: ...


class PlainFile(Protocol):
    """A journaled write's bytes as written (opened frame by frame where sealed), for
    uploading it; synchronous, for worker threads."""

    def readinto(self, buffer: memoryview, /) -> int | None: ...

    def pread(self, length: int, offset: int, /) -> bytes: ...

    def close(self) -> None: ...


class _LocalPlain:
    """A plain data file as a ``PlainFile``."""

    def __init__(self, path: Path) -> None:
        self._file = path.open("rb", buffering=0)

    def readinto(self, buffer: memoryview, /) -> int | None:
        return self._file.readinto(buffer)

    def pread(self, length: int, offset: int, /) -> bytes:
        return os.pread(self._file.fileno(), length, offset)

    def close(self) -> None:
        self._file.close()


class Journal:
    """The records live on disk; an in-memory copy answers the hot questions (is there a
    pending write of this path?) without touching the directory."""

    def __init__(self, directory: Path, cipher: BlockCipher | None = None) -> None:
        self.directory = directory
        self.cipher = cipher
        directory.mkdir(parents=True, exist_ok=True)
        for leftover in directory.glob("*.tmp"):
            leftover.unlink()  # a record that never became durable was never acknowledged
        self._records: dict[int, Pending] = {}
        self._rebased: dict[tuple[str, int | None], int] = {}
        self._lock = threading.Lock()  # commits run in worker threads
        self._closed = False
        for record in sorted(directory.glob("*.json")):
            pending = Pending(**json.loads(record.read_text()))
            if not self.data_path(pending).exists():
                # committed at the hub and adopted into the cache just before a crash
                record.unlink()
                continue
            if not pending.write_id:
                pending = replace(pending, write_id=new_write_id())
                self._write_record(pending)
            self._records[pending.seq] = pending
        for sending in directory.glob("*.sending"):  # marks of journals before keys
            sending.unlink()
        spools = [int(p.stem) for p in directory.glob("*.data")]
        self._next = max([*self._records, *spools], default=0) + 1

    def __iter__(self) -> Iterator[Pending]:
        return iter(sorted(self._records.values(), key=lambda p: p.seq))

    def __len__(self) -> int:
        return len(self._records)

    def get(self, seq: int) -> Pending | None:
        return self._records.get(seq)

    def pending(self, path: str) -> Pending | None:
        """The newest write of ``path`` not yet committed at the hub."""
        found = self.of_path(path)
        return found[-1] if found else None

    def keyed(self, write_id: str) -> Pending | None:
        """The write journaled under ``write_id``, if one is."""
        return next((p for p in self._records.values() if p.write_id == write_id), None)

    def of_path(self, path: str) -> list[Pending]:
        """The writes of ``path`` not yet committed at the hub, oldest first."""
        return sorted((p for p in self._records.values() if p.path == path), key=lambda p: p.seq)

    def data_path(self, pending: Pending) -> Path:
        return self.directory / pending.data_name()

    def reserve(self) -> tuple[int, Spool]:
        """A sequence number and the spool its bytes go into (sealed with a cipher)."""
        seq = self._next
        self._next += 1
        path = self.directory / f"{seq:012d}.data"
        if self.cipher is not None:
            return seq, SealedWriter(path, self.cipher, partial(journal_context, seq))
        return seq, path.open("wb")

    @property
    def sealed(self) -> bool:
        return self.cipher is not None

    def size(self, pending: Pending) -> int:
        """The number of bytes written (not of the data file, where sealed)."""
        disk = self.data_path(pending).stat().st_size
        return sealed_size(disk) if pending.sealed else disk

    def source(self, pending: Pending, offset: int = 0, length: int | None = None) -> ByteSource:
        """The written bytes [offset, offset+length), from the data file."""
        size = self.size(pending)
        length = size - offset if length is None else length
        fd = os.open(self.data_path(pending), os.O_RDONLY | os.O_CLOEXEC)
        if not pending.sealed:
            return LocalFileSource(fd, offset, length, pending.path)
        if self.cipher is None:
            os.close(fd)
            raise CorruptData(
                f"the journaled write of {pending.path} is sealed, and no cache key is "
                "configured to open it",
                path=pending.path,
            )
        cipher = self.cipher
        return SealedSource(
            fd, offset, length,
            lambda idx: read_frame(fd, cipher, journal_context(pending.seq, idx), idx),
        )  # fmt: skip

    def open_plain(self, pending: Pending) -> PlainFile:
        """The written bytes for an upload: opened frame by frame where sealed, so the
        hub gets the plaintext and no plaintext copy lands on disk."""
        path = self.data_path(pending)
        if not pending.sealed:
            return _LocalPlain(path)
        if self.cipher is None:
            raise CorruptData(
                f"the journaled write of {pending.path} is sealed, and no cache key is "
                "configured to open it",
                path=pending.path,
            )
        return SealedFile(path, self.cipher, partial(journal_context, pending.seq))

    def commit(self, pending: Pending) -> Pending:
        """Make a spooled write durable; after this returns it may be acknowledged."""
        fd = os.open(self.data_path(pending), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        with self._lock:  # against a rebase between resolving the base and recording it
            if self._closed:
                raise BackendUnavailable("the spoke is stopping: the write is not journaled")
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
        fsync_dir(self.directory)

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
        fsync_dir(self.directory)

    def close(self) -> None:
        """Take no more writes: one still spooling when its spoke stops fails, and is
        never recorded behind the back of the next spoke over this journal."""
        with self._lock:
            self._closed = True

    def discard(self, seq: int) -> None:
        """Drop a spool that never became a record (the write failed before commit)."""
        (self.directory / f"{seq:012d}.data").unlink(missing_ok=True)
