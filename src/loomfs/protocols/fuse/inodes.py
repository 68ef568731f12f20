"""The inode table of a FUSE mount (protocol layer): stable numbers for namespace paths.

The kernel names files by inode number; the namespace by path. Numbers are handed out
from a counter, so a number the kernel still holds never silently points at another file.
A node lives while the kernel holds lookups on it or a file handle is open on it;
``forget`` and the last ``release`` drop it. The number of a dropped node is remembered
with its path and volume inode: when the kernel looks the same file up again (after a
name was invalidated, say) it gets the same number, as on a local file system.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ... import paths
from ...core.types import Entry

if TYPE_CHECKING:
    from .files import WriteBuffer

ROOT_INODE = 1
#: dropped nodes whose numbers are remembered for their files (oldest forgotten first)
RETIRED_MAX = 1 << 16


@dataclass(slots=True, eq=False)
class Node:
    ino: int
    path: str
    entry: Entry | None = None
    lookups: int = 0
    opens: int = 0
    #: the content version whose pages the kernel may hold in its page cache
    cached_version: int | None = None
    #: the path is gone (unlinked or replaced) but open handles still use the node
    unlinked: bool = False
    #: when a change made through this mount last touched the node's status (ns): the
    #: catalog keeps no ctime
    changed_ns: int = 0
    #: when this mount last changed the directory's listing (ns): a directory's own mtime
    #: reaches the catalog only when the hub notices the change
    listing_changed_ns: int = 0
    #: the new content while the file is open for writing
    buffer: WriteBuffer | None = None
    #: until when (monotonic) ``entry`` may stand for the site's: it came from the site,
    #: and the change feed has said nothing of it since
    current_until: float = 0.0


class InodeTable:
    def __init__(self) -> None:
        root = Node(ROOT_INODE, paths.ROOT, lookups=1)
        self._by_ino: dict[int, Node] = {ROOT_INODE: root}
        self._by_path: dict[str, Node] = {paths.ROOT: root}
        self._next = ROOT_INODE + 1
        #: (path, volume inode) -> the number its dropped node had
        self._retired: dict[tuple[str, int], int] = {}

    def __len__(self) -> int:
        return len(self._by_ino)

    def get(self, ino: int) -> Node | None:
        return self._by_ino.get(ino)

    def by_path(self, path: str) -> Node | None:
        return self._by_path.get(path)

    def learn(self, entry: Entry, lookups: int = 1) -> Node:
        """The node for an entry the kernel is about to be told of (lookup, readdirplus,
        create, mkdir): each such reply adds one lookup the kernel will later forget."""
        node = self._by_path.get(entry.path)
        if node is None:
            ino = None
            if entry.inode is not None:
                ino = self._retired.pop((entry.path, entry.inode), None)
            if ino is None:
                ino, self._next = self._next, self._next + 1
            node = Node(ino, entry.path)
            self._by_ino[node.ino] = node
            self._by_path[entry.path] = node
        node.entry = entry
        node.lookups += lookups
        return node

    def created(self, entry: Entry) -> Node:
        """A new entry made through this mount: learned, and its directory changed."""
        node = self.learn(entry)
        self.touched(node)
        self.listing_changed(paths.split(entry.path)[0])
        return node

    def forget(self, ino: int, count: int) -> None:
        node = self._by_ino.get(ino)
        if node is None or ino == ROOT_INODE:
            return
        node.lookups = max(0, node.lookups - count)
        self._drop_if_unused(node)

    def closed(self, node: Node) -> None:
        node.opens -= 1
        self._drop_if_unused(node)

    def _drop_if_unused(self, node: Node) -> None:
        if node.lookups == 0 and node.opens == 0:
            del self._by_ino[node.ino]
            if self._by_path.get(node.path) is node:
                del self._by_path[node.path]
                if node.entry is not None and node.entry.inode is not None:
                    self._retire((node.path, node.entry.inode), node.ino)

    def _retire(self, key: tuple[str, int], ino: int) -> None:
        self._retired[key] = ino
        if len(self._retired) > RETIRED_MAX:
            del self._retired[next(iter(self._retired))]

    @staticmethod
    def touched(node: Node | None) -> None:
        if node is not None:
            node.changed_ns = time.time_ns()

    def listing_changed(self, directory: str) -> None:
        node = self._by_path.get(directory)
        if node is not None:
            node.changed_ns = node.listing_changed_ns = time.time_ns()

    def unlinked(self, path: str) -> Node | None:
        """The path is gone; its node (if any) lives on for the kernel's open handles."""
        node = self._by_path.pop(path, None)
        if node is not None:
            node.unlinked = True
        self.touched(node)
        self.listing_changed(paths.split(path)[0])
        return node

    def moved(self, src: str, dst: str) -> None:
        """A rename: the node at ``src`` and every node below it now live under ``dst``."""
        self.unlinked(dst)
        self.touched(self._by_path.get(src))
        self.listing_changed(paths.split(src)[0])
        # a scan over the table: renames are rare next to lookups, and the table holds
        # only what the kernel currently knows
        for path in [p for p in self._by_path if paths.is_within(p, src)]:
            node = self._by_path.pop(path)
            node.path = dst + path[len(src) :]
            self._by_path[node.path] = node
