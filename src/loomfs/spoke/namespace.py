"""The spoke's namespace (spoke layer): a hub's exports, near the GPUs.

The same namespace API as the hub, over a local cache and the fabric link. Metadata comes
from the hub; file data is fetched by range as reads miss and then served from the cache.

Consistency is close-to-open: an open at the spoke sees every change committed at the hub
before the open began. The spoke follows the change feed as a long poll; each poll
acknowledges the changes applied so far and renews a read lease, and the hub acknowledges
a commit to its writer only after every leased spoke has acknowledged it (or the lease has
expired). So while its lease lasts the spoke opens files from what it already knows, with
no round trip; without a live lease every open asks the hub for the current version.

Writes land in the durable journal first, each with an idempotency key that goes with
every try, so the hub answers a write it already committed (its answer lost to a cut or a
crash) with that commit instead of landing it again. By default a write then waits until
the hub has committed it (with the writer's version precondition, so a conflicting writer
elsewhere gets a clear ``Conflict``); with ``write_back=True`` (checkpoints) it returns
once the journal is durable and uploads in the background, and ``sync()`` waits for the
upload. With the link down, writes are journaled and acknowledged, and replayed in order
on reconnect: an unconditional one against the version it was based on, where a conflict
keeps both versions (``name.conflict-<site>-<time>``); a conditional one (``if_version``,
``exclusive``) with the writer's own precondition, whatever the mode, and a refusal is
final and reported (the log, a metric, ``sync()``), never committed over a newer version.
The default mode acknowledges a conditional write only once the hub has checked it: if the
hub can't be reached, the writer hears ``BackendUnavailable`` (and, the write perhaps
committed with its answer lost, may find it done).

A write acknowledged but not yet committed at the hub is read back by its writer (the same
user over the same protocol) at once; anyone else reads what the hub acknowledged, since
the hub may still refuse it. The written bytes become the cached copy of the new version.
With the link down, cached versions are still served (counted as possibly stale), and so
are the listings of directories the hub last listed to the same user (kept until the feed
changes something in them); a stat is answered from those, or from what the hub let that
user read; anything else not journaled is ``BackendUnavailable``, never an empty directory.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterable, AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, cast

from prometheus_client import Counter, Gauge

from .. import paths
from ..core.metrics import SPOKE
from ..core.retry import Backoff
from ..core.streams import ByteSource, clamp_range
from ..core.types import (
    SPECIAL_KINDS,
    SYSTEM,
    Change,
    ChangeOp,
    Entry,
    EntryKind,
    Principal,
    WriteTags,
)
from ..errors import (
    AlreadyExists,
    AuthenticationFailed,
    BackendUnavailable,
    Conflict,
    CorruptData,
    InvalidArgument,
    InvalidPath,
    IsADirectory,
    LoomError,
    NotADirectory,
    NotFound,
    NotSupported,
    PermissionDenied,
    from_oserror,
)
from ..namespace import listing
from ..namespace.base import FeedNamespace, Namespace, Reader, WriteTagsArg, tags_now
from .cache import BLOCK, SMALL_FILE, Cache
from .journal import Journal, Pending, new_write_id

log = logging.getLogger(__name__)

STALE_READS = Counter(
    "loomfs_spoke_stale_reads_total",
    "Reads served from cache while the hub was unreachable",
    registry=SPOKE,
)
LINK_UP = Gauge("loomfs_spoke_link_up", "1 while the spoke reaches its hub", registry=SPOKE)
LINK_RTT = Gauge(
    "loomfs_spoke_link_rtt_seconds",
    "The last timed round trip of a bare request to the hub",
    registry=SPOKE,
)
RTT_EVERY = 10.0  # seconds between the link's round-trip timings
FEED_SEQ = Gauge(
    "loomfs_spoke_feed_seq", "The last change-feed sequence number applied", registry=SPOKE
)
EVICTED = Counter(
    "loomfs_spoke_placement_evicted_total",
    "Cached file versions dropped by placement policies",
    registry=SPOKE,
)
REFUSED = Counter(
    "loomfs_spoke_refused_writes_total",
    "Acknowledged conditional writes whose precondition the hub's commit refused",
    registry=SPOKE,
)


@dataclass(slots=True)
class WarmStats:
    files: int = 0
    bytes: int = 0
    fetched: int = 0
    refused: int = 0  # files a placement policy keeps from this site
    done: bool = False

    def as_dict(self) -> dict[str, object]:
        return {
            "files": self.files,
            "bytes": self.bytes,
            "fetched": self.fetched,
            "refused": self.refused,
            "done": self.done,
        }


LEASED_OPENS = Counter(
    "loomfs_spoke_leased_opens_total",
    "Opens answered under a read lease, with no round trip",
    registry=SPOKE,
)
OFFLINE_LISTINGS = Counter(
    "loomfs_spoke_offline_listings_total",
    "Listings and stats answered from kept listings while the hub was unreachable",
    registry=SPOKE,
)
JOURNAL_WRITES = Gauge(
    "loomfs_spoke_journal_writes", "Writes journaled here the hub does not have yet",
    registry=SPOKE,
)  # fmt: skip
JOURNAL_BYTES = Gauge(
    "loomfs_spoke_journal_bytes", "Bytes of the writes the hub does not have yet", registry=SPOKE
)
JOURNAL_OLDEST = Gauge(
    "loomfs_spoke_journal_oldest_seconds", "Age of the oldest write the hub does not have yet",
    registry=SPOKE,
)  # fmt: skip
JOURNAL_REFUSED = Gauge(
    "loomfs_spoke_journal_refused_writes", "Journaled writes the hub refuses", registry=SPOKE
)

FEED_WAIT = 5.0
COLD_FETCH = 8 * BLOCK  # what the first request for a file brings along with its entry
WARM_FILES = 3  # files a warm-up fetches at once (see ``warm``)
WARM_BUNDLE = 1024  # small files a warm-up asks for in one request (``Cache.fill_small``)
LEASE_MARGIN = 1.0
RETRY = 0.5  # the first wait after the link failed; then twice as long each time...
RETRY_MAX = 15.0  # ...up to this (a refusal waits this long at once: see core.retry)
STUCK_RETRY = 5.0  # a write the hub refused is tried again after this, then less often...
STUCK_RETRY_MAX = 300.0  # ...or when the change feed says its path changed
LISTING_MAX = 10_000  # entries of one directory's listing kept for offline use, at most...
LISTINGS_MAX = 200_000  # ...and of all kept listings together (the least recent go first)
#: refusals that stand until someone acts (a policy, a path): sync() reports them
_FINAL = (PermissionDenied, NotFound, NotADirectory, IsADirectory, InvalidPath, InvalidArgument)


@dataclass
class _Held:
    """The write lease of one path for the writers of it at this spoke: taken by the
    first, kept alive by ``renewer`` while any writes, given up by the last; ``lock``
    orders taking and giving up."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    renewer: asyncio.Task[None] | None = None
    writers: int = 0


@dataclass(slots=True)
class _Kept:
    """What the hub last listed of a directory to one user, by name: ``seq`` is the feed
    position it was asked at (every change up to it is in it), ``digest`` its digest.
    Once the feed changes something in it, it is ``stale``: no longer served while the
    hub can't be asked, only the base the next listing's delta applies to."""

    entries: dict[str, Entry]
    seq: int
    digest: str
    stale: bool = False


