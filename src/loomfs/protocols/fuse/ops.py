"""FUSE requests as namespace calls (protocol layer): the session's handlers over a Namespace.

Every handler resolves inode numbers to paths through the inode table, calls the
namespace, and maps any error through ``errno_of`` (the one table of this edge). The
kernel page cache is kept across opens while a file's version is unchanged
(``keep_cache``), and dropped on the next open after the version moves, or at once when
the mount follows the change feed (``follow.py``).

With ``defer_creates`` a file created through the mount enters the namespace at its first
commit (flush, fsync or release), content and attributes in one change, instead of as an
empty file at the create and again at the close: decided at the create (refused there,
nothing written), it is a pending file of this mount until then, seen by lookups, stats and
listings through it, and renamed or removed here alone. Other protocols see it at the close.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import pwd
import stat
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, ParamSpec, TypeVar

from ... import paths
from ...core.acl import ADMIN_GROUP, ANONYMOUS
from ...core.streams import aiter_bytes
from ...core.types import KIND_BITS, ChangeOp, Entry, EntryKind, Principal
from ...errors import Conflict, LoomError, NotSupported
from ...namespace.base import Namespace
from .abi import (
    ENOATTR,
    RENAME_EXCHANGE,
    RENAME_NOREPLACE,
    Context,
    EntryAttributes,
    FileInfo,
    FUSEError,
    ReaddirToken,
    SetattrFields,
    StatvfsData,
    readdir_reply,
)
from .files import ReadStream, WriteBuffer
from .follow import OwnChanges
from .inodes import InodeTable, ListedTags, Node, Passthrough, same_kind
from .session import Session

log = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")

#: how long the kernel may trust attributes and names before asking again, unless the
#: mount follows the change feed; a change behind loomfs's back shows on the mount at most
#: this long after the hub records it
CACHE_TIMEOUT = 1.0
#: the I/O size st_blksize suggests to cp, dd and friends
BLOCK_SIZE = 1 << 17
XATTR_USER = b"user."
#: what a listing says of the (most) names that have no tags: one shared, never changed
_NO_TAGS: Mapping[str, str] = MappingProxyType({})


def errno_of(exc: Exception) -> int:
    """The errno a FUSE request fails with: loomfs errors carry theirs, OSErrors come
    from the local temp files; anything else is a bug, reported as EIO and logged."""
    if isinstance(exc, LoomError):
        if type(exc) is not LoomError:
            return exc.errno
    elif isinstance(exc, OSError) and exc.errno:
        return exc.errno
    log.error("FUSE request failed unexpectedly", exc_info=exc)
    return errno.EIO


def translated(fn: Callable[P, Coroutine[Any, Any, R]]) -> Callable[P, Coroutine[Any, Any, R]]:
    """Raise only ``FUSEError`` out of a handler: the session answers it with its errno."""

    @functools.wraps(fn)
    async def handler(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await fn(*args, **kwargs)
        except FUSEError:
            raise
        except Exception as exc:
            if isinstance(exc, Conflict):
                log.warning("FUSE request conflicts with a newer version: %s", exc)
            raise FUSEError(errno_of(exc)) from exc

    return handler


def _fail(code: int) -> FUSEError:
    return FUSEError(code)


def _ownership(entry: Entry, ctx: Context) -> dict[str, int]:
    """The ``set_attrs`` changes that make a new entry the caller's, as a local file system
    would (the hub makes it as whoever runs the hub)."""
    owner = {"uid": ctx.uid, "gid": ctx.gid}
    return {key: value for key, value in owner.items() if getattr(entry, key) != value}


@dataclass(frozen=True, slots=True)
class Callers:
    """Who calls a mount, and who decides what they may do.

    ``uid_map`` names the loomfs user of a uid; ``mapped_only``: a uid it does not name
    is no one in particular (the caller without credentials, ``anonymous``), root too,
    as for a mount that serves another server's sessions (SMB), whose own uids are not
    users. ``kernel_checks``: the kernel
    checks mode bits before a request reaches loomfs (``default_permissions``); without,
    the namespace alone decides, and the modes reported are open to all, so that a server
    checking modes itself (Samba) leaves the decision to the namespace too."""

    uid_map: Mapping[int, str] = field(default_factory=dict)
    protocol: str = "fuse"
    site: str = "local"
    mapped_only: bool = False
    kernel_checks: bool = True
    #: who root's lookups and stats run as, where that is not root's principal: smbd
    #: resolves each share's path as root before it becomes the user, and a share may be
    #: a private directory
    resolver: Principal | None = None


#: the mode bits a mount without kernel checks adds to what it reports
_OPEN_DIR, _OPEN_FILE = 0o777, 0o666


@dataclass(slots=True, eq=False)
class FileHandle:
    node: Node
    who: Principal
    version: int
    stream: ReadStream | None = None
    #: the kernel reads this handle from the node's backing file itself
    passthrough: bool = False


@dataclass(slots=True, eq=False)
class DirHandle:
    node: Node
    who: Principal
    #: readdir position id -> the name to resume after
    cursors: dict[int, str] = field(default_factory=dict)
    last_id: int = 0
    listing: AsyncIterator[Entry] | None = None
    pending: Entry | None = None
    #: the tags of the names in the directory that have any (None: unknown) and until
    #: when (monotonic) that stands
    tagged: dict[str, dict[str, str]] | None = None
    tagged_until: float = 0.0


class LoomOperations:
    """The handlers the FUSE session (``session.py``) calls, one per request kind."""

    def __init__(
        self,
        ns: Namespace,
        kernel: Session,
        spool_dir: str,
        cache_timeout: float = CACHE_TIMEOUT,
        *,
        following: bool = False,
        callers: Callers | None = None,
        defer_creates: bool = False,
    ) -> None:
        self.ns = ns
        #: files created here enter the namespace at their first commit (see the module)
        self.defer_creates = defer_creates
        #: the nodes of those files until then
        self._pending: set[Node] = set()
        self.kernel = kernel
        self.cache_timeout = cache_timeout
        #: the change feed is followed (``follow.py``): what it has not flagged is current
        self.following = following
        self.spool_dir = spool_dir
        self.callers = callers or Callers()
        self.inodes = InodeTable()
        #: what this mount changed, for the change feed's follower to pass over
        self.own = OwnChanges()
        self._files: dict[int, FileHandle] = {}
        self._dirs: dict[int, DirHandle] = {}
        self._next_fh = 1
        self._principals: dict[int, Principal] = {}

    # -- helpers ---------------------------------------------------------------------------

    def who(self, ctx: Context) -> Principal:
        """The principal for the calling uid: ``--uid-map`` first, then the local user name.
        An unmapped root is the administrator of the machine the mount runs on (it can
        read and make device nodes on the volume's disk anyway), and so group admin;
        under ``Callers.mapped_only`` neither holds."""
        principal = self._principals.get(ctx.uid)
        if principal is None:
            callers = self.callers
            name = callers.uid_map.get(ctx.uid)
            groups: frozenset[str] = frozenset()
            if name is None and callers.mapped_only:
                name = ANONYMOUS
            elif name is None:
                try:
                    name = pwd.getpwuid(ctx.uid).pw_name
                except KeyError:
                    name = f"uid:{ctx.uid}"
                if ctx.uid == 0:
                    groups = frozenset({ADMIN_GROUP})
            principal = Principal(
                user=name, groups=groups, site=callers.site, protocol=callers.protocol
            )
            self._principals[ctx.uid] = principal
        return principal

    def resolving(self, ctx: Context) -> Principal:
        """The principal of a lookup or stat (see ``Callers.resolver``)."""
        resolver = self.callers.resolver
        return resolver if resolver is not None and ctx.uid == 0 else self.who(ctx)

    def remap(self, uid_map: Mapping[int, str]) -> None:
        """Callers' uids name these users from now on (the registry changed)."""
        self.callers = replace(self.callers, uid_map=dict(uid_map))
        self._principals.clear()

    def _node(self, ino: int) -> Node:
        node = self.inodes.get(ino)
        if node is None:
            raise _fail(errno.ESTALE)
        return node

    def _child(self, parent_ino: int, name: bytes) -> str:
        if len(name) > paths.MAX_NAME_BYTES:
            raise _fail(errno.ENAMETOOLONG)
        try:
            text = name.decode()
        except UnicodeDecodeError:
            raise _fail(errno.EINVAL) from None
        return paths.join(self._node(parent_ino).path, text)

    def _fh(self) -> int:
        fh, self._next_fh = self._next_fh, self._next_fh + 1
        return fh

    def attrs(self, node: Node) -> EntryAttributes:
        entry = node.entry
        assert entry is not None
        out = EntryAttributes()
        out.st_ino = node.ino
        out.entry_timeout = self.cache_timeout
        # the names of a hard-linked file share this node, but a name seen while its
        # catalog row lagged behind a change gets a node of its own (see InodeTable):
        # a change through one must show at once through the others, so no caching.
        # A directory's count is of its subdirectories: it has one node whatever it is.
        hard_linked = entry.nlink > 1 and not entry.is_dir
        out.attr_timeout = 0 if hard_linked else self.cache_timeout
        pending = node.buffer.pending if node.buffer is not None else {}
        out.st_mode = KIND_BITS[entry.kind] | pending.get("mode", stat.S_IMODE(entry.mode))
        if not self.callers.kernel_checks:
            out.st_mode |= _OPEN_DIR if entry.is_dir else _OPEN_FILE
        if node.unlinked:
            # open, but this name is gone: one link less (none for a directory)
            out.st_nlink = 0 if entry.is_dir else max(entry.nlink - 1, 0)
        else:
            # a directory's count comes from the namespace's stat (2 + subdirectories);
            # a volume without directory rows of its own (S3) has 1 there
            out.st_nlink = max(entry.nlink, 2) if entry.is_dir else entry.nlink
        out.st_rdev = entry.rdev or 0
        out.st_uid, out.st_gid = pending.get("uid", entry.uid), pending.get("gid", entry.gid)
        mtime_ns = entry.mtime_ns
        if node.buffer is not None:
            size = node.buffer.size()
            if node.buffer.generation:  # written to: a buffer only opened changes no time
                mtime_ns = max(mtime_ns, node.buffer.mtime_ns)
        elif entry.kind is EntryKind.SYMLINK:
            size = len(os.fsencode(entry.link_target or ""))
        else:
            size = entry.size
        out.st_size = size
        out.st_blksize = BLOCK_SIZE
        out.st_blocks = (size + 511) // 512
        if entry.is_dir:
            mtime_ns = max(mtime_ns, node.listing_changed_ns)
        mtime_ns = pending.get("mtime_ns", mtime_ns)
        out.st_mtime_ns = mtime_ns
        atime_ns = mtime_ns if entry.atime_ns is None else entry.atime_ns
        out.st_atime_ns = pending.get("atime_ns", atime_ns)
        if entry.ctime_ns is None or entry.is_dir:
            # the volume keeps no ctime (S3), or a directory's moved with changes in it
            # that reach the catalog only when the hub notices them: this mount's own
            # changes stand in
            out.st_ctime_ns = max(mtime_ns, node.changed_ns, entry.ctime_ns or 0)
        elif node.buffer is not None:
            out.st_ctime_ns = max(mtime_ns, entry.ctime_ns)  # unsaved writes changed it
        else:
            out.st_ctime_ns = entry.ctime_ns
        return out

    def _learned(self, entry: Entry) -> EntryAttributes:
        node = self.inodes.learn(entry)
        self._fetched(node)
        return self.attrs(node)

    def _still(self, node: Node, entry: Entry) -> Entry:
        """``entry``, just read at ``node``'s path, if it can still be the node's file.
        Something of another kind has the name now (renamed or replaced elsewhere, and the
        feed has yet to tell the kernel): answered with another file type, the kernel
        would take its inode for corrupt (EIO). The name gets a new node instead, and the
        request fails ESTALE, which the kernel's path walk answers by looking the name up
        again and retrying once (stat, readlink, open)."""
        if same_kind(node, entry):
            return entry
        if self.inodes.by_path(node.path) is node:
            self.inodes.replaced(node)
        raise _fail(errno.ESTALE)

    def _fetched(self, node: Node) -> None:
        """``node.entry`` was just read from the site: it stands for as long as the kernel
        may cache it (a change the feed does not log, an atime, shows no later than there)."""
        node.current_until = time.monotonic() + self.cache_timeout

    def _created(self, entry: Entry) -> EntryAttributes:
        return self.attrs(self._made(entry))

    def _made(self, entry: Entry) -> Node:
        self.own.note(ChangeOp.CREATE, entry.path, entry.version)
        return self.inodes.created(entry)

    async def _owned(
        self, who: Principal, entry: Entry, ctx: Context, mode: int | None = None
    ) -> Entry:
        """A new entry gets the caller as owner (and ``mode``)."""
        changes = _ownership(entry, ctx)
        if mode is not None and stat.S_IMODE(entry.mode) != mode:
            changes["mode"] = mode
        return await self.ns.set_attrs_owning(who, entry.path, changes) if changes else entry

    async def _buffer(
        self, node: Node, who: Principal, version: int, *, empty: bool
    ) -> WriteBuffer:
        """The node's write buffer, made on the first change: a copy of the content at
        ``version``, or empty when the change is a truncation to zero anyway."""
        if node.buffer is None:
            if empty:
                node.buffer = WriteBuffer(self.spool_dir, version)
            else:
                node.buffer = await WriteBuffer.load(
                    self.ns, who, node.path, version, self.spool_dir
                )
        return node.buffer

    async def _commit(self, node: Node, who: Principal) -> None:
        """Write the buffer to the namespace, atomically, if the file is still at the
        version the buffer started from; otherwise fail with Conflict (ESTALE), never
        overwrite a change made elsewhere. Then the attributes set meanwhile."""
        buffer = node.buffer
        if buffer is None or not (buffer.unsaved or node.pending):
            return
        async with buffer.commit_lock:
            generation = buffer.generation
            if node.unlinked:
                # an unlinked file's data dies with its last handle, as on a local disk
                buffer.committed_generation = generation
                buffer.pending.clear()
                return
            content = buffer.dirty or node.pending
            both = content and bool(buffer.pending) and self.ns.writes_attrs(node.path)
            if content:
                await self._save_content(node, who, buffer, generation, with_attrs=both)
            if buffer.pending:
                await self._save_attrs(node, who, buffer)

    async def _save_content(
        self,
        node: Node,
        who: Principal,
        buffer: WriteBuffer,
        generation: int,
        *,
        with_attrs: bool,
    ) -> None:
        """The bytes; ``with_attrs``: with the attributes set meanwhile, in one change (a
        Samba put sets the mode and the write time before its close). A pending file is
        made by it (exclusive: a name taken meanwhile elsewhere is not overwritten)."""
        pending, buffer.pending = (buffer.pending, {}) if with_attrs else ({}, buffer.pending)
        creating = node.pending
        base = None if creating else buffer.base_version
        mode = buffer.pending.get("mode") if creating else None
        try:
            if with_attrs:
                entry = await self.ns.write_with_attrs(
                    who,
                    node.path,
                    buffer.body(),
                    if_version=base,
                    attrs=pending,
                    owner_optional=True,
                    exclusive=creating,
                )
            else:
                entry = await self.ns.write(
                    who, node.path, buffer.body(), if_version=base, exclusive=creating, mode=mode
                )
        except BaseException as exc:
            buffer.pending = {**pending, **buffer.pending}
            if not isinstance(exc, Conflict):
                raise
            log.warning(
                "not saved: %s changed elsewhere since version %d was opened for writing",
                node.path,
                buffer.base_version,
            )
            raise
        buffer.committed_generation = generation
        buffer.base_version = entry.version
        if creating:
            self._created_now(node, entry)
            if mode is not None and buffer.pending.get("mode") == mode:
                del buffer.pending["mode"]  # the write gave it
        node.entry = entry
        # the kernel's pages hold exactly what was written through it
        node.cached_version = entry.version
        self.inodes.touched(node)

    async def _save_attrs(self, node: Node, who: Principal, buffer: WriteBuffer) -> None:
        # after the content: the write itself sets the file's mtime
        pending, buffer.pending = buffer.pending, {}
        before = buffer.base_version
        try:
            node.entry = await self.ns.set_attrs_owning(who, node.path, pending)
        except BaseException:
            buffer.pending = {**pending, **buffer.pending}
            raise
        self._moved_on(node, before)
        self.inodes.touched(node)

    def _moved_on(self, node: Node, before: int) -> None:
        """``node``'s attributes were set, which can make a new version (a new mtime on a
        posix volume): the same bytes, so what was at ``before`` goes on from it, as it
        was this mount's change, not someone else's (the kernel's pages, unsaved writes,
        and the handles open on it: a write through one after a utime loads that
        version)."""
        assert node.entry is not None
        after = node.entry.version
        if node.cached_version == before:
            node.cached_version = after
        if node.buffer is not None and node.buffer.base_version == before:
            node.buffer.base_version = after  # unsaved writes go on from it
        for handle in self._files.values():
            if handle.node is node and handle.version == before:
                handle.version = after

    async def _create_file(self, who: Principal, path: str, mode: int, ctx: Context) -> Entry:
        # Always exclusive: the kernel asks to create only after a lookup found nothing,
        # so an existing file here was made by someone else meanwhile and must not be
        # truncated behind their back.
        return await self.ns.write(
            who, path, aiter_bytes(b""), exclusive=True, mode=stat.S_IMODE(mode) & ~ctx.umask
        )

    async def _create_now(self, node: Node, who: Principal) -> None:
        """Make a pending file in the namespace before a change that needs it there."""
        if node.pending:
            await self._commit(node, who)

    async def _deferring(self, who: Principal, path: str, mode: int) -> bool:
        """Whether the create of ``path`` waits for the file's first commit: it is
        decided now, as its write would be, writing nothing. Where the namespace can't
        decide beforehand, the file is made now."""
        if not self.defer_creates:
            return False
        try:
            await self.ns.authorize_create(who, path, mode)
        except NotSupported:
            return False
        return True

    def _pending_file(self, path: str, mode: int, ctx: Context) -> Node:
        """The node of a file whose create waits for its first commit: empty, the
        caller's, with its mode and owner kept for that commit."""
        now = time.time_ns()
        entry = Entry(path, EntryKind.FILE, 0, now, mode, ctx.uid, ctx.gid, version=0,
                      atime_ns=now, ctime_ns=now)  # fmt: skip
        node = self.inodes.created(entry)
        node.pending = True
        node.cached_version = 0
        self._pending.add(node)
        node.buffer = WriteBuffer(self.spool_dir, 0)
        node.buffer.pending.update(mode=mode, uid=ctx.uid, gid=ctx.gid)
        return node

    def _created_now(self, node: Node, entry: Entry) -> None:
        """A pending file's first commit made it in the namespace."""
        node.pending = False
        self._pending.discard(node)
        self.own.note(ChangeOp.CREATE, entry.path, entry.version)

    def _pending_at(self, path: str) -> Node | None:
        node = self.inodes.by_path(path)
        return node if node is not None and node.pending and node.path == path else None

    def _drop_pending(self, node: Node) -> None:
        """A pending file's name is gone before it reached the namespace: nothing is
        written for it, its handles read and write what they hold, as an unlinked file's."""
        self._pending.discard(node)
        if not node.unlinked:
            self.inodes.unlinked(node.path)

    def _closed(self, node: Node) -> None:
        if node.opens == 1 and node.pending:
            self._drop_pending(node)  # its commit failed: the file was never made
        self.inodes.closed(node)
        if node.opens == 0 and node.buffer is not None:
            node.buffer.close()
            node.buffer = None

    # -- names and attributes --------------------------------------------------------------

    @translated
    async def lookup(self, parent_inode: int, name: bytes, ctx: Context) -> EntryAttributes:
        if name == b".":
            path = self._node(parent_inode).path
        elif name == b"..":
            path = paths.split(self._node(parent_inode).path)[0]
        else:
            path = self._child(parent_inode, name)
        who = self.resolving(ctx)
        pending = self._pending_at(path)
        if pending is not None:
            # every caller of the mount sees it, as the rules would let them see the file
            if not await self.ns.visible(who, path):
                raise _fail(errno.EACCES)
            pending.lookups += 1
            return self.attrs(pending)
        return self._learned(await self.ns.stat(who, path))

    @translated
    async def forget(self, inode_list: Sequence[tuple[int, int]]) -> None:
        for ino, count in inode_list:
            self.inodes.forget(ino, count)

    @translated
    async def getattr(self, inode: int, ctx: Context) -> EntryAttributes:
        node = self._node(inode)
        if node.unlinked or node.pending:
            return self.attrs(node)
        entry = node.entry
        current = time.monotonic() < node.current_until
        if self.following and current and entry is not None and entry.is_dir:
            # The kernel drops a directory's attributes whenever a name in it is made or
            # removed, and then asks before each lookup in it (the permission check): the
            # mount's own changes are in ``attrs`` already (listing_changed_ns), anyone
            # else's would have been flagged by the feed.
            return self.attrs(node)
        node.entry = self._still(node, await self.ns.stat(self.resolving(ctx), node.path))
        self._fetched(node)
        return self.attrs(node)

    @translated
    async def setattr(
        self,
        inode: int,
        attr: EntryAttributes,
        fields: SetattrFields,
        fh: int | None,
        ctx: Context,
    ) -> EntryAttributes:
        node = self._node(inode)
        who = self.who(ctx)
        # a file open for writing is this mount's to describe until it is saved
        if node.buffer is None and (node.entry is None or not node.unlinked):
            node.entry = self._still(node, await self.ns.stat(who, node.path))
        assert node.entry is not None
        if fields.update_size:
            if node.entry.is_dir:
                raise _fail(errno.EISDIR)
            handle = self._files.get(fh) if fh is not None else None
            version = handle.version if handle is not None else node.entry.version
            buffer = await self._buffer(node, who, version, empty=attr.st_size == 0)
            buffer.truncate(attr.st_size)
            if fh is None:
                # truncate(2) by path has no close to wait for: it is done when it returns
                await self._commit(node, who)
                if node.opens == 0:
                    buffer.close()
                    node.buffer = None
        wanted = {
            key: value
            for key, value, asked in (
                ("mode", stat.S_IMODE(attr.st_mode), fields.update_mode),
                ("uid", attr.st_uid, fields.update_uid),
                ("gid", attr.st_gid, fields.update_gid),
                ("mtime_ns", attr.st_mtime_ns, fields.update_mtime),
                ("atime_ns", attr.st_atime_ns, fields.update_atime),
            )
            if asked
        }
        if wanted and node.buffer is not None and not (fields.update_uid or fields.update_gid):
            # saved with the content (``_commit``): Samba sets the mode after a create and
            # the write time before the close. A chown is not: it may be refused (an
            # administrator's), and that must be its caller's answer, not the close's.
            node.buffer.pending.update(wanted)
        elif wanted:
            await self._create_now(node, who)
            before = node.entry.version
            node.entry = await self.ns.set_attrs(who, node.path, **wanted)
            self._moved_on(node, before)
            if fields.update_mtime:
                node.listing_changed_ns = 0  # a directory's mtime set on purpose wins
        self.inodes.touched(node)
        return self.attrs(node)

    @translated
    async def readlink(self, inode: int, ctx: Context) -> bytes:
        node = self._node(inode)
        entry = self._still(node, await self.ns.stat(self.resolving(ctx), node.path))
        if entry.kind is not EntryKind.SYMLINK or entry.link_target is None:
            raise _fail(errno.EINVAL)
        return os.fsencode(entry.link_target)

    @translated
    async def symlink(
        self, parent_inode: int, name: bytes, target: bytes, ctx: Context
    ) -> EntryAttributes:
        who = self.who(ctx)
        path = self._child(parent_inode, name)
        entry = await self.ns.symlink(who, path, os.fsdecode(target))
        return self._created(await self._owned(who, entry, ctx))

    @translated
    async def mknod(
        self, parent_inode: int, name: bytes, mode: int, rdev: int, ctx: Context
    ) -> EntryAttributes:
        who = self.who(ctx)
        path = self._child(parent_inode, name)
        if stat.S_ISREG(mode):
            entry = await self._owned(who, await self._create_file(who, path, mode, ctx), ctx)
        else:
            bits = stat.S_IMODE(mode) & ~ctx.umask
            entry = await self.ns.mknod(who, path, stat.S_IFMT(mode) | bits, rdev)
            entry = await self._owned(who, entry, ctx)
        return self._created(entry)

    @translated
    async def link(
        self, inode: int, new_parent_inode: int, new_name: bytes, ctx: Context
    ) -> EntryAttributes:
        who = self.who(ctx)
        node = self._node(inode)
        await self._create_now(node, who)
        entry = await self.ns.link(who, node.path, self._child(new_parent_inode, new_name))
        # the source's link count moved: the kernel must ask again (attributes only,
        # which is safe inside a request); learned again, so the new name finds its node
        self.inodes.learn(await self.ns.stat(who, node.path), lookups=0)
        self.inodes.touched(node)
        self.kernel.invalidate_inode(node.ino, attr_only=True)
        return self._created(entry)

    # -- directories -----------------------------------------------------------------------

    @translated
    async def mkdir(
        self, parent_inode: int, name: bytes, mode: int, ctx: Context
    ) -> EntryAttributes:
        who = self.who(ctx)
        entry = await self.ns.mkdir(who, self._child(parent_inode, name))
        entry = await self._owned(who, entry, ctx, stat.S_IMODE(mode) & ~ctx.umask)
        return self._created(entry)

    @translated
    async def rmdir(self, parent_inode: int, name: bytes, ctx: Context) -> None:
        path = self._child(parent_inode, name)
        if any(paths.is_within(node.path, path) for node in self._live_pending()):
            raise _fail(errno.ENOTEMPTY)  # the namespace has not heard of the file yet
        await self._remove(self.who(ctx), path)

    def _live_pending(self) -> list[Node]:
        return [node for node in self._pending if not node.unlinked]

    @translated
    async def unlink(self, parent_inode: int, name: bytes, ctx: Context) -> None:
        who, path = self.who(ctx), self._child(parent_inode, name)
        pending = self._pending_at(path)
        if pending is not None:
            self._drop_pending(pending)
            return
        writing = self._writing_as(path)
        await self._remove(who, path)
        await self._rebase(who, writing, path)

    async def _remove(self, who: Principal, path: str) -> None:
        node = self.inodes.by_path(path)
        # the version the kernel looked up: a removal of another one is someone else's news
        version = node.entry.version if node is not None and node.entry is not None else None
        if version is not None:
            self.own.note(ChangeOp.DELETE, path, version)
        try:
            await self.ns.remove(who, path)
        except BaseException:
            if version is not None:
                self.own.withdraw(ChangeOp.DELETE, path, version)
            raise
        self.inodes.unlinked(path)

    def _writing_as(self, path: str) -> Node | None:
        """The node with unsaved writes that calls the namespace with ``path``."""
        node = self.inodes.by_path(path)
        return node if node is not None and node.path == path and node.buffer else None

    async def _rebase(self, who: Principal, node: Node | None, gone: str) -> None:
        """``node`` had unsaved writes for ``gone``, which is gone; a hard-linked file's node
        goes on under another name, whose row has versions of its own: the writes now
        replace the version that name is at."""
        if node is None or node.buffer is None or node.unlinked or node.path == gone:
            return
        node.buffer.base_version = (await self.ns.stat(who, node.path)).version

    @translated
    async def rename(
        self,
        parent_inode_old: int,
        name_old: bytes,
        parent_inode_new: int,
        name_new: bytes,
        flags: int,
        ctx: Context,
    ) -> None:
        if flags & RENAME_EXCHANGE:
            raise _fail(errno.EINVAL)
        who = self.who(ctx)
        src = self._child(parent_inode_old, name_old)
        dst = self._child(parent_inode_new, name_new)
        overwrite = not flags & RENAME_NOREPLACE
        pending = self._pending_at(src)
        if pending is not None:
            await self._rename_pending(who, pending, dst, overwrite=overwrite)
            return
        if overwrite and src != dst:
            await self._clear_target(who, src, dst)
        replaced = self._writing_as(dst)
        await self.ns.rename(who, src, dst, overwrite=overwrite)
        self.inodes.moved(src, dst)
        await self._rebase(who, replaced, dst)

    async def _rename_pending(
        self, who: Principal, node: Node, dst: str, *, overwrite: bool
    ) -> None:
        """A pending file takes another name, still pending: decided as its create at
        ``dst`` would be; what ``dst`` named before is replaced (a file in the namespace
        is removed there now, as the rename's own change) unless ``overwrite`` is off."""
        if dst == node.path:
            return
        assert node.buffer is not None
        await self.ns.authorize_create(who, dst, node.buffer.pending.get("mode", 0))
        target = self._pending_at(dst)
        existing: Entry | None = None
        if target is None:
            with contextlib.suppress(FileNotFoundError):
                existing = await self.ns.stat(who, dst)
        if (target is not None or existing is not None) and not overwrite:
            raise _fail(errno.EEXIST)
        if target is not None:
            self._drop_pending(target)
        elif existing is not None and existing.is_dir:
            raise _fail(errno.EISDIR)
        elif existing is not None:
            await self._remove(who, dst)
        self.inodes.moved(node.path, dst)
        assert node.entry is not None
        node.entry = replace(node.entry, path=dst)

    async def _clear_target(self, who: Principal, src: str, dst: str) -> None:
        """rename(2) replaces an existing target of the same kind (a directory only if it
        is empty); the namespace replaces files only, so an empty directory goes first."""
        try:
            target = await self.ns.stat(who, dst)
        except FileNotFoundError:
            return
        source = await self.ns.stat(who, src)
        if source.is_dir and not target.is_dir:
            raise _fail(errno.ENOTDIR)
        if target.is_dir and not source.is_dir:
            raise _fail(errno.EISDIR)
        if target.is_dir:
            await self.ns.remove(who, dst)  # DirectoryNotEmpty (ENOTEMPTY) unless empty
            self.inodes.unlinked(dst)

    @translated
    async def opendir(self, inode: int, ctx: Context) -> int:
        fh = self._fh()
        self._dirs[fh] = DirHandle(self._node(inode), self.who(ctx))
        return fh

    @translated
    async def readdir(self, fh: int, start_id: int, token: ReaddirToken) -> None:
        handle = self._dirs[fh]
        if start_id != handle.last_id or handle.listing is None:
            # a seek (or the first call): list again after the name at that position;
            # otherwise the kernel continues where the last buffer filled up
            await self._close_listing(handle)
            handle.listing = self._listing(
                handle.who, handle.node.path, handle.cursors.get(start_id)
            )
        while True:
            entry = handle.pending
            handle.pending = None
            if entry is None:
                try:
                    entry = await anext(handle.listing)
                except StopAsyncIteration:
                    return
            node = self.inodes.learn(entry, lookups=0)
            await self._note_tags(handle, node, entry)
            position = handle.last_id + 1
            if not readdir_reply(token, os.fsencode(entry.name), self.attrs(node), position):
                handle.pending = entry
                self.inodes.forget(node.ino, 0)
                return
            # readdirplus: each entry handed to the kernel counts as a lookup
            node.lookups += 1
            handle.cursors[position] = entry.name
            handle.last_id = position

    def _listing(
        self, who: Principal, directory: str, start_after: str | None
    ) -> AsyncIterator[Entry]:
        """The namespace's listing of ``directory`` with this mount's pending files in
        it, in the namespace's order (bytewise by name)."""
        after = b"" if start_after is None else os.fsencode(start_after)
        mine = sorted(
            (
                (name, node)
                for node in self._live_pending()
                if paths.split(node.path)[0] == directory
                and (name := os.fsencode(paths.split(node.path)[1])) > after
            ),
            key=lambda pair: pair[0],
        )
        listing = self.ns.list(who, directory, start_after=start_after)
        return self._merged(who, listing, mine) if mine else listing

    async def _merged(
        self, who: Principal, listing: AsyncIterator[Entry], mine: list[tuple[bytes, Node]]
    ) -> AsyncIterator[Entry]:
        def pending(node: Node) -> Entry:
            assert node.entry is not None
            return replace(node.entry, path=node.path)  # renamed with its directory, maybe

        shown = [(name, node) for name, node in mine if await self.ns.visible(who, node.path)]
        try:
            async for entry in listing:
                name = os.fsencode(entry.name)
                while shown and shown[0][0] < name:
                    yield pending(shown.pop(0)[1])
                if shown and shown[0][0] == name:
                    continue  # made elsewhere meanwhile: this mount's file is the one it shows
                yield entry
            for _, node in shown:
                yield pending(node)
        finally:
            await listing.aclose()  # type: ignore[attr-defined]

    async def _note_tags(self, handle: DirHandle, node: Node, entry: Entry) -> None:
        """Samba asks each listed name for its extended attributes (the EA size of a
        directory entry): answered, for the caller the listing was for, from the
        directory's one ask of the tags of its names. Another caller asks for itself:
        the rules may show it other names, or none."""
        now = time.monotonic()
        if now >= handle.tagged_until:
            handle.tagged = await self.ns.children_tags(handle.who, handle.node.path)
            handle.tagged_until = now + self.cache_timeout
        # a hard-linked file's names are rows of their own, each with its tags
        if handle.tagged is not None and not node.aliases:
            tags = handle.tagged.get(entry.name, _NO_TAGS)
            node.listed_tags = ListedTags(handle.who, handle.tagged_until, tags)

    @translated
    async def fsyncdir(self, fh: int, datasync: bool) -> None:
        handle = self._dirs[fh]
        await self.ns.persist(handle.who, handle.node.path)

    @translated
    async def releasedir(self, fh: int) -> None:
        await self._close_listing(self._dirs.pop(fh))

    @staticmethod
    async def _close_listing(handle: DirHandle) -> None:
        if handle.listing is not None:
            await handle.listing.aclose()  # type: ignore[attr-defined]
            handle.listing = None
            handle.pending = None

    # -- files -----------------------------------------------------------------------------

    @translated
    async def open(self, inode: int, flags: int, ctx: Context) -> FileInfo:
        node = self._node(inode)
        who = self.who(ctx)
        stream: ReadStream | None = None
        if node.buffer is not None or node.unlinked:
            assert node.entry is not None
            version = node.buffer.base_version if node.buffer else node.entry.version
        elif flags & os.O_ACCMODE == os.O_WRONLY:
            node.entry = self._still(node, await self.ns.stat(who, node.path))
            version = node.entry.version
        else:
            # the reader pins the version this open sees (close-to-open consistency)
            reader = await self.ns.read(who, node.path)
            stream = ReadStream(reader)
            try:
                node.entry = self._still(node, reader.entry)
            except FUSEError:
                await stream.aclose()
                raise
            version = reader.entry.version
        if node.entry.is_dir:
            if stream is not None:
                await stream.aclose()
            raise _fail(errno.EISDIR)
        bound = node.passthrough
        if bound is not None and (flags & os.O_ACCMODE != os.O_RDONLY or bound.version != version):
            await self._rebind(node, stream)
        backing = self._backing(node, stream, flags)
        # the kernel refuses its page cache on a handle it reads from a backing file
        keep_cache = backing is None and (node.buffer is not None or node.cached_version == version)
        if not keep_cache and node.cached_version is not None and backing is None:
            # the kernel still has the old size: let it ask again (attributes only,
            # which is safe inside a request)
            self.kernel.invalidate_inode(node.ino, attr_only=True)
        node.cached_version = version
        if flags & os.O_TRUNC and flags & os.O_ACCMODE != os.O_RDONLY:
            buffer = await self._buffer(node, who, version, empty=True)
            buffer.truncate(0)
        fh = self._fh()
        self._files[fh] = FileHandle(node, who, version, stream, passthrough=backing is not None)
        node.opens += 1
        # a handle that can't write has nothing to save on close: no FLUSH round trip
        read_only = flags & os.O_ACCMODE == os.O_RDONLY
        return FileInfo(fh=fh, keep_cache=keep_cache, backing_id=backing, noflush=read_only)

    def _backing(self, node: Node, stream: ReadStream | None, flags: int) -> int | None:
        """The backing file id for a read-only open the kernel can serve itself: the
        version's bytes are one whole local file, and every other open of the inode is
        served the same way (the kernel refuses to mix the two on one inode)."""
        if stream is None or flags & os.O_ACCMODE != os.O_RDONLY or node.buffer is not None:
            return None
        region, entry = stream.reader.region, stream.reader.entry
        if (
            region is None
            or region.offset != 0
            or stream.reader.offset != 0
            or region.length != entry.size
            or entry.nlink > 1  # one node, one name: a new inode can take the name over
        ):
            return None
        bound = node.passthrough
        if bound is None:
            if node.opens:
                return None  # opens served through loomfs hold the inode
            backing_id = self.kernel.open_backing(region.fd)
            if backing_id is None:
                return None
            bound = node.passthrough = Passthrough(backing_id, entry.version)
        bound.handles += 1
        return bound.backing_id

    async def _rebind(self, node: Node, stream: ReadStream | None) -> None:
        """``node`` is served from a backing file that this open can't use: its name gets
        a new node. The open fails ESTALE, which the kernel's VFS answers by looking the
        name up again and retrying the open once, now on the new node."""
        if stream is not None:
            await stream.aclose()
        if self.inodes.by_path(node.path) is node:
            self.inodes.replaced(node)
        raise _fail(errno.ESTALE)

    @translated
    async def create(
        self,
        parent_inode: int,
        name: bytes,
        mode: int,
        flags: int,
        ctx: Context,
    ) -> tuple[FileInfo, EntryAttributes]:
        who = self.who(ctx)
        path = self._child(parent_inode, name)
        if await self._deferring(who, path, stat.S_IMODE(mode) & ~ctx.umask):
            node = self._pending_file(path, stat.S_IMODE(mode) & ~ctx.umask, ctx)
        else:
            entry = await self._create_file(who, path, mode, ctx)
            node = self._made(entry)
            node.cached_version = entry.version
            buffer = await self._buffer(node, who, entry.version, empty=True)
            # the caller's ownership is saved with the content (``_commit``)
            buffer.pending.update(_ownership(entry, ctx))
        assert node.entry is not None
        fh = self._fh()
        self._files[fh] = FileHandle(node, who, node.entry.version)
        node.opens += 1
        return FileInfo(fh=fh, keep_cache=True), self.attrs(node)

    @translated
    async def read(self, fh: int, off: int, size: int) -> bytes:
        handle = self._files[fh]
        node = handle.node
        if node.buffer is not None:
            return os.pread(node.buffer.fd, size, off)  # this file's newest bytes
        if handle.stream is None:
            handle.stream = ReadStream(
                await self.ns.read(handle.who, node.path, if_version=handle.version)
            )
        return await handle.stream.read(self.ns, handle.who, node, off, size)

    @translated
    async def write(self, fh: int, off: int, buf: bytes | memoryview) -> int:
        handle = self._files[fh]
        buffer = await self._buffer(handle.node, handle.who, handle.version, empty=False)
        return buffer.write(buf, off)

    @translated
    async def flush(self, fh: int) -> None:
        handle = self._files[fh]
        await self._commit(handle.node, handle.who)

    @translated
    async def fsync(self, fh: int, datasync: bool) -> None:
        handle = self._files[fh]
        await self._commit(handle.node, handle.who)
        if not handle.node.unlinked:
            await self.ns.persist(handle.who, handle.node.path)

    @translated
    async def release(self, fh: int) -> None:
        handle = self._files.pop(fh)
        if handle.passthrough:
            self._unbind(handle.node)
        try:
            if handle.stream is not None:
                await handle.stream.aclose()
            # normally flush has committed already; release has no caller to tell
            await self._commit(handle.node, handle.who)
        except LoomError as exc:
            log.error("could not save %s on close: %s", handle.node.path, exc)
        finally:
            self._closed(handle.node)

    def _unbind(self, node: Node) -> None:
        bound = node.passthrough
        assert bound is not None
        bound.handles -= 1
        if bound.handles == 0:
            self.kernel.close_backing(bound.backing_id)
            node.passthrough = None

    # -- extended attributes: the user.* namespace holds the entry's tags -------------------

    @translated
    async def getxattr(self, inode: int, name: bytes, ctx: Context) -> bytes:
        if not name.startswith(XATTR_USER):
            # security.capability is asked for on every write: answer without a round trip
            raise _fail(ENOATTR)
        tags = await self._tags(inode, ctx)
        value = tags.get(name[len(XATTR_USER) :].decode(errors="replace"))
        if value is None:
            raise _fail(ENOATTR)
        return value.encode()

    async def _tags(self, inode: int, ctx: Context) -> Mapping[str, str]:
        node = self._node(inode)
        if node.pending:
            return {}
        who, listed = self.who(ctx), node.listed_tags
        if listed is not None and listed.who == who and time.monotonic() < listed.until:
            return listed.tags  # what the listing for this caller said: decided for them
        return await self.ns.get_tags(who, node.path)

    @translated
    async def setxattr(self, inode: int, name: bytes, value: bytes, ctx: Context) -> None:
        if not name.startswith(XATTR_USER):
            raise _fail(errno.ENOTSUP)
        try:
            key, text = name[len(XATTR_USER) :].decode(), value.decode()
        except UnicodeDecodeError:
            raise _fail(errno.EINVAL) from None  # tags are text
        node = self._node(inode)
        who = self.who(ctx)
        await self._create_now(node, who)
        await self.ns.set_tags(who, node.path, {key: text})
        node.listed_tags = None
        self.inodes.touched(node)

    @translated
    async def listxattr(self, inode: int, ctx: Context) -> Sequence[bytes]:
        return [XATTR_USER + key.encode() for key in await self._tags(inode, ctx)]

    @translated
    async def removexattr(self, inode: int, name: bytes, ctx: Context) -> None:
        if not name.startswith(XATTR_USER):
            raise _fail(ENOATTR)
        who, path = self.who(ctx), self._node(inode).path
        key = name[len(XATTR_USER) :].decode(errors="replace")
        if key not in await self._tags(inode, ctx):
            raise _fail(ENOATTR)
        await self.ns.set_tags(who, path, {}, [key])
        node = self._node(inode)
        node.listed_tags = None
        self.inodes.touched(node)

    @translated
    async def statfs(self, ctx: Context) -> StatvfsData:
        # the namespace has no capacity call yet: report the disk that takes new writes
        local = os.statvfs(self.spool_dir)
        out = StatvfsData()
        out.f_bsize = local.f_bsize
        out.f_frsize = local.f_frsize
        out.f_blocks, out.f_bfree, out.f_bavail = local.f_blocks, local.f_bfree, local.f_bavail
        out.f_files, out.f_ffree, out.f_favail = local.f_files, local.f_ffree, local.f_favail
        out.f_namemax = paths.MAX_NAME_BYTES
        return out

    async def aclose(self) -> None:
        """Save what files still open for writing hold, then drop what open handles hold,
        when the mount ends (SIGINT or SIGTERM with a writer open: its data is kept)."""
        for handle in self._files.values():
            try:
                await self._commit(handle.node, handle.who)
            except LoomError as exc:
                log.error("could not save %s at unmount: %s", handle.node.path, exc)
        for handle in self._files.values():
            if handle.stream is not None:
                await handle.stream.aclose()
            if handle.node.buffer is not None:
                handle.node.buffer.close()
                handle.node.buffer = None
        self._files.clear()
        for dir_handle in self._dirs.values():
            await self._close_listing(dir_handle)
        self._dirs.clear()


__all__ = ["Callers", "LoomOperations", "errno_of"]
