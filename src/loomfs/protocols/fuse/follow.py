"""Kernel cache invalidation from the change feed (protocol layer).

A mount follows the change feed of the site it serves (a long poll: the in-process hub's
feed, or a hub's ``/v1/changes`` over REST) and tells the kernel at once which of the
names and attributes it caches went stale, so they can be cached for long
(``FOLLOWING_TIMEOUT``) and still never be served stale for longer than the feed takes.
It only tells the kernel: the inode table is this mount's own account of what it did, and
the kernel's next lookup or getattr brings the new state in.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable

from ... import paths
from ...core.types import Change, ChangeOp, Feed
from ...errors import LoomError
from .inodes import InodeTable
from .session import Session

log = logging.getLogger(__name__)

#: the feed after ``since``, held up to ``wait`` seconds until there is a change
Poll = Callable[[int, float], Awaitable[Feed]]

#: how long the kernel may trust names and attributes while the feed is followed
FOLLOWING_TIMEOUT = 60.0
#: how long one poll is held open at the site
FEED_WAIT = 20.0
#: pause after a failed poll (the site restarting, a network blip)
RETRY = 1.0
#: how many of the mount's own changes are remembered until the feed brings them back
OWN_MAX = 4096
#: pause after a poll that brought changes: a burst of them (this mount's own creates,
#: mostly) is taken in batches, not with one poll, and one catalog read, per change
COALESCE = 0.05


class OwnChanges:
    """Changes this mount made that the kernel knows of already: an entry it created and
    described in the same reply, a name it removed (the kernel dropped the name, and the
    directory's attributes in both cases). When the feed brings them back nothing is
    stale; invalidating anyway cost a thread hop per change and sent the next ``stat``
    of the file, or ``getattr`` of its directory, to the site.

    (op, path, version) names one change only, so a change noted but never brought back
    (the feed passed it before it was noted) can never match another; it only waits to be
    pushed out by newer ones. A removal is noted before it is made, since the feed may
    bring it back before the call returns, and withdrawn if it fails."""

    def __init__(self) -> None:
        self._pending: dict[tuple[ChangeOp, str, int], None] = {}

    def note(self, op: ChangeOp, path: str, version: int) -> None:
        self._pending[(op, path, version)] = None
        if len(self._pending) > OWN_MAX:
            del self._pending[next(iter(self._pending))]

    def withdraw(self, op: ChangeOp, path: str, version: int) -> None:
        self._pending.pop((op, path, version), None)

    def take(self, change: Change) -> bool:
        """Whether ``change`` was noted here (forgotten once asked)."""
        try:
            del self._pending[(change.op, change.path, change.version)]
        except KeyError:
            return False
        return True


class FeedInvalidator:
    def __init__(self, kernel: Session, inodes: InodeTable, poll: Poll, own: OwnChanges) -> None:
        self.kernel = kernel
        self.inodes = inodes
        self.poll = poll
        self.own = own
        self.seq = 0

    async def run(self) -> None:
        """Follow the feed until cancelled; only changes after the start matter, since
        the kernel learned everything before it from the site itself."""
        self.seq = (await self._next(0, 0.0)).head
        while True:
            feed = await self._next(self.seq, FEED_WAIT)
            for change in feed.changes:
                try:
                    await self.apply(change)
                except LoomError as exc:  # the site unreachable for a moment
                    log.warning("could not check change %d against the kernel's cache: %s",
                                change.seq, exc)  # fmt: skip
                self.seq = max(self.seq, change.seq)
            if feed.changes:
                await asyncio.sleep(COALESCE)

    async def _next(self, since: int, wait: float) -> Feed:
        while True:
            try:
                return await self.poll(since, wait)
            except LoomError as exc:
                log.warning("the change feed failed, retrying: %s", exc)
                await asyncio.sleep(RETRY)

    async def apply(self, change: Change) -> None:
        """Tell the kernel what ``change`` made stale of what it may hold."""
        if change.op is ChangeOp.EVICT:
            return  # spokes drop cached data; the names and bytes here are unchanged
        if self.own.take(change):
            return
        if change.op in (ChangeOp.DELETE, ChangeOp.RENAME):
            self._forget_name(change.path)
        if change.new_path is not None:
            self._forget_name(change.new_path)
        if change.op is not ChangeOp.META:
            # a name came, went or changed content: the directory's listing and times
            await self._stale(paths.split(change.path)[0], data=False)
        node = self.inodes.by_path(change.path)
        if node is None:
            return
        # pages of another version than the one the kernel holds must go; pages of this
        # mount's own write are the new version already
        data = change.op is ChangeOp.MODIFY and node.cached_version != change.version
        await self._stale(change.path, data=data)

    def _forget_name(self, path: str) -> None:
        parent = self.inodes.by_path(paths.split(path)[0])
        if parent is None or self.inodes.by_path(path) is None:
            return  # the kernel holds no such name (it forgets the names it unlinks)
        # from the session's notice thread: the kernel may hold the directory's lock for
        # a request this loop has yet to answer. The change may be this mount's own: then
        # the kernel looks the name up once more and finds the same inode number, which
        # the inode table keeps for a file the kernel forgot.
        self.kernel.invalidate_entry_async(parent.ino, os.fsencode(paths.split(path)[1]))

    async def _stale(self, path: str, *, data: bool) -> None:
        node = self.inodes.by_path(path)
        if node is None:
            return
        node.current_until = 0.0  # the kernel's next getattr must reach the site
        node.listed_tags = None
        # in a thread: dropping pages waits for reads of them this loop is serving (an
        # inode the kernel has forgotten already is no error: ``Session._send``)
        await asyncio.to_thread(self.kernel.invalidate_inode, node.ino, attr_only=not data)