class SpokeNamespace(Namespace):
    def __init__(
        self,
        hub: FeedNamespace,
        cache: Cache,
        attach: Sequence[str],
        *,
        site: str = "spoke",
        write_back: bool = False,
    ) -> None:
        self.hub = hub
        self.cache = cache
        self.journal = Journal(cache.directory / "journal", cache.cipher)
        self._journal_gauges()
        self.attached = [paths.normalize(p) for p in attach]
        self.site = site
        self.write_back = write_back
        self._known: dict[str, Entry] = {}  # what the hub said of each path, until changed
        # path -> (seq, was a content change) of the last change that dropped what we knew
        self._forgotten: dict[str, tuple[int, bool]] = {}
        self._below: dict[str, int] = {}  # path -> seq of the last change of all below it
        self.lease_until = 0.0
        self.lease_term = 0.0
        self._tasks: list[asyncio.Task[None]] = []
        self._wake = asyncio.Event()
        self._waiters: dict[int, asyncio.Future[Entry]] = {}
        self._stuck: dict[int, Exception] = {}  # journaled writes the hub refuses, and why
        # acknowledged conditional writes the hub refused for good, for sync() to report
        self._refused: list[LoomError] = []
        # cold opens in flight, with the feed position each was asked at
        self._opening: dict[str, tuple[asyncio.Future[Entry], int]] = {}
        self._evicted: dict[str, int] = {}  # path -> seq of the last eviction at or below it
        self._last_eviction = 0  # the newest of them: most reads need not look further
        # (user, path) -> until when (monotonic) the hub's "yes, this user may read it"
        # holds here: the lease current at that answer, never extended by later renewals,
        # so a revoked right stops serving cached data within one lease term
        self._admitted: dict[tuple[str, str], float] = {}
        self._writing: dict[str, _Held] = {}  # write leases held at the hub, by path
        # small files to open in the next bundle for each user, and the task that sends it
        self._small_opens: dict[Principal, list[tuple[Entry, asyncio.Future[bool]]]] = {}
        self._small_sending: dict[Principal, asyncio.Task[None]] = {}
        # (directory, user) -> what the hub last listed to that user there: served while
        # the hub can't be asked until the feed changes something in it, and the base of
        # the next listing's delta until the feed moves or removes it
        self._listings: OrderedDict[tuple[str, str], _Kept] = OrderedDict()
        self._listed: dict[str, set[str]] = {}  # directory -> the users it is kept for
        self._listed_entries = 0
        self._dir_changed: dict[str, int] = {}  # directory -> seq of the last change in it
        self.seq = 0
        self.online = True
        #: why the hub, reachable, refuses this site's feed (revoked, say); None while not
        self.link_error: AuthenticationFailed | None = None
        self.link_rtt: float | None = None  # seconds, the last timing while online
        self._link_retry: Backoff[str] = Backoff(RETRY, RETRY_MAX)  # the feed, the uploads
        self._stuck_retry: Backoff[int] = Backoff(STUCK_RETRY, STUCK_RETRY_MAX)  # by seq

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Join the change feed at its head (the cache keeps only versions it can check).
        With the hub reachable, what is attached must exist there (``NotFound`` names it)."""
        self.cache.open()
        try:
            self.seq = (await self.hub.changes(0, 1)).head
        except BackendUnavailable:
            self._set_online(False)
        else:
            for top in self.attached:
                try:
                    await self.hub.stat(SYSTEM, top)
                except NotFound:
                    raise NotFound(
                        f"the hub has no {top} to attach: check --attach ([spoke] attach); "
                        "`loomfs ls` at the hub lists what it has",
                        path=top,
                    ) from None
                except PermissionDenied:  # it exists; its users' rights decide the rest
                    pass
        self._tasks = [
            asyncio.create_task(self._follow()),
            asyncio.create_task(self._upload_forever()),
            asyncio.create_task(self._time_link()),
        ]
        if len(self.journal):
            self._wake.set()  # writes acknowledged before a restart

    async def close(self) -> None:
        self.journal.close()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.hub.close()
        self.cache.close()

    async def _follow(self) -> None:
        answered = False
        while True:
            sent = time.monotonic()  # the lease runs from before the hub granted it
            if not answered or (self.lease_term > LEASE_MARGIN and not self.leased):
                # no lease held (just started, or back after a cut): ask for one at once,
                # since what is read meanwhile is admitted to no one for offline use
                wait = 0.0
            else:  # hold each poll well inside a lease term, so the next renews it in time
                wait = min(FEED_WAIT, self.lease_term / 3) if self.lease_term else FEED_WAIT
            try:
                feed = await self.hub.changes(self.seq, 1000, wait=wait, ack=self.seq)
            except LoomError as exc:  # say a hub shutting down: the lease lapses meanwhile
                self.link_error = exc if isinstance(exc, AuthenticationFailed) else None
                if isinstance(exc, BackendUnavailable):
                    self._set_online(False)
                elif not self._link_retry.failures("feed"):  # once, not at every retry
                    log.warning("the change feed failed: %s", exc)
                await asyncio.sleep(self._link_retry.failed("feed", exc))
                continue
            self._link_retry.succeeded("feed")
            answered = True
            self.link_error = None
            self._set_online(True)
            for change in feed.changes:
                self.apply_change(change)
            if feed.lease:
                self.lease_term = feed.lease
                self.lease_until = sent + feed.lease

    async def _time_link(self) -> None:
        """The link's round trip every ``RTT_EVERY`` seconds while it is up (a timing
        that fails says nothing the feed does not say already)."""
        while True:
            if self.online:
                with contextlib.suppress(LoomError):
                    self.link_rtt = await self.hub.round_trip()
                    if self.link_rtt is not None:
                        LINK_RTT.set(self.link_rtt)
            await asyncio.sleep(RTT_EVERY)

    @property
    def leased(self) -> bool:
        """Whether opens may trust what this spoke knows without asking the hub."""
        return time.monotonic() < self.lease_until - LEASE_MARGIN

    def _set_online(self, online: bool) -> None:
        if online != self.online:
            log.warning("link to the hub is %s", "up" if online else "down")
            if online and len(self.journal):  # the uploader may be backing off: replay now
                self._wake.set()
        self.online = online
        LINK_UP.set(int(online))

    def _journal_gauges(self) -> None:
        """The write-back backlog, read from the journal at each scrape (a process runs
        one spoke; in the tests' that run several, the newest is the one shown)."""
        journal = self.journal
        JOURNAL_WRITES.set_function(lambda: len(journal))
        JOURNAL_BYTES.set_function(lambda: sum(journal.size(p) for p in journal))
        JOURNAL_REFUSED.set_function(lambda: len(self._stuck))

        def oldest() -> float:
            first = min((p.time_ns for p in journal), default=None)
            return 0.0 if first is None else max(0.0, (time.time_ns() - first) / 1e9)

        JOURNAL_OLDEST.set_function(oldest)

    def status(self) -> dict[str, Any]:
        """How this spoke is doing, for its console: the link, the cache, and the
        write-back journal (what the hub does not have yet, and what it refuses)."""
        cache, pending = self.cache, list(self.journal)
        return {
            "link": {
                "online": self.online and self.link_error is None,
                "refused": None if self.link_error is None else str(self.link_error),
                "seq": self.seq,
                "leased": self.leased,
                "lease_term": self.lease_term,
                "rtt_s": self.link_rtt,
            },
            "cache": {
                "used": cache.used_bytes,
                "capacity": cache.capacity,
                "reads": cache.reads,
                "hit_ratio": cache.hits / cache.reads if cache.reads else None,
            },
            "journal": {
                "writes": len(pending),
                "bytes": sum(self.journal.size(p) for p in pending),
                "oldest_ns": min((p.time_ns for p in pending), default=None),
                "stuck": [
                    {"path": p.path, "why": str(self._stuck[p.seq])}
                    for p in pending
                    if p.seq in self._stuck
                ],
                "refused": [str(exc) for exc in self._refused],
            },
        }

    def apply_change(self, change: Change) -> None:
        """Drop what a change at the hub made stale: cached data of superseded versions,
        and what this spoke knew of the path (and below it, for moves and deletes). A
        directory's own changes (its mtime moves with its listing) touch nothing below it."""
        below = change.op in (ChangeOp.DELETE, ChangeOp.RENAME, ChangeOp.EVICT)
        if change.op is ChangeOp.EVICT:
            # a placement policy may no longer let this site hold it: gone now, even the
            # versions being read (their open descriptors finish; nothing stays on disk)
            dropped = self.cache.invalidate(change.path, below=True, evict=True)
            EVICTED.inc(dropped)
            self._evicted[change.path] = self._last_eviction = change.seq
            log.info("evicted by placement policy", extra={"path": change.path, "files": dropped})
        elif below:
            self.cache.invalidate(change.path, below=True)
        elif change.op is ChangeOp.MODIFY:
            self.cache.invalidate(change.path, keep_version=change.version)
        self._unlist(change.path, change.seq, below=below)
        if change.new_path:
            self._unlist(change.new_path, change.seq, below=True)
        known = self._known.get(change.path)
        news = not (
            change.op in (ChangeOp.CREATE, ChangeOp.MODIFY)
            and known is not None
            and known.version >= change.version
        )  # a content change this spoke already saw (it asked after the change) is no news
        if news:
            content = change.op in (ChangeOp.CREATE, ChangeOp.MODIFY)
            self._forget(change.path, change.seq, content=content, below=below)
        if change.new_path:
            self._forget(change.new_path, change.seq, below=True)
        if self._stuck and any(
            paths.is_within(p.path, change.path) for p in self.journal if p.seq in self._stuck
        ):  # a refused write may commit now (its directory came back, say): try it again
            self._wake.set()
        self.seq = max(self.seq, change.seq)
        FEED_SEQ.set(self.seq)

    def _forget(self, path: str, seq: int, *, content: bool = False, below: bool = False) -> None:
        self._known.pop(path, None)
        if below:
            self._below[path] = seq
            prefix = path.rstrip("/") + "/"
            for known in [p for p in self._known if p.startswith(prefix)]:
                del self._known[known]
        self._forgotten[path] = (seq, content)

    def changed_since(self, path: str, seq: int) -> bool:
        """Whether the change feed changed ``path``, or a directory above it, after change
        ``seq``: a refusal or an absence the hub answered at ``seq`` may be answered
        otherwise now (and until then, asking again costs the link for nothing). Of the
        directories above, only changes of all below them count (a move, a delete, an
        eviction), not a directory's own (its mtime moves with its listing)."""
        if self._forgotten.get(path, (0, False))[0] > seq:
            return True
        return any(self._below.get(at, 0) > seq for at in (path, *paths.ancestors(path)))

    def _learn(self, entry: Entry, asked_at: int) -> None:
        """Remember an answer from the hub, unless the feed changed the path while the
        question was on its way and the answer may predate that change (an answer whose
        version is that content change's is not older)."""
        seq, content = self._forgotten.get(entry.path, (0, False))
        if seq <= asked_at or (content and entry.version >= seq):
            self._known[entry.path] = entry

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
        pending = self._own_pending(who, path)
        if pending is not None:
            with contextlib.suppress(FileNotFoundError):  # committed meanwhile: ask the hub
                return self._pending_entry(pending)
        asked_at = self.seq
        try:
            entry = await self.hub.stat(who, path)
        except BackendUnavailable:
            parent, name = paths.split(path)
            kept = self._current_listing(parent, who).get(name)
            if kept is None and (who.user, path) in self._admitted:  # a file it may read
                kept = self._known.get(path)
            if kept is None:  # the root, or a name this user was never shown
                raise
            OFFLINE_LISTINGS.inc()
            return kept
        self._learn(entry, asked_at)  # a stat needs list only: it admits no read
        return entry

    async def stat_for_read(self, who: Principal, path: str) -> Entry:
        path = self._inside(path)
        pending = self._own_pending(who, path)
        if pending is not None:  # its writer reads it back, as ``read`` serves it
            with contextlib.suppress(FileNotFoundError):  # committed meanwhile: ask the hub
                return self._pending_entry(pending)
        asked_at = self.seq
        entry = await self.hub.stat_for_read(who, path)
        self._admit(who, path)
        self._learn(entry, asked_at)
        return entry

    async def list(
        self, who: Principal, path: str, *, start_after: str | None = None, limit: int | None = None
    ) -> AsyncIterator[Entry]:
        path = paths.normalize(path)
        if not self._visible(path):
            raise PermissionDenied(f"{path} is not attached at this spoke", path=path)
        asked_at = self.seq
        # a whole listing is kept (a page is not the directory): for offline use, and as
        # the base of the next one, which then brings only what changed
        whole = start_after is None and limit is None
        try:
            held = await self._list_held(who, path) if whole else None
        except BackendUnavailable as exc:
            for entry in self._offline_listing(who, path, start_after, limit, exc):
                yield entry
            return
        if held is not None:
            self._keep_listing(path, who, held, asked_at)
            for entry in held.values():
                yield entry
            return
        seen: dict[str, Entry] | None = {} if whole else None
        began = False
        try:
            async for entry in self.hub.list(who, path, start_after=start_after, limit=limit):
                began = True
                if not self._visible(entry.path):
                    continue
                if seen is not None:
                    seen[entry.name] = entry
                    if len(seen) > LISTING_MAX:  # too long to keep: listed, not kept
                        seen = None
                yield entry
        except BackendUnavailable as exc:
            if began:  # half a listing is no listing: the caller hears the link failed
                raise
            for entry in self._offline_listing(who, path, start_after, limit, exc):
                yield entry
            return
        if seen is not None:
            self._keep_listing(path, who, seen, asked_at)

    async def _list_held(self, who: Principal, path: str) -> dict[str, Entry] | None:
        """``path``'s listing from the one kept for ``who`` and what the hub says changed
        in it since (``namespace.listing``), in name order; None with none kept, or where
        that does not come out as the hub's listing (a plain listing then says what is)."""
        kept = self._listings.get((path, who.user))
        # above an attached export a listing is cut to what is attached: not the hub's
        if kept is None or not any(paths.is_within(path, top) for top in self.attached):
            return None
        answer = await self.hub.list_changed(who, path, kept.seq, kept.digest)
        return listing.applied(kept.entries, answer)

    async def walk(self, who: Principal, top: str) -> AsyncIterator[Entry]:
        """As a walk by listings, but with one request for the listings of a whole tree
        inside an export (``FeedNamespace.list_tree``), each kept as ``list`` keeps one
        and sent as what changed where one is kept already."""
        top = paths.normalize(top)
        if not any(paths.is_within(top, at) for at in self.attached):
            async for entry in super().walk(who, top):
                yield entry
            return
        asked_at = self.seq
        mine = [d for d, users in self._listed.items() if who.user in users]
        held = {
            d: (self._listings[(d, who.user)].seq, self._listings[(d, who.user)].digest)
            for d in mine
            if paths.is_within(d, top)
        }
        got: dict[str, dict[str, Entry] | LoomError | None] = {}
        try:
            async for directory, answer in self.hub.list_tree(who, top, held):
                got[directory] = self._held_from_tree(who, directory, answer, asked_at)
        except BackendUnavailable:  # walk what is kept, as listings do offline
            got = {}
        if top not in got:
            async for entry in super().walk(who, top):
                yield entry
            return
        async for entry in self._walk_got(who, top, got):
            yield entry

    def _held_from_tree(
        self, who: Principal, directory: str, answer: listing.ListingDelta | LoomError, at: int
    ) -> dict[str, Entry] | LoomError | None:
        """A tree's answer for ``directory`` as its listing, kept as ``list`` keeps one;
        None where it does not come out as the hub's (a plain listing says what is)."""
        if isinstance(answer, LoomError):
            return answer
        kept = self._listings.get((directory, who.user))
        entries = listing.applied({} if kept is None else kept.entries, answer)
        if entries is None:
            self._drop_listing((directory, who.user))
        elif len(entries) <= LISTING_MAX:
            self._keep_listing(directory, who, entries, at)
        return entries

    async def _walk_got(
        self, who: Principal, directory: str, got: Mapping[str, dict[str, Entry] | LoomError | None]
    ) -> AsyncIterator[Entry]:
        if directory not in got:  # past the hub's budget for one tree: a tree of its own
            async for entry in self.walk(who, directory):
                yield entry
            return
        entries = got[directory]
        if isinstance(entries, LoomError):
            raise entries
        if entries is None:  # the tree's answer did not add up: a plain listing
            entries = {entry.name: entry async for entry in self.list(who, directory)}
        for entry in entries.values():
            yield entry
            if entry.is_dir:
                async for below in self._walk_got(who, entry.path, got):
                    yield below

    def _current_listing(self, path: str, who: Principal) -> dict[str, Entry]:
        """The listing of ``path`` kept for ``who`` that the feed has not changed since."""
        kept = self._listings.get((path, who.user))
        return {} if kept is None or kept.stale else kept.entries

    def _offline_listing(
        self,
        who: Principal,
        path: str,
        start_after: str | None,
        limit: int | None,
        exc: BackendUnavailable,
    ) -> builtins.list[Entry]:
        kept = self._listings.get((path, who.user))
        if kept is None or kept.stale:
            raise BackendUnavailable(
                f"the hub is unreachable, and this spoke keeps no listing of {path} "
                f"that it listed to {who.user}: {exc}",
                path=path,
            ) from exc
        self._listings.move_to_end((path, who.user))
        OFFLINE_LISTINGS.inc()
        after = [e for e in kept.entries.values() if start_after is None or e.name > start_after]
        return after if limit is None else after[:limit]

    def _keep_listing(
        self, path: str, who: Principal, entries: dict[str, Entry], asked_at: int
    ) -> None:
        """Keep what the hub listed to ``who``, unless the feed moved or removed the
        directory (or one above it) while the listing was on its way; a change in it
        meanwhile makes it stale at once."""
        if any(self._below.get(at, 0) > asked_at for at in (path, *paths.ancestors(path))):
            return
        stale = self._dir_changed.get(path, 0) > asked_at
        self._drop_listing((path, who.user))
        self._listings[(path, who.user)] = _Kept(
            entries, asked_at, listing.digest(entries.values()), stale
        )
        self._listed.setdefault(path, set()).add(who.user)
        self._listed_entries += len(entries)
        while self._listed_entries > LISTINGS_MAX:
            self._drop_listing(next(iter(self._listings)))

    def _drop_listing(self, key: tuple[str, str]) -> None:
        kept = self._listings.pop(key, None)
        if kept is not None:
            self._listed_entries -= len(kept.entries)
            users = self._listed[key[0]]
            users.discard(key[1])
            if not users:
                del self._listed[key[0]]

    def _unlist(self, path: str, seq: int, *, below: bool) -> None:
        """A change of ``path`` at ``seq``: its directory's kept listings (it is an entry
        there) are stale, and with ``below`` (moved, removed, evicted) those at or below
        it are gone."""
        parent = paths.split(path)[0]
        self._dir_changed[parent] = seq
        for user in self._listed.get(parent, ()):
            self._listings[(parent, user)].stale = True
        if below:
            for directory in [d for d in self._listed if paths.is_within(d, path)]:
                for user in list(self._listed[directory]):
                    self._drop_listing((directory, user))

    async def _open_entry(
        self, who: Principal, path: str, offset: int = 0, length: int | None = None
    ) -> tuple[Entry, float]:
        """The entry to read, and the seconds spent on a cold open that brought the file's
        first bytes or map: this read's own, or another request's it waited for (single
        flight). The cache counts such a read as a miss, though it finds its blocks there."""
        known = self._known.get(path)
        if known is not None and self.leased and self._is_admitted(who, path):
            LEASED_OPENS.inc()
            return known, 0.0
        asked_at = self.seq
        began, cold = time.monotonic(), True
        try:
            opening = self._current_opening(path)
            if opening is not None:  # another reader's cold open brings it: one request
                entry = await asyncio.shield(opening)
                if not self._is_admitted(who, path):  # that reader's right is not this one's
                    await self.hub.stat_for_read(who, path)
            elif known is None and not self.cache.versions(path) and path not in self._opening:
                entry = await self._open_cold(who, path, offset, length)
            else:  # what the cache holds may be served to this user only if the hub agrees
                cold = False
                entry = await self.hub.stat_for_read(who, path)
            self._admit(who, path)
        except BackendUnavailable:
            known = known or self._newest_cached(path)
            # offline, the cache serves a user only what the hub let that user read (a
            # stat, or another user's fill, is no such word); how long ago it said so
            # can't matter while no revocation can arrive
            if known is None or (who.user, path) not in self._admitted:
                raise
            STALE_READS.inc()
            return known, 0.0
        self._learn(entry, asked_at)
        return entry, (time.monotonic() - began if cold else 0.0)

    async def _open_cold(self, who: Principal, path: str, offset: int, length: int | None) -> Entry:
        """A file this spoke holds nothing of: one request brings its entry and the first
        blocks of the read (a stat and then a fetch would be two round trips)."""
        start = offset - offset % BLOCK
        want = COLD_FETCH if length is None else min(COLD_FETCH, offset + length - start)
        want += -want % BLOCK  # whole blocks
        opening: asyncio.Future[Entry] = asyncio.get_running_loop().create_future()
        asked_at = self.seq
        self._opening[path] = (opening, asked_at)
        try:
            if self.cache.chunks is not None:
                # with chunks: the entry and its map (small files: their bytes) come first,
                # then only the chunks this spoke holds nowhere
                data, start = b"", 0
                entry = await self._open_bundled(who, path)
                if entry is None:
                    entry = await self._open_chunked(who, path, asked_at)
            else:
                async with await self.hub.read(who, path, start, want) as reader:
                    data = await reader.read_all()
                    entry = reader.entry
            if data and not self._evicted_since(path, asked_at):
                await self.cache.store(path, entry.version, entry.size, start, data)
        except Exception as exc:
            opening.set_exception(exc)
            opening.exception()  # the waiters re-raise it themselves
            raise
        except BaseException:
            opening.cancel()
            raise
        finally:
            if self._opening.get(path, (None, 0))[0] is opening:
                del self._opening[path]
        opening.set_result(entry)
        return entry

    async def _open_bundled(self, who: Principal, path: str) -> Entry | None:
        """A small file whose entry a current listing kept for ``who`` names: opened with
        the other such files opened for ``who`` meanwhile, in one bundle request read for
        ``who`` (the hub's word that ``who`` may read it) and one frame for them all (a
        prefetcher's files, a loader's parallel reads). While one bundle is on its way,
        the next gathers. None where the file is not one of these, or the bundle did not
        bring it (changed since the listing, refused): its own open then says why."""
        assert self.cache.chunks is not None
        parent, name = paths.split(path)
        entry = self._current_listing(parent, who).get(name)
        if entry is None or entry.kind is not EntryKind.FILE or not 0 < entry.size <= SMALL_FILE:
            return None
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._small_opens.setdefault(who, []).append((entry, future))
        if who not in self._small_sending:
            self._small_sending[who] = asyncio.create_task(self._send_small_opens(who))
        return entry if await future else None

    async def _send_small_opens(self, who: Principal) -> None:
        batch: builtins.list[tuple[Entry, asyncio.Future[bool]]] = []
        try:
            await asyncio.sleep(0)  # the opens of this turn of the loop join the first
            while batch := self._small_opens.pop(who, []):
                try:
                    brought = await self.cache.fill_small(
                        [(e.path, e.version, e.size) for e, _ in batch], who
                    )
                except LoomError as exc:  # each file's own open asks again and says why
                    log.info("a bundle of opens failed: %s", exc)
                    brought = set()
                for entry, future in batch:
                    if not future.done():
                        future.set_result((entry.path, entry.version) in brought)
        finally:
            del self._small_sending[who]
            for _, future in [*batch, *self._small_opens.pop(who, [])]:
                if not future.done():
                    future.set_result(False)

    def _current_opening(self, path: str) -> asyncio.Future[Entry] | None:
        """A cold open of ``path`` in flight that a read may join: none if the feed changed
        the path after it was asked, since its answer may predate a write this read must
        see (a prefetch's open, begun before that write was acknowledged)."""
        opening = self._opening.get(path)
        if opening is None or self._forgotten.get(path, (0, False))[0] > opening[1]:
            return None
        return opening[0]

    def _evicted_since(self, path: str, seq: int) -> bool:
        """Whether a placement eviction covering ``path`` arrived after ``seq``: bytes
        the hub sent before it are for the reader that asked, not for the cache."""
        if self._last_eviction <= seq:  # every read's chunks ask: no walk over them all
            return False
        return any(at > seq and paths.is_within(path, top) for top, at in self._evicted.items())

    def _is_admitted(self, who: Principal, path: str) -> bool:
        return self.admitted_until(who, path) > time.monotonic()

    def admitted_until(self, who: Principal, path: str) -> float:
        """Until when (monotonic) the hub's word that ``who`` may read ``path`` holds at
        this spoke; 0 if it never said so under a lease."""
        return self._admitted.get((who.user, path), 0.0)

    def _admit(self, who: Principal, path: str) -> None:
        """The hub just let ``who`` read ``path``: remember it for the current lease."""
        if self.leased:
            if len(self._admitted) > 100_000:  # answers whose lease is over
                now = time.monotonic()
                self._admitted = {k: t for k, t in self._admitted.items() if t > now}
            self._admitted[(who.user, path)] = self.lease_until - LEASE_MARGIN

    def _own_pending(self, who: Principal, path: str) -> Pending | None:
        """The newest write of ``path`` that ``who`` made and was told is done, not yet
        committed at the hub: its writer reads it back (the same user over the same
        protocol, as a session). Nobody else sees it, nor a write whose writer still waits
        for the hub: the hub may yet refuse it, and a read of it would be a dirty read."""
        user = None if who.protocol == "internal" else who.user
        for pending in reversed(self.journal.of_path(path)):
            acknowledged = pending.seq not in self._waiters
            if acknowledged and (pending.user, pending.protocol) == (user, who.protocol):
                return pending
        return None

    async def _open_chunked(self, who: Principal, path: str, asked_at: int) -> Entry:
        assert self.cache.chunks is not None
        # opened for ``who``: the hub decides whether this user may read it
        opened = await self.cache.chunks.link.open_chunked(path, small=SMALL_FILE, who=who)
        entry = opened.entry
        if self._evicted_since(path, asked_at):
            return entry  # the answer serves this open; the cache keeps nothing of it
        if opened.whole:
            await self.cache.store(path, entry.version, entry.size, 0, opened.whole)
        elif opened.chunk_map is not None:
            self.cache.set_map(path, entry.version, entry.size, opened.chunk_map)
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
        pending = None if if_version else self._own_pending(who, path)
        if pending is not None:  # version 0: what stat said of it
            with contextlib.suppress(FileNotFoundError):  # committed meanwhile: read as usual
                return self._read_pending(pending, offset, length)
        entry, opened_s = await self._open_entry(who, path, offset, length)
        if entry.is_dir:
            raise IsADirectory(f"is a directory: {path}", path=path)
        if entry.kind in SPECIAL_KINDS:  # as the hub: no content to fetch or cache
            raise NotSupported(f"{path} is a special file", path=path)
        if if_version is not None and entry.version != if_version:
            raise Conflict(f"{path} is at version {entry.version}, not {if_version}", path=path)
        start, count = clamp_range(entry.size, offset, length)
        opened_at = self.seq
        source = await self.cache.read(
            path, entry.version, entry.size, start, count, self._fetch, opened_s=opened_s
        )
        return Reader(entry, start, _UntilEvicted(source, self, path, opened_at))

    def _read_pending(self, pending: Pending, offset: int, length: int | None) -> Reader:
        entry = self._pending_entry(pending)
        start, count = clamp_range(entry.size, offset, length)
        return Reader(entry, start, self.journal.source(pending, start, count))

    async def warm(
        self,
        who: Principal,
        top: str,
        *,
        pin: bool = False,
        progress: Callable[[WarmStats], None] | None = None,
    ) -> WarmStats:
        """Fetch every file below ``top`` into the cache ahead of reads; blocks already
        cached are skipped, so an interrupted warm-up resumes where it stopped."""
        stats = WarmStats()
        top = self._inside(top)

        def held(entry: Entry) -> int:
            before = self.cache.get(entry.path, entry.version)
            return before.cached_bytes if before is not None else 0

        async def one(entry: Entry, had: int | None = None) -> None:
            had = held(entry) if had is None else had  # what was cached before the warm-up
            try:
                source = await self.cache.read(
                    entry.path, entry.version, entry.size, 0, entry.size, self._fetch
                )
            except PermissionDenied:
                stats.refused += 1  # the rest of the tree may still come here
                return
            await source.aclose()
            self._known.setdefault(entry.path, entry)
            if pin:
                self.cache.set_pinned(entry.path, entry.version, True)
            stats.files += 1
            stats.bytes += entry.size
            stats.fetched += entry.size - had
            if progress is not None:
                progress(stats)

        # A few files at a time: one file's last frames, decoding and cache writes overlap
        # the next one's request and the hub's first encoding, where the link idled
        # (about 40% of the time at 100 MB/s on incompressible files; best of 6 runs of
        # 10 x 10 MB there: 1.35 s one file at a time, 1.17 s two, 1.13 s three, against
        # 1.04 s for a plain read). A file that starts before the one ahead is complete
        # cannot take it as its delta base (it takes an older complete sibling).
        # Small files go a bundle at a time: one request and one frame for many of them,
        # deltas included (``Cache.fill_small``), then each is a read of what is cached.
        async def bundled(entries: list[Entry]) -> None:
            had = [held(entry) for entry in entries]
            await self.cache.fill_small([(e.path, e.version, e.size) for e in entries])
            for entry, before in zip(entries, had, strict=True):
                await one(entry, before)

        running: set[asyncio.Task[None]] = set()
        small: list[Entry] = []
        try:
            async for entry in self._map_ahead(self.walk(who, top)):
                while len(running) >= WARM_FILES:
                    running = await _first_done(running)
                if self.cache.chunks is None or entry.size > SMALL_FILE:
                    running.add(asyncio.create_task(one(entry)))
                    continue
                small.append(entry)
                if len(small) >= WARM_BUNDLE:
                    running.add(asyncio.create_task(bundled(small)))
                    small = []
            if small:
                running.add(asyncio.create_task(bundled(small)))
            while running:
                running = await _first_done(running)
        finally:
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
        stats.done = True
        if progress is not None:
            progress(stats)
        return stats

    async def _map_ahead(self, entries: AsyncIterator[Entry]) -> AsyncIterator[Entry]:
        """The files of ``entries``, each handed on once its chunk map is here (or asking
        for it failed: the fill asks again and reports it). Maps are asked one at a time,
        in walk order, up to ``WARM_FILES`` files ahead of those handed on: the hub maps
        the next files while the link carries the ones before, and the first file's map
        is not held up behind the maps of the others (asked all at once, five maps came
        back together after 0.3 s of idle link on bench/transfer.py's corpus 5)."""
        ready: asyncio.Queue[Entry] = asyncio.Queue(WARM_FILES)

        async def ask() -> None:
            async for entry in entries:
                if entry.kind is EntryKind.FILE:
                    await self.cache.prefetch_map(entry.path, entry.version, entry.size)
                    await ready.put(entry)

        asking = asyncio.create_task(ask())
        try:
            while True:
                taking = asyncio.ensure_future(ready.get())
                await asyncio.wait({taking, asking}, return_when=asyncio.FIRST_COMPLETED)
                if taking.done():
                    yield taking.result()
                    continue
                taking.cancel()
                asking.result()  # the walk failed: say so; else it is over
                while not ready.empty():
                    yield ready.get_nowait()
                return
        finally:
            asking.cancel()
            await asyncio.gather(asking, return_exceptions=True)

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
        write_id: str | None = None,
        tags: WriteTagsArg = None,
    ) -> Entry:
        path = self._inside(path)
        repeated = None if write_id is None else self.journal.keyed(write_id)
        if repeated is not None:  # a client's retry of a write journaled here
            if repeated.seq in self._waiters:
                raise Conflict(f"a write with this key is under way: {path}", path=path)
            return self._pending_entry(repeated)
        conditional = if_version is not None or exclusive
        async with self._write_lease(who, path):
            base = await self._base_version(who, path)
            # the default mode acknowledges a conditional write only once the hub checked it
            early = self.write_back or not (self.online or conditional)
            seq, spool = self.journal.reserve()
            waiter: asyncio.Future[Entry] | None = None
            if not early:  # before the record exists: until answered, it is nobody's to read
                waiter = self._waiters[seq] = asyncio.get_running_loop().create_future()
            try:
                try:
                    try:
                        async for chunk in data:
                            await asyncio.to_thread(spool.write, chunk)
                    finally:
                        await asyncio.to_thread(spool.close)
                    made = tags_now(tags)  # journaled with the bytes, sent with them
                    pending = Pending(
                        seq, path, base, if_version, exclusive, mode, time.time_ns(),
                        early=early, sealed=self.journal.sealed,
                        user=None if who.protocol == "internal" else who.user,
                        protocol=who.protocol, write_id=write_id or new_write_id(),
                        client_key=write_id is not None,
                        tags=None if made is None else made.as_json(),
                    )  # fmt: skip
                    pending = await asyncio.to_thread(self.journal.commit, pending)
                except OSError as exc:  # a full cache disk says which (was a 500)
                    disk = f"the spoke's journal {self.journal.directory}"
                    error = from_oserror(exc, path, disk=disk)
                    if error is not cast(object, exc):  # else one of ours already
                        raise error from exc
                    raise
            except BaseException:
                self._waiters.pop(seq, None)
                self.journal.discard(seq)
                raise
            self._wake.set()
            if waiter is None:
                return self._pending_entry(pending)
            try:
                return await waiter
            except asyncio.CancelledError:  # the writer went away: it stays journaled,
                self._waiters.pop(seq, None)  # replayed as one nobody waits for
                raise

    @contextlib.asynccontextmanager
    async def _write_lease(self, who: Principal, path: str) -> AsyncIterator[None]:
        """Hold the hub's write lease of ``path`` while a write streams in and commits, so
        a writer at another site is refused at once. Writers of one path at this spoke
        share it: the first takes it, the last gives it up. Offline there is none to take:
        the write is journaled and replayed with its version precondition instead."""
        held = self._writing.get(path)
        if held is None:
            held = self._writing[path] = _Held()
        held.writers += 1
        try:
            async with held.lock:
                if held.renewer is None:
                    with contextlib.suppress(BackendUnavailable):
                        term = await self.lease_write(who, path)
                        held.renewer = asyncio.create_task(self._renew(who, path, term))
            yield
        finally:
            held.writers -= 1
            if not held.writers:  # shielded: a cancelled writer still ends the renewals
                await asyncio.shield(self._give_up(who, path, held))

    async def _give_up(self, who: Principal, path: str, held: _Held) -> None:
        """The last writer of ``path`` here is done: stop renewing, release the lease, and
        forget it, unless a writer came meanwhile (it keeps or takes the lease anew)."""
        async with held.lock:
            if held.writers:
                return
            renewer, held.renewer = held.renewer, None
            if renewer is not None:
                renewer.cancel()
                with contextlib.suppress(LoomError):
                    await self.release_write(who, path)
            if not held.writers and self._writing.get(path) is held:
                del self._writing[path]

    async def _renew(self, who: Principal, path: str, term: float) -> None:
        while True:
            await asyncio.sleep(term / 3)
            try:
                term = await self.lease_write(who, path)
            except LoomError as exc:  # the commit's precondition still guards the write
                log.warning("could not renew a write lease: %s", exc, extra={"path": path})

    async def lease_write(self, who: Principal, path: str) -> float:
        return await self.hub.lease_write(who, self._inside(path))

    async def release_write(self, who: Principal, path: str) -> None:
        await self.hub.release_write(who, self._inside(path))

    async def _base_version(self, who: Principal, path: str) -> int | None:
        """The hub version a write replaces (None: a new file); offline, the last one seen."""
        pending = self.journal.pending(path)
        if pending is not None:
            return pending.base_version
        try:
            return (await self.hub.stat(who, path)).version
        except NotFound:
            return None
        except BackendUnavailable:
            known = self._known.get(path) or self._newest_cached(path)
            return None if known is None else known.version

    def _pending_entry(self, pending: Pending) -> Entry:
        """What stat says of a write not yet committed at the hub (version 0)."""
        size = self.journal.size(pending)
        return Entry(pending.path, EntryKind.FILE, size, pending.time_ns,
                     pending.mode or 0o100644, 0, 0, 0)  # fmt: skip

    async def sync(self) -> None:
        """Wait until every journaled write is committed at the hub (bound it with
        ``asyncio.timeout`` where the link may stay down); raise the hub's refusal of the
        first write it will not take as things stand (``_FINAL``: a placement policy, a
        directory gone); the write stays journaled and retried. Other refusals (a hub
        shutting down) are waited through. Acknowledged conditional writes the hub refused
        since the last ``sync()`` are reported here once (``Conflict``), and are gone."""
        await self._drain()
        if self._refused:
            refused, self._refused = self._refused, []
            if len(refused) > 1:
                raise Conflict(f"{len(refused)} acknowledged writes were refused; the first: "
                               f"{refused[0]}", path=refused[0].path)  # fmt: skip
            raise refused[0]
        for pending in self.journal:
            stuck = self._stuck.get(pending.seq)
            if isinstance(stuck, _FINAL):
                raise type(stuck)(
                    f"a journaled write of {pending.path} is kept, but the hub refuses it: {stuck}",
                    path=pending.path,
                ) from stuck

    async def _drain(self) -> None:
        """Wait until every journaled write is committed, finally refused, or waits behind
        an earlier finally refused write of its path (it never overtakes that)."""
        while True:
            first_final: dict[str, int] = {}
            for p in self.journal:
                if isinstance(self._stuck.get(p.seq), _FINAL):
                    first_final.setdefault(p.path, p.seq)
            if all(first_final.get(p.path, p.seq + 1) <= p.seq for p in self.journal):
                return
            self._wake.set()
            await asyncio.sleep(0.05)

    # -- the uploader ----------------------------------------------------------------------

    async def _upload_forever(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            blocked: set[str] = set()  # paths whose earliest write is stuck
            for seq in [p.seq for p in self.journal]:
                pending = self.journal.get(seq)  # as of now: an earlier commit may rebase it
                if pending is None:
                    continue
                if pending.path in blocked:  # never overtakes an earlier write of its path
                    self._release_early(
                        pending,
                        Conflict(
                            f"an earlier write of {pending.path} at this spoke is refused by "
                            "the hub; a conditional write is not checked behind it",
                            path=pending.path,
                        ),
                    )
                    continue
                try:
                    entry = await self._commit(pending, waiting=pending.seq in self._waiters)
                except BackendUnavailable as exc:
                    self._set_online(False)
                    for waiting in list(self.journal):  # none of them can commit for now
                        self._release_early(waiting, exc)
                    retry = self._link_retry.failed("upload", exc)
                    asyncio.get_running_loop().call_later(retry, self._wake.set)
                    break
                except Exception as exc:
                    waiter = self._waiters.pop(pending.seq, None)
                    if waiter is not None:  # the writer is there to hear it
                        self.journal.remove(pending)
                        waiter.set_exception(exc)
                    elif await self._precondition_failed(pending, exc):
                        self._refuse(pending, exc)
                    else:
                        # acknowledged, and the hub refuses it (say its directory is gone,
                        # it is shutting down, or a placement policy keeps this site out):
                        # it stays journaled, reported (the log, sync()) and retried
                        if pending.seq not in self._stuck:
                            log.error("a journaled write cannot be committed: %s", exc,
                                      extra={"path": pending.path, "seq": pending.seq})  # fmt: skip
                        self._stuck[pending.seq] = exc
                        blocked.add(pending.path)
                        retry = self._stuck_retry.failed(pending.seq, exc)
                        asyncio.get_running_loop().call_later(retry, self._wake.set)
                    continue
                self._link_retry.succeeded("upload")
                self._set_online(True)
                if entry.path == pending.path:
                    self.journal.rebase(pending, entry.version)
                self.cache.invalidate(entry.path, keep_version=entry.version)
                if not pending.client_key:  # else the version may hold another request's
                    await self._keep_written(pending, entry)
                self.journal.remove(pending)
                self._stuck.pop(pending.seq, None)
                self._stuck_retry.succeeded(pending.seq)
                self._learn(entry, entry.version)
                waiter = self._waiters.pop(pending.seq, None)
                if waiter is not None:
                    waiter.set_result(entry)

    async def _keep_written(self, pending: Pending, entry: Entry) -> None:
        """The committed bytes become the cached copy of the version ``entry`` names."""
        try:
            if pending.sealed:  # opened frame by frame, sealed again as blocks
                await self.cache.adopt_stream(
                    entry.path, entry.version, self.journal.size(pending),
                    self.journal.source(pending),
                )  # fmt: skip
            else:
                await self.cache.adopt(entry.path, entry.version, self.journal.data_path(pending))
        except Exception:  # only a missed cache fill: the hub has the write
            log.exception("could not keep a written file in the cache")

    async def _commit(self, pending: Pending, *, waiting: bool) -> Entry:
        """Upload one journaled write. A conflict fails a waiting writer, and refuses a
        conditional write (its precondition is the writer's word); an unconditional early
        write that conflicts is kept beside the hub's version instead."""
        try:
            return await self._upload(pending, waiting=waiting)
        except (Conflict, AlreadyExists) as exc:
            if waiting or pending.conditional:
                raise
            return await self._keep_both(pending, exc)

    def _release_early(self, pending: Pending, why: LoomError) -> None:
        """A waiting writer whose write can't commit now (the link is down, or an earlier
        write of its path is stuck). An unconditional write is durable, so it is
        acknowledged now and replayed like any early write. A conditional one is not
        acknowledged unchecked: its writer hears ``why`` and the write is dropped (with
        the link down the hub may still have committed it, its answer lost)."""
        waiter = self._waiters.pop(pending.seq, None)
        if waiter is None:
            return
        if pending.conditional:
            self.journal.remove(pending)
            waiter.set_exception(why)
        else:
            waiter.set_result(self._pending_entry(pending))

    async def _precondition_failed(self, pending: Pending, exc: Exception) -> bool:
        """Whether an acknowledged conditional write was refused for good: its version
        precondition fails at the hub (rather than, say, another site's write lease, which
        passes)."""
        if not pending.conditional or not isinstance(exc, (Conflict, AlreadyExists)):
            return False
        try:
            current: Entry | None = await self.hub.stat(SYSTEM, pending.path)
        except NotFound:
            current = None
        except LoomError:
            return False  # asked again at the next try
        if pending.exclusive:
            return current is not None
        return current is None or current.version != pending.if_version

    def _refuse(self, pending: Pending, exc: Exception) -> None:
        """Drop an acknowledged conditional write whose precondition the hub refuses; it
        is reported (the log, a metric, the next ``sync()``), never committed over the
        newer version, nor kept as a copy (its writer asked for that version only)."""
        log.error("an acknowledged conditional write is refused by the hub: %s", exc,
                  extra={"path": pending.path, "seq": pending.seq})  # fmt: skip
        REFUSED.inc()
        self.journal.remove(pending)
        self._stuck.pop(pending.seq, None)
        self._refused.append(
            Conflict(f"an acknowledged write of {pending.path} was refused: {exc}",
                     path=pending.path)
        )  # fmt: skip

    async def _upload(self, pending: Pending, *, waiting: bool) -> Entry:
        if waiting or pending.conditional:  # the writer's own preconditions apply
            if_version, exclusive = pending.if_version, pending.exclusive
        else:  # acknowledged unconditionally: commit only over the version it was based on
            if_version, exclusive = pending.base_version, pending.base_version is None
        return await self._send(
            self._writer(pending),
            pending.path,
            pending,
            if_version=if_version,
            exclusive=exclusive,
            mode=pending.mode,
        )

    def _writer(self, pending: Pending) -> Principal:
        """Who a journaled write is committed as: its writer, so the hub's rules decide
        for them (a write the hub refuses fails its waiting writer, or stays journaled
        and reported when it was acknowledged early)."""
        if pending.user is None:
            return SYSTEM
        return Principal(pending.user, site=self.site, protocol=pending.protocol)

    async def _send(
        self,
        who: Principal,
        path: str,
        pending: Pending,
        *,
        if_version: int | None = None,
        exclusive: bool = False,
        mode: int | None = None,
    ) -> Entry:
        """Upload one journaled write to ``path`` as ``who``, with its idempotency key: as
        chunks the hub lacks where the link moves chunks and the file is not small, else
        (or if the hub could not assemble it) its bytes. Either way the hub gets the
        plaintext (opened here where sealed)."""
        tags = None if pending.tags is None else WriteTags.from_json(pending.tags)
        chunks = self.cache.chunks
        if chunks is not None and self.journal.size(pending) > SMALL_FILE:
            try:
                return await chunks.upload(
                    path,
                    partial(self.journal.open_plain, pending),
                    if_version=if_version,
                    exclusive=exclusive,
                    mode=mode,
                    write_id=pending.write_id,
                    who=who,
                    tags=tags,
                )
            except CorruptData as exc:
                log.warning("chunked upload failed; sending the file whole: %s", exc)
        return await self.hub.write(
            who,
            path,
            self._journaled(pending),
            if_version=if_version,
            exclusive=exclusive,
            mode=mode,
            write_id=pending.write_id,
            tags=tags,
        )

    async def _journaled(self, pending: Pending) -> AsyncIterator[bytes]:
        """The bytes of a journaled write, opened where sealed."""
        async with self.journal.source(pending) as source:
            async for chunk in source.chunks():
                yield chunk

    async def _keep_both(self, pending: Pending, exc: Exception) -> Entry:
        """Keep a conflicting write beside the hub's version, under the write's own key:
        the write lands once, as the copy, and a try after a lost answer is told so even
        where it names the path (the hub answers a key with where it landed)."""
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(pending.time_ns / 1e9))
        name = f"{pending.path}.conflict-{self.site}-{stamp}-{pending.seq}"
        log.warning(
            "write conflicted at the hub; keeping both versions",
            extra={"path": pending.path, "kept_as": name, "reason": str(exc)},
        )
        return await self._send(self._writer(pending), name, pending, exclusive=True)

    async def mkdir(
        self, who: Principal, path: str, *, parents: bool = False, exist_ok: bool = False
    ) -> Entry:
        path = self._inside(path)
        await self._in_order()
        return await self.hub.mkdir(who, path, parents=parents, exist_ok=exist_ok)

    async def _in_order(self) -> None:
        """Metadata changes go to the hub directly; journaled writes before them go first."""
        if len(self.journal):
            if not self.online:
                raise BackendUnavailable("the hub is unreachable; only writes are journaled")
            await self._drain()  # a refused write will not commit: nothing to order after

    async def symlink(self, who: Principal, path: str, target: str) -> Entry:
        path = self._inside(path)
        await self._in_order()
        return await self.hub.symlink(who, path, target)

    async def mknod(self, who: Principal, path: str, mode: int, rdev: int = 0) -> Entry:
        path = self._inside(path)
        await self._in_order()
        return await self.hub.mknod(who, path, mode, rdev)

    async def link(self, who: Principal, src: str, dst: str) -> Entry:
        src, dst = self._inside(src), self._inside(dst)
        await self._in_order()
        entry = await self.hub.link(who, src, dst)
        self._forget(src, self.seq)  # its link count moved
        return entry

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
        path = self._inside(path)
        await self._in_order()
        entry = await self.hub.set_attrs(
            who, path, mode=mode, uid=uid, gid=gid, mtime_ns=mtime_ns, atime_ns=atime_ns
        )
        self._forget(path, self.seq)  # a new mtime may be a new version
        return entry

    async def rename(self, who: Principal, src: str, dst: str, *, overwrite: bool = False) -> Entry:
        src, dst = self._inside(src), self._inside(dst)
        await self._in_order()
        entry = await self.hub.rename(who, src, dst, overwrite=overwrite)
        for gone in (src, dst):
            self.cache.invalidate(gone, below=True)
            self._forget(gone, self.seq, below=True)
        return entry

    async def remove(
        self, who: Principal, path: str, *, recursive: bool = False, if_version: int | None = None
    ) -> None:
        path = self._inside(path)
        await self._in_order()
        await self.hub.remove(who, path, recursive=recursive, if_version=if_version)
        self.cache.invalidate(path, below=True)
        self._forget(path, self.seq, below=True)

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


class _UntilEvicted(ByteSource):
    """A read of the cache that stops once a placement eviction covering its path lands
    (a policy no longer lets this site hold it): at its next chunk, or, for a consumer of
    the file region, when the read is verified. The descriptors it holds would otherwise
    go on serving a file the cache has already dropped."""

    def __init__(self, source: ByteSource, spoke: SpokeNamespace, path: str, seq: int) -> None:
        self.source, self.spoke, self.path, self.seq = source, spoke, path, seq
        self.length, self.region = source.length, source.region

    def _check(self) -> None:
        if self.spoke._evicted_since(self.path, self.seq):
            raise PermissionDenied(
                f"{self.path} was evicted by a placement policy while it was read",
                path=self.path,
            )

    async def chunks(self) -> AsyncIterator[bytes]:
        async for chunk in self.source.chunks():
            self._check()
            yield chunk

    async def verify(self) -> None:
        self._check()
        await self.source.verify()

    async def aclose(self) -> None:
        await self.source.aclose()


async def _first_done(tasks: set[asyncio.Task[None]]) -> set[asyncio.Task[None]]:
    """Wait for one of ``tasks`` to end; re-raise its error; the ones still running."""
    done, running = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for task in done:
        task.result()
    return running
