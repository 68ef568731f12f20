"""The inode table of a FUSE mount (protocol layer): stable numbers for namespace paths.

The kernel names files by inode number; the namespace by path. Numbers are handed out
from a counter, so a number the kernel still holds never silently points at another file.
A node lives while the kernel holds lookups on it or a file handle is open on it;
``forget`` and the last ``release`` drop it. The number of a dropped node is remembered
with its path and volume inode: when the kernel looks the same file up again (after a
name was invalidated, say) it gets the same number, as on a local file system.

The names of a hard-linked file share one node, so one inode number, as on a local file
system (tools compare st_ino; the kernel then keeps one set of attributes and pages for
the file). The node calls the namespace with one of its names, ``path``; ``aliases``
holds the others the kernel was told of.

A name whose kind changed (a directory and a symlink swapped by renames elsewhere) is
another file: it gets a new node, and the old one lives on, unlinked, until forgotten.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from ... import paths
from ...core.types import Entry, Principal
from .abi import ROOT_INODE

if TYPE_CHECKING:
    from .files import WriteBuffer

#: dropped nodes whose numbers are remembered for their files (oldest forgotten first)
RETIRED_MAX = 1 << 16


@dataclass(slots=True)
class Passthrough:
    """The backing file the kernel reads a node's open handles from (``Session``)."""

    backing_id: int
    #: the version whose bytes the backing file holds
    version: int
    handles: int = 0


class ListedTags(NamedTuple):
    """A file's tags as a listing for ``who`` carried them, standing until ``until``
    (monotonic)."""

    who: Principal
    until: float
    tags: Mapping[str, str]


@dataclass(slots=True, eq=False)
class Node:
    ino: int
    path: str
    entry: Entry | None = None
    #: the other names of a hard-linked file that the kernel knows this node by
    aliases: set[str] = field(default_factory=set)
    #: the volume inode this node is found by for the file's other names (see ``learn``)
    linked_inode: int | None = None
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
    #: the file's tags as its directory's last listing said them, for its caller alone
    #: and until its attributes' lifetime ends: its extended attributes are answered
    #: from them without a round trip
    listed_tags: ListedTags | None = None
    #: the backing file of the handles the kernel reads itself, while any is open
    passthrough: Passthrough | None = None
    #: made through this mount and not in the namespace yet: a create deferred to the
    #: file's first commit (``LoomOperations.defer_creates``)
    pending: bool = False


