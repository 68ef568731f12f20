"""S3 keys over a directory tree (protocol layer): key validation and ordered listing.

An S3 key 'a/b/c' is the file 'c' in the directory 'a/b' below the bucket's directory.
S3 lists keys in byte order of the whole key, while a directory lists names in byte order
of the name: a directory 'a' holds keys 'a/...', which sort after 'a-c' and 'a.txt'
('-' and '.' are below '/'). The walk below therefore holds a directory back until the
first sibling that sorts after 'name/', and streams the tree page by page from the
namespace's paginated ``list``, so a listing of any size uses flat memory.

A folder marker (the key 'a/' that rclone, s3fs and consoles PUT with no body to make a
"folder") is the directory 'a', tagged ``MARKER_TAG``: it lists as an object, before the
keys inside it. A directory without the tag (one a key 'a/b' needed, or one made over
another protocol) is only a prefix, as in S3.
"""

from __future__ import annotations

import heapq
from collections.abc import AsyncIterator
from dataclasses import dataclass

from ...core.types import SPECIAL_KINDS, Entry, Principal
from ...errors import LoomError
from ...namespace.base import Namespace
from .errors import S3Error

MAX_KEY_BYTES = 1024
MARKER_TAG = "s3.marker"  # on a directory: the folder marker 'dir/' was PUT


def check_key(key: str) -> None:
    """Refuse keys that have no faithful path: empty, '.' or '..' components, NUL.

    A namespace path folds '//' and the walk could not list such a key back, so these
    are errors rather than silently different objects (and '..' is how traversal begins).
    """
    if not key:
        raise S3Error("InvalidArgument", "the key must not be empty")
    if len(key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
        raise S3Error("KeyTooLongError", f"keys are at most {MAX_KEY_BYTES} bytes", resource=key)
    parts = key.split("/")
    body = parts[:-1] if key.endswith("/") else parts
    if "\x00" in key or any(p in ("", ".", "..") for p in body):
        raise S3Error(
            "InvalidArgument",
            "keys with empty, '.' or '..' path segments or NUL are not supported",
            resource=key,
        )


@dataclass(frozen=True, slots=True)
class Item:
    """One listing row: an object, or a common prefix (``entry`` None)."""

    key: str
    entry: Entry | None


def _first_below_slash(name: str) -> int:
    return next((i for i, c in enumerate(name) if c < "/"), len(name))


class Lister:
    """Keys under ``root`` (a directory path) after ``after``, matching ``prefix``,
    rolled up at ``delimiter``, in S3 order."""

    def __init__(
        self,
        ns: Namespace,
        who: Principal,
        root: str,
        *,
        prefix: str = "",
        delimiter: str = "",
        after: str | None = None,
    ) -> None:
        self.ns, self.who, self.root = ns, who, root.rstrip("/")
        self.prefix, self.delimiter, self.after = prefix, delimiter, after

    async def items(self) -> AsyncIterator[Item]:
        # start in the deepest directory the prefix names in full
        base = self.prefix[: self.prefix.rfind("/") + 1]
        if any(part in ("", ".", "..") for part in base.split("/")[:-1]):
            return  # no key has such a segment (``check_key``), so none can match
        last_prefix: str | None = None
        try:
            async for item in self._walk(base, self.after):
                if not item.key.startswith(self.prefix):
                    if item.key > self.prefix:
                        return  # sorted: nothing later can match
                    continue
                rolled = self._roll_up(item)
                if rolled.entry is None:
                    if rolled.key == last_prefix or (
                        self.after is not None and rolled.key <= self.after
                    ):
                        continue
                    last_prefix = rolled.key
                yield rolled
        except (FileNotFoundError, NotADirectoryError):
            return  # the prefix names no directory: no keys

    def _roll_up(self, item: Item) -> Item:
        if not self.delimiter:
            return item
        cut = item.key.find(self.delimiter, len(self.prefix))
        if cut < 0:
            return item
        return Item(item.key[: cut + len(self.delimiter)], None)

    def _path(self, rel: str) -> str:
        return self.root + "/" + rel.rstrip("/") if rel else self.root

    async def _walk(self, rel: str, after: str | None) -> AsyncIterator[Item]:
        """Items below directory ``rel`` ('' or 'a/b/') with key > ``after``, in order;
        the directory's own folder marker first."""
        if rel and (after is None or rel > after):
            entry, tags = await self.ns.stat_tags(self.who, self._path(rel))
            if MARKER_TAG in tags:
                yield Item(rel, entry)
        start: str | None = None
        pending: list[tuple[str, str]] = []  # (sort key 'name/', name) of held-back dirs
        if after is not None and after.startswith(rel):
            component = after[len(rel) :].split("/", 1)[0]
            # every name up to this one sorts wholly at or before ``after``, except a
            # directory of exactly this name, whose keys may follow it
            start = component[: _first_below_slash(component)] or None
            if start is not None:
                try:
                    entry = await self.ns.stat(self.who, self._path(rel + start))
                    if entry.is_dir:
                        pending.append((start + "/", start))
                except FileNotFoundError:
                    pass
        elif self.prefix.startswith(rel) and len(self.prefix) > len(rel):
            # names before the prefix's next component cannot match it
            component = self.prefix[len(rel) :].split("/", 1)[0]
            start = component[:-1] or None
        async for entry in self.ns.list(self.who, self._path(rel), start_after=start):
            sort_key = entry.name + "/" if entry.is_dir else entry.name
            while pending and pending[0][0] < sort_key:
                async for item in self._descend(rel, heapq.heappop(pending)[1], after):
                    yield item
            if entry.is_dir:
                heapq.heappush(pending, (sort_key, entry.name))
            elif entry.kind in SPECIAL_KINDS:
                continue  # a fifo, device or socket has no bytes: no object
            elif after is None or rel + entry.name > after:
                try:
                    # a symlink lists as the object a GET of it returns (size, ETag)
                    target = await self.ns.followed(self.who, entry)
                except LoomError:
                    continue  # dangling, looping, or out of reach: no object
                if not target.is_dir:
                    yield Item(rel + entry.name, target)
        while pending:
            async for item in self._descend(rel, heapq.heappop(pending)[1], after):
                yield item

    async def _descend(self, rel: str, name: str, after: str | None) -> AsyncIterator[Item]:
        child = rel + name + "/"
        if after is not None and after >= child and not after.startswith(child):
            return  # the whole subtree sorts before ``after``
        if not child.startswith(self.prefix) and not self.prefix.startswith(child):
            return  # nothing in it can match the prefix
        if (
            self.delimiter == "/"
            and len(child) > len(self.prefix)
            and child.startswith(self.prefix)
        ):
            yield Item(child, None)  # rolled up: no need to look inside
            return
        async for item in self._walk(child, after if after and after.startswith(child) else None):
            yield item
