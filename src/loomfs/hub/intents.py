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
replay) finds it done instead of landing it twice. The log is emptied when nothing is
between the two and it has grown past ``KEEP``: emptying it at each end cost a small
file's create or removal a truncation (a journal update of the data directory's file
system) for a few bytes, where an ``end`` line is one plain append.

A write's bytes are spooled into a hidden temp file beside its name first (and what it
replaces is kept aside under one until the catalog has it): a hub stopped meanwhile left
those behind, where only a sweep of the directory finds them. So a write's staging is
noted too (``staging``, not synced: a line lost with the power costs a stray file, not a
wrong one), and ``recover`` sweeps the directories noted but not done.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

from ..errors import LoomError, from_oserror

#: the size past which the log is emptied at the next moment no write is open
KEEP = 256 << 10


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

    def staged(self) -> list[str]:
        """Each path whose write was staging when the hub stopped: its directory may hold
        the temp files that staging left."""
        open_: dict[str, int] = {}
        for op, path, *_ in self._lines():
            if op in ("stage", "unstage"):
                open_[path] = open_.get(path, 0) + (1 if op == "stage" else -1)
        return [path for path in sorted(open_) if open_[path] > 0]

    def _lines(self) -> list[list[str]]:
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

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    async def begin(self, path: str, write_id: str | None = None) -> None:
        note = self.note(path, write_id)
        try:
            if self.durable:  # an fsync: waited for in a thread
                await asyncio.to_thread(note)
            else:  # one write to the page cache: less than a thread's hand-off
                note()
        except BaseException:
            note.end()
            raise

    def note(self, path: str, write_id: str | None = None) -> Note:
        """A commit of ``path`` to begin: the returned note writes its line when called
        (blocking: with its fsync when ``durable``), so a write's volume commit can call
        it in the thread it commits in (``Commit``'s ``first``): one hand-off for both
        fsyncs. ``Note.end`` closes it, whether or not it was written."""
        # counted now: an end meanwhile must not empty the log under this line
        self._open += 1
        return Note(self, path, write_id)

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

    def _close_one(self, line: list[str | None]) -> None:
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

    def _append(self, line: list[str | None], *, sync: bool) -> None:
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
    thread (the log is opened for appending, so lines from two threads never overlap)."""

    def __init__(self, log: IntentLog, path: str, write_id: str | None) -> None:
        self.log, self.path, self.write_id = log, path, write_id
        self.written = False

    def __call__(self) -> None:
        self.log._append(["begin", self.path, self.write_id], sync=self.log.durable)
        self.written = True

    def end(self) -> None:
        """The commit is over (recorded, or undone). A line never written gets no end
        line: an unmatched end would hide the next begin of its path from ``unfinished``."""
        if self.written:
            self.log.end(self.path)
        else:
            self.log._open -= 1