class InodeTable:
    def __init__(self) -> None:
        root = Node(ROOT_INODE, paths.ROOT, lookups=1)
        self._by_ino: dict[int, Node] = {ROOT_INODE: root}
        self._by_path: dict[str, Node] = {paths.ROOT: root}
        self._next = ROOT_INODE + 1
        #: (path, volume inode) -> the number its dropped node had
        self._retired: dict[tuple[str, int], int] = {}
        #: volume inode -> the live node of a file with several names
        self._linked: dict[int, Node] = {}

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
        if node is not None and (
            (node.aliases and node.linked_inode != entry.inode) or not same_kind(node, entry)
        ):
            # another file now has this name of a hard-linked one, or something of another
            # kind has the name (renamed or replaced elsewhere): a node of its own. The
            # kernel treats a known inode number coming back with another file type as a
            # corrupt inode (EIO on every use until its name expires).
            self._detach(node, entry.path)
            node = None
        if node is None:
            node = self._other_name(entry)
            if node is not None:
                node.aliases.add(entry.path)
                self._by_path[entry.path] = node
        if node is None:
            ino = None
            if entry.inode is not None:
                ino = self._retired.pop((entry.path, entry.inode), None)
            if ino is None or ino in self._by_ino:  # a number given out again since
                ino, self._next = self._next, self._next + 1
            node = Node(ino, entry.path)
            self._by_ino[node.ino] = node
            self._by_path[entry.path] = node
        node.entry = entry
        node.lookups += lookups
        if entry.nlink > 1 and node.linked_inode is None and not node.unlinked:
            self._index(node, entry)
        return node

    def _index(self, node: Node, entry: Entry) -> None:
        """Let the file's other names find ``node`` when the kernel meets them."""
        if entry.inode is not None and entry.inode not in self._linked:
            node.linked_inode = entry.inode
            self._linked[entry.inode] = node

    def _other_name(self, entry: Entry) -> Node | None:
        """The live node of the file ``entry`` is another name of, if the kernel has one."""
        if entry.nlink <= 1 or entry.inode is None or entry.is_dir:
            return None
        node = self._linked.get(entry.inode)
        if node is None or not _same_file(node.entry, entry):
            return None
        return node

    def created(self, entry: Entry) -> Node:
        """A new entry made through this mount: learned, and its directory changed."""
        node = self.learn(entry)
        self.touched(node)
        self.listing_changed(paths.split(entry.path)[0])
        if entry.is_dir:
            self._recount(paths.split(entry.path)[0])
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
            self._unindex(node)
            inode = node.entry.inode if node.entry is not None else None
            for path in (node.path, *node.aliases):
                if self._by_path.get(path) is node:
                    del self._by_path[path]
                    if inode is not None:
                        self._retire((path, inode), node.ino)

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

    def _recount(self, directory: str) -> None:
        """A subdirectory came or went: the directory's link count is the catalog's to
        say, so the mount's own record of it stops standing in (``current_until``)."""
        node = self._by_path.get(directory)
        if node is not None:
            node.current_until = 0.0

    @staticmethod
    def _may_be_dir(node: Node | None) -> bool:
        return node is None or node.entry is None or node.entry.is_dir

    def unlinked(self, path: str) -> Node | None:
        """The path is gone; its node (if any) lives on for the kernel's open handles."""
        node = self._by_path.get(path)
        if node is not None:
            self._detach(node, path)
        self.touched(node)
        self.listing_changed(paths.split(path)[0])
        if self._may_be_dir(node):
            self._recount(paths.split(path)[0])
        return node

    def replaced(self, node: Node) -> None:
        """The node keeps serving its open handles, and its path gets a new node at the
        next lookup; unlike ``unlinked``, the name and its directory did not change."""
        self._detach(node, node.path)

    def moved(self, src: str, dst: str) -> None:
        """A rename: the node at ``src`` and every node below it now live under ``dst``."""
        self.unlinked(dst)
        moving = self._by_path.get(src)
        self.touched(moving)
        self.listing_changed(paths.split(src)[0])
        if self._may_be_dir(moving):
            self._recount(paths.split(src)[0])
            self._recount(paths.split(dst)[0])
        # a scan over the table: renames are rare next to lookups, and the table holds
        # only what the kernel currently knows
        for path in [p for p in self._by_path if paths.is_within(p, src)]:
            node = self._by_path.pop(path)
            new = dst + path[len(src) :]
            if node.path == path:
                node.path = new
            else:  # another name of a hard-linked file moved
                node.aliases.discard(path)
                node.aliases.add(new)
            self._by_path[new] = node

    def _detach(self, node: Node, path: str) -> None:
        """``path`` no longer names the node's file. The node goes on under another of
        its names if it has one; otherwise it lives on, unlinked, for its open handles."""
        del self._by_path[path]
        if path in node.aliases:
            node.aliases.discard(path)
        elif node.aliases:
            node.path = node.aliases.pop()
        else:
            node.unlinked = True
            self._unindex(node)

    def _unindex(self, node: Node) -> None:
        if node.linked_inode is not None:
            del self._linked[node.linked_inode]
            node.linked_inode = None


def same_kind(node: Node, entry: Entry) -> bool:
    """Whether ``entry`` may still be the file the kernel knows as ``node``: an inode
    never changes its file type."""
    return node.entry is None or node.entry.kind is entry.kind


def _same_file(known: Entry | None, entry: Entry) -> bool:
    """Whether ``entry`` is another name of the hard-linked file ``known``: the volume's
    inode number alone may repeat across volumes, so the file's size and mtime, which its
    names share, must match too."""
    return (
        known is not None
        and known.nlink > 1
        and entry.nlink > 1
        and known.inode == entry.inode
        and known.size == entry.size
        and known.mtime_ns == entry.mtime_ns
        and known.kind is entry.kind
    )
