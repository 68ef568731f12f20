"""Listings that send only what changed (namespace layer): a held copy and its delta.

Issue 18. A spoke that holds a directory's listing asks its hub with what identifies its
copy: the feed position it was listed at (every change up to it is in the copy) and a
digest of its entries. The hub lists the directory as the caller (authorized and audited
as any listing), reads its change log after that position, and answers the entries whose
names a change touched since, the names gone, and the digest of the whole listing; an
answer with neither is "unchanged". A change the log can't pin to names of the directory
(the directory or one above it moved or removed, or a log too long to read) makes the
answer the whole listing.

What the log does not carry is caught by the digest: the holder applies the answer and
compares; a mismatch (an access rule changed, a change committed while the hub listed)
costs one plain listing, never a wrong one. The digest leaves out access and status-change
times, which the catalog records without a change (reads move them; spokes need not hear
of it, ``core.catalog.Put``): a held listing may show older ones, as a stat at a spoke may.

A walk asks for a whole tree at once (``listed_tree``, ``tree_deltas``): every directory
listed as the caller, as one listing is, in the order a walk meets them, each answered as
above against the copy held of it (a whole listing where none is), from one read of the
log: one request where a walk made one per directory (about 600 bytes each over TLS).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from .. import paths
from ..core.types import Change, ChangeOp, Entry
from ..errors import LoomError

#: changes of the log a hub reads for one delta, at most: past that, the whole listing is
#: about as cheap and surely right
LOG_MAX = 50_000
#: entries of one tree's listings a hub answers, at most: past that a holder asks again
#: for the directories not reached (a tree's listings are held whole at the hub)
TREE_MAX = 100_000
# an entry as the digest sees it: every field but the row id and the unlogged times
_FIELDS = tuple(
    f.name for f in dataclasses.fields(Entry) if f.name not in ("id", "atime_ns", "ctime_ns")
)


@dataclass(frozen=True, slots=True)
class ListingDelta:
    """A hub's answer to a held listing: ``full`` says ``entries`` is the whole listing;
    else ``entries`` are those changed or new since the holder's copy and ``gone`` the
    names no longer there. ``digest`` is the whole listing's, to check the result by."""

    digest: str
    full: bool
    entries: list[Entry] = field(default_factory=list)
    gone: list[str] = field(default_factory=list)

    @property
    def unchanged(self) -> bool:
        return not self.full and not self.entries and not self.gone


def digest(entries: Iterable[Entry]) -> str:
    """What identifies a listing: its entries in name order, but for unlogged times."""
    h = hashlib.blake2b(digest_size=16)  # the standard library's: a plain install lists
    for entry in sorted(entries, key=lambda e: e.name):
        h.update(json.dumps([getattr(entry, f) for f in _FIELDS]).encode() + b"\n")
    return h.hexdigest()


def changed_names(directory: str, changes: Iterable[Change]) -> set[str] | None:
    """The names of ``directory``'s entries that ``changes`` touched, or None where one
    changes more than names there (the directory itself, or one above it, moved, removed
    or made again: its listing may be another directory's now). A directory's own
    attribute changes leave its listing as it is."""
    names: set[str] = set()
    for change in changes:
        for path in (change.path, change.new_path):
            if path is None:
                continue
            if paths.is_within(directory, path):
                own = path == directory == change.path
                if not (own and change.op in (ChangeOp.META, ChangeOp.MODIFY)):
                    return None
            elif path != paths.ROOT and paths.split(path)[0] == directory:
                names.add(paths.split(path)[1])
    return names


def delta(
    directory: str,
    listing: Sequence[Entry],
    changes: Sequence[Change] | None,
    held: str | None,
) -> ListingDelta:
    """The answer to a holder of ``directory``'s listing with digest ``held``, from the
    current ``listing`` and the log's ``changes`` since the holder's position, read after
    the listing (so every change the listing shows is among them); None: too long."""
    now = digest(listing)
    if held == now:
        return ListingDelta(now, full=False)
    names = None if changes is None else changed_names(directory, changes)
    if names is None:
        return ListingDelta(now, full=True, entries=list(listing))
    present = {entry.name for entry in listing}
    return ListingDelta(
        now,
        full=False,
        entries=[entry for entry in listing if entry.name in names],
        gone=sorted(names - present),
    )


def applied(held: Mapping[str, Entry], answer: ListingDelta) -> dict[str, Entry] | None:
    """The listing ``answer`` makes of the ``held`` one, by name in name order; None when
    it does not come out as the hub's (the holder then lists the directory whole)."""
    if answer.full:
        out = {entry.name: entry for entry in answer.entries}
    else:
        out = dict(held)
        for name in answer.gone:
            out.pop(name, None)
        out.update((entry.name, entry) for entry in answer.entries)
    if digest(out.values()) != answer.digest:
        return None
    return dict(sorted(out.items()))


class ChangeIndex:
    """The log's changes by the paths they touch: one read of the log answers the deltas
    of every directory of a tree (``tree_deltas``), each from the changes that concern it
    rather than from the whole log."""

    def __init__(self, changes: Iterable[Change]) -> None:
        self._at: dict[str, list[Change]] = defaultdict(list)  # by a path it names
        self._in: dict[str, list[Change]] = defaultdict(list)  # by that path's parent
        for change in changes:
            for path in {change.path, change.new_path} - {None}:
                assert path is not None
                self._at[path].append(change)
                if path != paths.ROOT:
                    self._in[paths.split(path)[0]].append(change)

    def since(self, directory: str, seq: int) -> list[Change]:
        """The changes after ``seq`` that ``changed_names`` sees for ``directory``: of
        it, of a directory above it, or of a name in it."""
        found = [c for at in (directory, *paths.ancestors(directory)) for c in self._at.get(at, ())]
        found += self._in.get(directory, ())
        return [change for change in found if change.seq > seq]


async def listed_tree(
    list_: Callable[[str], AsyncIterator[Entry]], top: str, budget: int
) -> AsyncIterator[tuple[str, list[Entry] | LoomError]]:
    """``top``'s directory and those below it, each with its listing by ``list_`` (as the
    caller lists it), in the order a walk meets them (``Namespace.walk``). A directory
    that fails ends it with its error, as it ends a walk (nothing past it is listed);
    so does going past ``budget`` entries, at the end of a directory: a holder asks
    again for those not reached."""
    pending = [top]
    while pending and budget > 0:
        directory = pending.pop()
        try:
            entries = [entry async for entry in list_(directory)]
        except LoomError as exc:
            yield directory, exc
            return
        budget -= len(entries)
        yield directory, entries
        pending += reversed([entry.path for entry in entries if entry.is_dir])


def tree_deltas(
    listed: Sequence[tuple[str, list[Entry] | LoomError]],
    changes: Sequence[Change] | None,
    held: Mapping[str, tuple[int, str]],
) -> Iterator[tuple[str, ListingDelta | LoomError]]:
    """Each directory of ``listed`` (``listed_tree``) with its answer to the holder of
    the copies ``held`` (directory -> feed position, digest), from the log's
    ``changes`` since the oldest of them, read after the listings (None: too long)."""
    index = None if changes is None else ChangeIndex(changes)
    for directory, entries in listed:
        if isinstance(entries, LoomError):
            yield directory, entries
            continue
        seq, copy = held.get(directory, (0, None))
        if copy is None:  # nothing held: the whole listing, whatever the log says
            yield directory, ListingDelta(digest(entries), full=True, entries=entries)
            continue
        since = None if index is None else index.since(directory, seq)
        yield directory, delta(directory, entries, since, copy)
