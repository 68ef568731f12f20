"""Writes, moves and removals between their volume's change and the catalog's record of
it (hub layer).

A write's bytes reach their name on the volume first and the catalog is told after: a hub
killed in between would leave the name's new bytes under the catalog's old entry (a read
serving the one with the other's size) until a rescan found it; a move or a removal
likewise (a name on one side only). So each is noted here before its volume changes and
done after the catalog has it, in an append-only log in the data directory; at its next
start the hub re-reads each path noted but not done from its volume
(``HubNamespace.recover``) and records what is there: the old state or the new one,
whole; a write's new one under its idempotency key, so that its writer's retry (a spoke's
replay) finds it done instead of landing it twice, and with the tags it set with its
content (an S3 object's metadata), which the catalog's record would have held. The log
is emptied when nothing is between the two and it has grown past ``KEEP``: emptying it
at each end cost a small file's create or removal a truncation (a journal update of the
data directory's file system) for a few bytes, where an ``end`` line is one plain append.

A write's bytes are spooled into a hidden temp file beside its name first (and what it
replaces is kept aside under one until the catalog has it): a hub stopped meanwhile left
those behind, where only a sweep of the directory finds them. So a write's staging is
noted too (``staging``, not synced: a line lost with the power costs a stray file, not a
wrong one), and ``recover`` sweeps the directories noted but not done.

Gateways sharing one catalog database (PostgreSQL) note their changes in it instead
(``SharedIntentLog``): one killed mid-change is repaired by any other, as soon as it is
gone (``HubNamespace.repair``), not at its own next start on the machine that died. Only
the staging lines (a stray temp file is this machine's) stay in the local file.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

from ..core.catalog.base import IntentRecords
from ..errors import LoomError, from_oserror

#: the size past which the log is emptied at the next moment no write is open
KEEP = 256 << 10


class Orphan(NamedTuple):
    """A change a stopped writer left unfinished at a path: the idempotency key of the
    last write begun there, and the tags (``WriteTags.as_json``) it set with its content."""

    write_id: str | None
    tags: dict[str, object] | None


class IntentLog:
    """``begin`` a path's commit, ``end`` it; ``unfinished`` after a crash.
    ``durable``: a begun write's line is on disk before its commit goes on; ``keep``: the
    size past which it is emptied once no write is open."""

    def __init__(self, path: Path, *, durable: bool, keep: int = KEEP) -> None:
        self.path = path
        self.durable = durable
        self.keep = keep
        self._fd: int | None = None
        self._open = 0  # writes begun and not ended
        self._size = 0  # bytes in the log since it was last emptied

    def unfinished(self) -> dict[str, str | None]:
        """Each path whose commit began and never ended, in the log a stopped hub left,
        with the idempotency key of the last write begun there (one begun before it
        ended its own commit, under the path's lock, and recorded its key then)."""
        open_: dict[str, int] = {}
        last: dict[str, str | None] = {}
        for op, path, *key in self._lines():
            if op in ("begin", "end"):
                open_[path] = open_.get(path, 0) + (1 if op == "begin" else -1)
            if op == "begin":
                last[path] = key[0] if key else None
        return {path: last[path] for path in sorted(open_) if open_[path] > 0}

    def tags(self) -> dict[str, dict[str, object]]:
        """The tags (``WriteTags.as_json``) the last write begun at each path set with its
        content: where ``repair`` finds that write's bytes, it sets them too."""
        last: dict[str, dict[str, object]] = {}
        for op, path, *rest in self._lines():
            if op == "begin":
                if len(rest) > 1 and isinstance(rest[1], dict):
                    last[path] = rest[1]
                else:
                    last.pop(path, None)
        return last

    async def orphans(self) -> dict[str, Orphan]:
        """The unfinished changes (``unfinished``, with their ``tags``) of writers that
        stopped, to repair now: this log's own, before ``open`` (none once it is this
        process's)."""
        if self._fd is not None:
            return {}
        tags = self.tags()
        return {path: Orphan(key, tags.get(path)) for path, key in self.unfinished().items()}

    async def repaired(self) -> None:
        """The ``orphans`` are repaired (here ``open`` forgets them)."""

    def staged(self) -> list[str]:
        """Each path whose write was staging when the hub stopped: its directory may hold
        the temp files that staging left."""
        open_: dict[str, int] = {}
        for op, path, *_ in self._lines():
            if op in ("stage", "unstage"):
                open_[path] = open_.get(path, 0) + (1 if op == "stage" else -1)
        return [path for path in sorted(open_) if open_[path] > 0]

    def _lines(self) -> list[list[Any]]:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return []
        lines = []
        for line in text.splitlines():
            try:
                lines.append(json.loads(line))
            except ValueError:  # the torn last line of a crash: its step did not begin
                continue
        return lines

    def open(self) -> None:
        """Start an empty log (``unfinished`` read the last one first)."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
            self._fd = os.open(self.path, flags)
            self._size = 0
        except OSError as exc:
            raise self._failed(exc) from exc

    async def drain(self) -> None:
        """Wait for the ``end``s under way (before the catalog closes)."""

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    async def begin(
        self, path: str, write_id: str | None = None, tags: dict[str, object] | None = None
    ) -> None:
        note = await self.note(path, write_id, tags)
        try:
            if self.durable:  # an fsync: waited for in a thread
                await asyncio.to_thread(note)
            else:  # one write to the page cache: less than a thread's hand-off
                note()
        except BaseException:
            note.end()
            raise

    async def note(
        self, path: str, write_id: str | None = None, tags: dict[str, object] | None = None
    ) -> Note:
        """A commit of ``path`` to begin, with the tags its write sets with its content:
        the returned note writes its line when called (blocking: with its fsync when
        ``durable``), so a write's volume commit can call it in the thread it commits in
        (``Commit``'s ``first``): one hand-off for both fsyncs. ``Note.end`` closes it,
        whether or not it was written."""
        # counted now: an end meanwhile must not empty the log under this line
        self._open += 1
        line: list[object] = ["begin", path, write_id]
        if tags is not None:
            line.append(tags)
        return Note(self, path, line)

    def end(self, path: str) -> None:
        self._close_one(["end", path])

    @contextlib.contextmanager
    def staging(self, path: str) -> Iterator[None]:
        """A write of ``path`` spooling and committing its bytes inside."""
        self._open += 1
        try:
            self._append(["stage", path], sync=False)
        except BaseException:
            self._open -= 1
            raise
        try:
            yield
        finally:
            self._close_one(["unstage", path])

    def _close_one(self, line: list[object]) -> None:
        self._open -= 1
        if self._fd is None:
            return
        if self._open == 0 and self._size >= self.keep:  # nothing between the two to keep
            os.ftruncate(self._fd, 0)  # appends go on at the new end
            self._size = 0
        else:
            # lost (a crash, a full disk), it costs the path a needless refresh or sweep:
            # never a reason to fail the change it closes, which is done
            with contextlib.suppress(LoomError):
                self._append(line, sync=False)

    def _append(self, line: list[object], *, sync: bool) -> None:
        if self._fd is None:
            return
        try:
            # (a note's thread and the loop may both add: a count lost between them only
            # delays the emptying)
            self._size += os.write(self._fd, (json.dumps(line) + "\n").encode())
            if sync:
                os.fsync(self._fd)
        except OSError as exc:
            raise self._failed(exc) from exc

    def _failed(self, exc: OSError) -> LoomError:
        return from_oserror(exc, str(self.path), disk=f"data directory {self.path.parent}")


class Note:
    """One commit's begin line (``IntentLog.note``): written by calling it, from any
    thread (the log is opened for appending, so lines from two threads never overlap);
    ``line`` None: written already (a shared log's record)."""

    def __init__(self, log: IntentLog, path: str, line: list[object] | None) -> None:
        self.log, self.path, self.line = log, path, line
        self.written = line is None

    def __call__(self) -> None:
        if self.line is not None and not self.written:
            self.log._append(self.line, sync=self.log.durable)
            self.written = True

    def end(self) -> None:
        """The commit is over (recorded, or undone). A line never written gets no end
        line: an unmatched end would hide the next begin of its path from ``unfinished``."""
        if self.written:
            self.log.end(self.path)
        else:
            self.log._open -= 1


class SharedIntentLog(IntentLog):
    """``begin`` and ``end`` as records in the catalog's database (``records``), which
    every gateway over it can ``orphans``: those of gateways that are gone. An ``end`` is
    a deletion made after the fact, batched with others: lost (a crash), it costs its
    path a needless refresh by the adopter."""

    def __init__(self, path: Path, records: IntentRecords) -> None:
        super().__init__(path, durable=False)  # the file holds only staging lines
        self.records = records
        self._begun: dict[str, list[int]] = {}
        self._ended: list[int] = []
        self._ending: asyncio.Task[None] | None = None
        self._adopted: list[int] = []

    async def note(
        self, path: str, write_id: str | None = None, tags: dict[str, object] | None = None
    ) -> Note:
        """A record in the database (a round trip: here, not in the volume's thread)."""
        record = await self.records.begin(path, write_id, tags)
        self._begun.setdefault(path, []).append(record)
        return Note(self, path, None)

    def end(self, path: str) -> None:
        records = self._begun.get(path)
        if not records:
            return
        self._ended.append(records.pop())
        if not records:
            del self._begun[path]
        if self._ending is None or self._ending.done():
            self._ending = asyncio.get_running_loop().create_task(self._end_ended())

    async def _end_ended(self) -> None:
        while self._ended:
            ended, self._ended = self._ended, []
            try:
                await self.records.end(ended)
            except LoomError:  # the database is away: the records outlive their changes
                return

    async def orphans(self) -> dict[str, Orphan]:
        """Adopt the records of every gateway that is gone: each path once, with the
        write id and tags of the last write begun there."""
        adopted = await self.records.adopt()
        self._adopted += [record for record, *_ in adopted]
        return {path: Orphan(write_id, tags) for _, path, write_id, tags in adopted}

    async def repaired(self) -> None:
        adopted, self._adopted = self._adopted, []
        await self.records.end(adopted)

    async def drain(self) -> None:
        if self._ending is not None:
            await self._ending
