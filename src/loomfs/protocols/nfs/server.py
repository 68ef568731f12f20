"""The NFSv3 and MOUNT v3 server (protocol layer): RFC 1813 calls as namespace calls.

MOUNT (program 100005) and NFS (100003) share one TCP port, so clients need no
portmapper (``mountport`` = ``port``). Exports are namespace directories
(``[nfs.exports]``, and at a hub those an administrator adds at run time:
``core.exports``), each with the client networks that may use it, rw or ro, and how
root is squashed. Every call runs as a ``Principal`` with protocol "nfs": an AUTH_SYS uid
mapped through ``[nfs] uid_map``, anyone else the anonymous user, so the governed
namespace decides and audits NFS calls as every other protocol's; this module only
translates. File handles are in ``handles.py``, writes gathered until COMMIT in
``spool.py``, and errors translated by the one table in ``errors.py``.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import logging
import os
import secrets
import stat as stat_mod
import struct
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from prometheus_client import Counter

from ... import paths
from ...core.acl import ADMIN_GROUP, ANONYMOUS
from ...core.metrics import REQUEST_SECONDS
from ...core.streams import aiter_bytes
from ...core.types import Action, Entry, EntryKind, Principal
from ...errors import (
    AlreadyExists,
    ConfigError,
    Conflict,
    LoomError,
    NotFound,
    NotSupported,
    PermissionDenied,
)
from ...namespace.base import Namespace
from . import errors as e
from . import pmap
from .errors import NfsError, to_nfsstat
from .handles import HandleTable, export_id
from .rpc import AUTH_NONE, AUTH_SYS, AuthSys, Call, Program, RpcDenied, RpcServer
from .spool import Spools
from .xdr import Packer, Unpacker, XdrError

if TYPE_CHECKING:
    from ...config import NfsExport
    from ...core.exports import NfsExports

log = logging.getLogger(__name__)

REQUESTS = Counter("loomfs_nfs_requests_total", "NFS requests", ["op", "status"])

MOUNT_PROGRAM, NFS_PROGRAM = 100005, 100003
PROGRAMS = ((NFS_PROGRAM, 3), (MOUNT_PROGRAM, 3))
#: GETATTR, LOOKUP, ACCESS, READLINK, READDIR, READDIRPLUS, FSSTAT, FSINFO, PATHCONF
INLINE_READS = frozenset({1, 3, 4, 5, 16, 17, 18, 19, 20})
FHSIZE3 = 64
MNTPATHLEN, NAME_MAX = 1024, 255
MAX_IO = 1 << 20  # FSINFO's rtmax and wtmax
#: fattr3: type, mode, nlink, uid, gid, size, used, rdev, fsid, fileid, atime, mtime, ctime
_FATTR3 = struct.Struct(">5I2Q2I2Q6I")
_U32, _U64 = 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF
#: entry3's value_follows, fileid and name length; its cookie; entryplus3's handle's
#: value_follows and length
_ENTRY_HEAD, _COOKIE = struct.Struct(">IQI"), struct.Struct(">Q")
_HANDLE_HEAD = struct.Struct(">II")
_TRUE = b"\0\0\0\1"
_PEERS = 4096  # client addresses (or uids) whose answer is remembered
UNSTABLE, FILE_SYNC = 0, 2  # DATA_SYNC (1) is committed and answered as FILE_SYNC
READ_ATTEMPTS = 3
#: a READDIR reply's own part: status, directory attributes, verifier, end of list, eof
LISTING_HEADER = 4 + 88 + 8 + 4 + 4
MNT3_OK = 0

_FTYPE = {
    EntryKind.FILE: 1,
    EntryKind.DIR: 2,
    EntryKind.BLOCK_DEVICE: 3,
    EntryKind.CHAR_DEVICE: 4,
    EntryKind.SYMLINK: 5,
    EntryKind.SOCKET: 6,
    EntryKind.FIFO: 7,
}
_MKNOD_BITS = {3: stat_mod.S_IFBLK, 4: stat_mod.S_IFCHR, 6: stat_mod.S_IFSOCK, 7: stat_mod.S_IFIFO}
ACCESS_READ = 0x01
_WRITE_ACCESS = 0x04 | 0x08 | 0x10  # ACCESS3_MODIFY, EXTEND and DELETE
FSF3_LINK, FSF3_SYMLINK, FSF3_HOMOGENEOUS, FSF3_CANSETTIME = 0x1, 0x2, 0x8, 0x10


class AccessGate(Protocol):
    """What may be asked of the governed namespace without doing anything: ACCESS's
    answers, and whether a first WRITE of a file may go ahead (recorded when refused)."""

    async def guarded(self, who: Principal) -> bool: ...

    async def check_read(self, who: Principal, path: str) -> None: ...

    async def check_write(self, who: Principal, path: str) -> None: ...

    async def authorize(self, who: Principal, op: str, action: Action, *targets: str) -> None: ...

    async def other_names(self, entry: Entry) -> list[str]: ...


async def _allows(check: Awaitable[None]) -> bool:
    try:
        await check
    except (PermissionDenied, NotFound):
        return False
    return True


@dataclass(frozen=True)
class Export:
    path: str
    id: int
    networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]
    read_only: bool
    squash: str
    anonymous: bool

    #: what ``admits`` answered for each client address: asked on every call
    _admitted: dict[str, bool] = field(default_factory=dict, compare=False, repr=False)

    def admits(self, host: str) -> bool:
        admitted = self._admitted.get(host)
        if admitted is None:
            if len(self._admitted) >= _PEERS:
                self._admitted.clear()
            admitted = self._admitted[host] = self._admits(host)
        return admitted

    def _admits(self, host: str) -> bool:
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        return any(address in network for network in self.networks)


@dataclass(slots=True)
class Target:
    """What a handle names: the export it was handed out through (the client's file
    system: fsid), the innermost export holding it (whose rules hold), its object id,
    its entry's identity (None: unknown) and its path, which ``NfsServer._stat`` updates
    where the entry was renamed over another protocol; ``peer``: the client asking."""

    export: Export
    rules: Export
    object_id: int
    entry: int | None
    path: str
    peer: str


@dataclass(slots=True)
class Sattr:
    mode: int | None = None
    uid: int | None = None
    gid: int | None = None
    size: int | None = None
    atime_ns: int | None = None
    mtime_ns: int | None = None


def _time(u: Unpacker) -> int | None:
    how = u.uint()
    if how == 0:
        return None
    if how == 1:
        return time.time_ns()
    if how == 2:
        seconds, nanos = u.uint(), u.uint()
        return seconds * 1_000_000_000 + nanos
    raise XdrError(f"time_how {how}")


def _sattr(u: Unpacker) -> Sattr:
    s = Sattr()
    if u.boolean():
        s.mode = u.uint() & 0o7777
    if u.boolean():
        s.uid = u.uint()
    if u.boolean():
        s.gid = u.uint()
    if u.boolean():
        s.size = u.uhyper()
    s.atime_ns = _time(u)
    s.mtime_ns = _time(u)
    return s


def _nfstime(p: Packer, ns: int) -> None:
    seconds, nanos = divmod(max(ns, 0), 1_000_000_000)
    p.uint(seconds)
    p.uint(nanos)


def _check_name(name: str) -> str:
    if len(name.encode()) > NAME_MAX:
        raise NfsError(e.NFS3ERR_NAMETOOLONG, name)
    if not name or "/" in name or "\0" in name or name in (".", ".."):
        raise NfsError(e.NFS3ERR_INVAL, f"not a file name: {name!r}")
    return name


def principal_of(
    cred: AuthSys | None, export: Export, uid_map: Mapping[int, str], site: str
) -> Principal:
    """Who a call runs as: the loomfs user its AUTH_SYS uid maps to, else ``anonymous``;
    root (or everyone) squashed to ``anonymous`` as the export says. AUTH_NONE is
    ``anonymous`` where the export allows it, else refused (AUTH_TOOWEAK)."""
    anonymous = Principal(ANONYMOUS, site=site, protocol="nfs")
    if cred is None:
        if not export.anonymous:
            raise RpcDenied()
        return anonymous
    if export.squash == "all" or (cred.uid == 0 and export.squash == "root"):
        return anonymous
    name = uid_map.get(cred.uid)
    if name is not None:
        return Principal(name, site=site, protocol="nfs")
    if cred.uid == 0:  # squash "none": root is the administrator, as on its own disk
        return Principal("root", frozenset({ADMIN_GROUP}), site=site, protocol="nfs")
    return anonymous


class _Answered(NfsError):
    """A failure whose body the procedure built itself (LOOKUP's directory attributes)."""

    def __init__(self, body: Packer) -> None:
        super().__init__(e.NFS3ERR_IO)
        self.body = body


Handler = Callable[["NfsServer", Call], Awaitable[Packer]]


def nfs_procedure(fail_words: int) -> Callable[[Handler], Handler]:
    """Run one NFS procedure: its result body after NFS3_OK, or a status and ``fail_words``
    absent optional attributes (post_op_attr, wcc_data: as many FALSE words as the
    procedure's failure body has) for an error, through the one table in ``errors.py``."""

    def wrap(fn: Handler) -> Handler:
        @functools.wraps(fn)
        async def run(self: NfsServer, call: Call) -> Packer:
            began = time.perf_counter()
            try:
                return await answer(self, call)
            finally:
                latency.observe(time.perf_counter() - began)

        latency = REQUEST_SECONDS.labels("nfs", fn.__name__)
        succeeded = REQUESTS.labels(fn.__name__, "ok")  # labels() is a lookup per call

        async def answer(self: NfsServer, call: Call) -> Packer:
            try:
                body = await fn(self, call)
            except _Answered as exc:
                REQUESTS.labels(fn.__name__, "refused").inc()
                return exc.body
            except NfsError as exc:
                status = exc.status
            except LoomError as exc:
                level = logging.DEBUG if isinstance(exc, NotFound) else logging.INFO
                extra = {"op": fn.__name__, "code": exc.code, "reason": exc.message}
                log.log(level, "nfs request refused", extra=extra)
                status = to_nfsstat(exc)
            except (XdrError, RpcDenied):
                raise  # the RPC layer answers GARBAGE_ARGS or AUTH_ERROR
            except Exception:
                log.exception("unexpected error in an nfs request", extra={"op": fn.__name__})
                status = e.NFS3ERR_SERVERFAULT
            else:
                out = Packer()
                out.uint(e.NFS3_OK)
                out.extend(body)
                succeeded.inc()
                return out
            REQUESTS.labels(fn.__name__, str(status)).inc()
            out = Packer()
            out.uint(status)
            for _ in range(fail_words):
                out.uint(0)
            return out

        return run

    return wrap


class NfsServer:
    """NFSv3 and MOUNT v3 on one port over ``ns`` (the governed namespace; ``gate``: the
    same, where it can answer ACCESS ahead of the calls; ``rpcbind``: the portmapper to
    register with; ``live``: the exports in force, ``exports`` and those added at run
    time, taken afresh at each MNT and EXPORT call and at each change made in this
    process: a handle under an export removed is STALE at its next call; ``inline_reads``:
    ``ns`` answers stat, lookups and listings without needing a task of their own, so the
    RPC edge runs those calls inline)."""

    def __init__(
        self,
        ns: Namespace,
        exports: Mapping[str, NfsExport],
        *,
        state_dir: Path,
        spool_dir: Path,
        uid_map: Mapping[int, str] | None = None,
        site: str = "local",
        commit_delay: float = 2.0,
        gate: AccessGate | None = None,
        rpcbind: tuple[str, int] | None = None,
        live: NfsExports | None = None,
        inline_reads: bool = False,
    ) -> None:
        self.ns = ns
        self.gate = gate
        self.rpcbind = rpcbind
        self._registered = False
        self.site = site
        self.uid_map = dict(uid_map or {})
        self._principals: dict[tuple[int | None, str, bool], Principal] = {}
        self.configured = exports
        self.live = live
        self.exports = self._table(exports, {})
        if live is not None:
            live.changed.append(self.refresh)
        self.handles = HandleTable(state_dir)
        self.spools = Spools(ns, spool_dir, commit_delay)
        #: a new one each start: clients resend the UNSTABLE writes of an earlier one
        self.write_verifier = secrets.token_bytes(8)
        #: READDIR cookies are object ids, which outlive restarts; so does this
        self.cookie_verifier = self.handles.mac(b"cookies")[:8]
        self.mounts: set[tuple[str, str]] = set()
        nfs = {
            0: self.null, 1: self.getattr, 2: self.setattr, 3: self.lookup, 4: self.access,
            5: self.readlink, 6: self.read, 7: self.write, 8: self.create, 9: self.mkdir,
            10: self.symlink, 11: self.mknod, 12: self.remove, 13: self.rmdir,
            14: self.rename, 15: self.link, 16: self.readdir, 17: self.readdirplus,
            18: self.fsstat, 19: self.fsinfo, 20: self.pathconf, 21: self.commit,
        }  # fmt: skip
        mount = {
            0: self.null, 1: self.mnt, 2: self.dump, 3: self.umnt, 4: self.umntall,
            5: self.export,
        }  # fmt: skip
        # NULL needs nothing; the metadata reads only what ``ns`` answers without a task
        reads = INLINE_READS if inline_reads else frozenset()
        self.rpc = RpcServer(
            [
                Program(NFS_PROGRAM, 3, nfs, inline=frozenset({0}) | reads),
                Program(MOUNT_PROGRAM, 3, mount, inline=frozenset({0})),
            ]
        )

    async def start(self, host: str, port: int) -> int:
        bound = await self.rpc.start(host, port)
        if self.rpcbind is not None:
            self._registered = await pmap.register(self.rpcbind, PROGRAMS, bound)
        return bound

    async def stop(self) -> None:
        if self.rpcbind is not None and self._registered:
            await pmap.unregister(self.rpcbind, PROGRAMS)
        await self.rpc.stop()
        await self.spools.close()
        self.handles.close()

    # -- exports ---------------------------------------------------------------------------

    def _table(
        self, configured: Mapping[str, NfsExport], added: Mapping[str, NfsExport]
    ) -> dict[int, Export]:
        """Exports by id: ``configured`` (two that clash are a ``ConfigError``), then
        ``added`` where one does not clash with an export already there."""
        table: dict[int, Export] = {}
        for source, exports in (("config", configured), ("catalog", added)):
            for name, config in exports.items():
                path = paths.normalize(name)
                export = Export(
                    path,
                    export_id(path),
                    tuple(ipaddress.ip_network(c, strict=False) for c in config.clients),
                    config.access == "ro",
                    config.squash,
                    config.anonymous,
                )
                other = table.get(export.id)
                if other is None:
                    table[export.id] = export
                elif source == "config":  # 1 in 2**32 for two paths: say so, never mix them
                    raise ConfigError(f"the exports {path} and {other.path} clash")
                else:
                    log.warning("nfs export not served", extra={"path": path, "clash": other.path})
        return table

    async def refresh(self) -> None:
        """Take the exports in force now (``live``'s)."""
        if self.live is None:
            return
        try:
            added = await self.live.added()
        except LoomError as exc:  # the catalog out of reach: the exports last taken hold
            log.warning("nfs exports not taken", extra={"error": str(exc)})
            return
        self.exports = self._table(self.configured, added)

    # -- identity and handles --------------------------------------------------------------

    def who(self, call: Call, export: Export) -> Principal:
        # a Principal is a value: one per (uid, export's rules) serves every call of it
        key = (None if call.cred is None else call.cred.uid, export.squash, export.anonymous)
        who = self._principals.get(key)
        if who is None:
            who = principal_of(call.cred, export, self.uid_map, self.site)
            if len(self._principals) >= _PEERS:
                self._principals.clear()
            self._principals[key] = who
        return who

    def _target(self, call: Call, handle: bytes) -> Target:
        export_number, object_id = self.handles.decode(handle)
        export = self.exports.get(export_number)
        if export is None:  # an export taken out of the configuration
            raise NfsError(e.NFS3ERR_STALE, "no such export")
        if not export.admits(call.peer):
            raise NfsError(e.NFS3ERR_ACCES, f"{call.peer} may not use {export.path}")
        known = self.handles.known(object_id)
        if known is None or not known.live or not paths.is_within(known.path, export.path):
            raise NfsError(e.NFS3ERR_STALE, "the object is gone")
        target = Target(export, export, object_id, known.entry, known.path, call.peer)
        self._place(target, known.path)
        return target

    def _place(self, target: Target, path: str) -> None:
        """``target`` is at ``path``, whose innermost export's rules hold for it."""
        if not paths.is_within(path, target.export.path):  # moved out of the client's export
            raise NfsError(e.NFS3ERR_STALE, f"{target.path} is no longer in {target.export.path}")
        # an export inside the one mounted keeps its own rules for what is below it
        rules = self._export_of(path) or target.export
        if not rules.admits(target.peer):
            raise NfsError(e.NFS3ERR_ACCES, f"{target.peer} may not use {rules.path}")
        target.rules, target.path = rules, path

    async def _handle(self, export: Export, entry: Entry) -> tuple[bytes, int]:
        object_id = await self._object(entry)
        return self.handles.encode(export.id, object_id), object_id

    async def _object(self, entry: Entry) -> int:
        """The object id of ``entry``: one for all names of a hard-linked file, so the
        client caches one file's attributes once (a name first seen joins the object of
        a name seen before) where both are under the same export's rules (a handle's
        rules are its object's path's). Where nothing tells names apart from files (a
        spoke: no gate, no ids) each name is its own object."""
        linked = entry.nlink > 1 and not entry.is_dir and entry.inode is not None
        if not linked or self.gate is None or entry.id is None:
            return self.handles.id(entry.path, entry.id)
        if self.handles.find(entry.path, entry.id) is not None:
            return self.handles.id(entry.path, entry.id)
        rules = self._export_of(entry.path)
        for name in await self.gate.other_names(entry):
            if self._export_of(name) is not rules:
                continue
            object_id = self.handles.find(name)
            if object_id is not None:
                self.handles.alias(entry.id, object_id, entry.path)
                return object_id
        return self.handles.id(entry.path, entry.id)

    async def _relinked(self, who: Principal, target: Target) -> Entry | None:
        """The object's own name is gone: the entry of another of its names (an alias),
        which the object now stands for; None if none is left."""
        for alias in self.handles.aliases(target.object_id):
            try:
                moved = await self.ns.locate(who, alias)
            except (NotFound, NotSupported):
                self.handles.unalias(alias)
                continue
            try:
                self._place(target, moved.path)
            except NfsError:  # renamed out of the client's export, or not for this client
                continue
            self.handles.moved_to(target.object_id, moved.path, alias)
            self.spools.moved(target.object_id, moved.path)
            target.entry = alias
            return moved
        return None

    async def _stat(self, who: Principal, target: Target) -> Entry:
        """The entry a handle names now, found where renames over other protocols took it;
        STALE if it is gone."""
        with contextlib.suppress(NotFound):
            entry = await self.ns.stat(who, target.path)
            # an entry without an id (a spoke's own pending write) is taken for the object
            if target.entry is None or entry.id is None or entry.id == target.entry:
                if target.entry is None and entry.id is not None:
                    self.handles.adopt(target.object_id, entry.id)
                    target.entry = entry.id
                return entry
        # its path is gone or names another entry now: where did this one go?
        if target.entry is not None:
            with contextlib.suppress(NotFound, NotSupported):
                moved = await self.ns.locate(who, target.entry)
                self._place(target, moved.path)
                self.handles.id(moved.path, moved.id)
                self.spools.moved(target.object_id, moved.path)
                return moved
        relinked = await self._relinked(who, target)
        if relinked is not None:
            return relinked
        self.handles.retire(target.object_id)
        self.spools.discard(target.object_id)
        raise NfsError(e.NFS3ERR_STALE, f"{target.path} is gone")

    async def _stat_quiet(self, who: Principal, path: str) -> Entry | None:
        try:
            return await self.ns.stat(who, path)
        except LoomError:
            return None

    def _writable(self, target: Target) -> None:
        if target.export.read_only or target.rules.read_only:
            raise NfsError(e.NFS3ERR_ROFS, f"{target.rules.path} is exported read-only")

    def _args(self, call: Call) -> tuple[Target, Principal]:
        target = self._target(call, call.args.opaque(FHSIZE3))
        return target, self.who(call, target.rules)

    def _dirop(self, call: Call) -> tuple[Target, Principal, str]:
        """A diropargs3 (directory handle and name)."""
        target, who = self._args(call)
        return target, who, call.args.string(NAME_MAX * 4)

    # -- attributes ------------------------------------------------------------------------

    def _sizes(self, entry: Entry, object_id: int) -> tuple[int, int, int]:
        """(size, mtime, ctime) as the client sees them: a file with uncommitted writes
        has its spool's size and the time of its last write."""
        spool = self.spools.dirty(object_id)
        if spool is not None:
            return spool.size, spool.mtime_ns, spool.mtime_ns
        size = entry.size
        if entry.kind is EntryKind.SYMLINK and entry.link_target is not None:
            size = len(entry.link_target.encode())
        return size, entry.mtime_ns, entry.ctime_ns or entry.mtime_ns

    def _fattr(self, p: Packer, entry: Entry, object_id: int, export: Export) -> None:
        # one pack of the 21 words (every reply but NULL carries one, READDIRPLUS one an
        # entry): word by word they were a fifth of a LOOKUP's time
        size, mtime_ns, ctime_ns = self._sizes(entry, object_id)
        rdev = entry.rdev or 0
        atime_s, atime_n = divmod(max(entry.atime_ns or mtime_ns, 0), 1_000_000_000)
        mtime_s, mtime_n = divmod(max(mtime_ns, 0), 1_000_000_000)
        ctime_s, ctime_n = divmod(max(ctime_ns, 0), 1_000_000_000)
        p.fixed(
            _FATTR3.pack(
                _FTYPE[entry.kind], entry.mode & 0o7777,
                max(entry.nlink, 2 if entry.is_dir else 1) & _U32, entry.uid & _U32,
                entry.gid & _U32, size & _U64, (size + 4095) // 4096 * 4096 & _U64,
                os.major(rdev), os.minor(rdev), export.id, object_id & _U64,
                atime_s & _U32, atime_n, mtime_s & _U32, mtime_n, ctime_s & _U32, ctime_n,
            )
        )  # fmt: skip

    def _post_op(self, p: Packer, entry: Entry | None, export: Export) -> None:
        if entry is None:
            p.boolean(False)
            return
        p.boolean(True)
        self._fattr(p, entry, self.handles.id(entry.path, entry.id), export)

    def _pre_op(self, p: Packer, before: tuple[int, int, int] | None) -> None:
        if before is None:
            p.boolean(False)
            return
        p.boolean(True)
        size, mtime_ns, ctime_ns = before
        p.uhyper(size)
        _nfstime(p, mtime_ns)
        _nfstime(p, ctime_ns)

    async def _wcc(
        self,
        p: Packer,
        who: Principal,
        before: tuple[int, int, int] | None,
        path: str,
        export: Export,
    ) -> None:
        """wcc_data: ``before`` (``_sizes`` of the object before the change) and its
        attributes now."""
        self._pre_op(p, before)
        self._post_op(p, await self._stat_quiet(who, path), export)

    # -- NFS procedures --------------------------------------------------------------------

    async def null(self, call: Call) -> Packer:
        return Packer()

    @nfs_procedure(0)
    async def getattr(self, call: Call) -> Packer:
        target, who = self._args(call)
        entry = await self._stat(who, target)
        p = Packer()
        self._fattr(p, entry, target.object_id, target.export)
        return p

    @nfs_procedure(2)
    async def setattr(self, call: Call) -> Packer:
        target, who = self._args(call)
        s = _sattr(call.args)
        guard = call.args.boolean()
        guard_ns = call.args.uint() * 1_000_000_000 + call.args.uint() if guard else None
        self._writable(target)
        before = await self._stat(who, target)
        pre = self._sizes(before, target.object_id)
        if guard_ns is not None and guard_ns != pre[2]:
            raise NfsError(e.NFS3ERR_NOT_SYNC, "the object changed since the client looked")
        if s.size is not None:
            if before.is_dir:
                raise NfsError(e.NFS3ERR_ISDIR, target.path)
            dirty = self.spools.dirty(target.object_id) is not None
            if s.size == 0 and not dirty:  # O_TRUNC: no copy of what goes anyway
                if before.size:
                    self.spools.discard(target.object_id)
                    await self.ns.write(who, target.path, aiter_bytes(b""))
            elif s.size != before.size or dirty:
                await self.spools.truncate(who, target.object_id, before, s.size)
        # an owner sent back unchanged (cp -p, tar) is no change of owner, which needs admin
        uid = None if s.uid == before.uid else s.uid
        gid = None if s.gid == before.gid else s.gid
        if (s.mode, uid, gid, s.mtime_ns, s.atime_ns) != (None,) * 5:
            await self.spools.commit(target.object_id)  # a new mtime is the committed one's
            await self.ns.set_attrs(
                who, target.path, mode=s.mode, uid=uid, gid=gid,
                mtime_ns=s.mtime_ns, atime_ns=s.atime_ns,
            )  # fmt: skip
        p = Packer()
        await self._wcc(p, who, pre, target.path, target.export)
        return p

    @nfs_procedure(1)
    async def lookup(self, call: Call) -> Packer:
        target, who, name = self._dirop(call)
        if name in (".", ".."):
            directory: Entry | None = await self._looked_in(who, target)
            path = target.path
            if name == ".." and target.path != target.export.path:
                parent = paths.split(target.path)[0]
                path = parent if paths.is_within(parent, target.export.path) else path
        else:
            # a found name's directory is one: only a failure needs the directory's own
            # look (STALE, NOTDIR), and its attributes are optional (the client's cache
            # of them is only refreshed by them), so a hit costs one namespace call
            directory, path = None, paths.join(target.path, _check_name(name))
        found: Entry | None = None
        try:
            found = await self.ns.stat(who, path)
        except LoomError as exc:
            status, seen = to_nfsstat(exc), target.path
            directory = directory or await self._looked_in(who, target)
            if target.path != seen:  # the directory was renamed over another protocol
                with contextlib.suppress(NotFound):
                    found = await self.ns.stat(who, paths.join(target.path, name))
            if found is None:
                p = Packer()
                p.uint(status)
                self._post_op(p, directory, target.export)
                raise _Answered(p) from None
        entry = found
        handle, object_id = await self._handle(target.export, entry)
        p = Packer()
        p.opaque(handle)
        p.boolean(True)
        self._fattr(p, entry, object_id, target.export)
        self._post_op(p, directory, target.export)
        return p

    async def _looked_in(self, who: Principal, target: Target) -> Entry:
        directory = await self._stat(who, target)
        if not directory.is_dir:
            raise NfsError(e.NFS3ERR_NOTDIR, target.path)
        return directory

    @nfs_procedure(1)
    async def access(self, call: Call) -> Packer:
        target, who = self._args(call)
        wanted = call.args.uint()
        entry = await self._stat(who, target)
        read_only = target.export.read_only or target.rules.read_only
        allowed = wanted & ~_WRITE_ACCESS if read_only else wanted
        # what the namespace would decide (a directory's entries: write on the directory);
        # without a gate (a spoke: its hub decides) each call is decided as it comes
        gate = self.gate
        if gate is not None:
            path = target.path
            reading = allowed & ACCESS_READ and not entry.is_dir
            # a plain file's read needs read on its names, which nothing refuses a caller
            # whom nothing is refused (as of the policy the stat above was decided by)
            if reading and entry.kind is EntryKind.FILE and not await gate.guarded(who):
                reading = False
            if reading and not await _allows(gate.check_read(who, path)):
                allowed &= ~ACCESS_READ
            if allowed & _WRITE_ACCESS and not await _allows(gate.check_write(who, path)):
                allowed &= ~_WRITE_ACCESS
        p = Packer()
        self._post_op(p, entry, target.export)
        p.uint(allowed)
        return p

    @nfs_procedure(1)
    async def readlink(self, call: Call) -> Packer:
        target, who = self._args(call)
        entry = await self._stat(who, target)
        if entry.kind is not EntryKind.SYMLINK or entry.link_target is None:
            raise NfsError(e.NFS3ERR_INVAL, f"{target.path} is not a symlink")
        p = Packer()
        self._post_op(p, entry, target.export)
        p.string(entry.link_target)
        return p

    @nfs_procedure(1)
    async def read(self, call: Call) -> Packer:
        target, who = self._args(call)
        offset, count = call.args.uhyper(), min(call.args.uint(), MAX_IO)
        entry = await self._stat(who, target)
        if entry.is_dir:
            raise NfsError(e.NFS3ERR_ISDIR, target.path)
        if entry.kind is not EntryKind.FILE:
            raise NfsError(e.NFS3ERR_INVAL, f"{target.path} has no content")
        spool = self.spools.dirty(target.object_id)
        if spool is not None:
            await self.ns.stat_for_read(who, target.path)  # refused as a read would be
            data = os.pread(spool.fd, count, offset)
            size = spool.size
        elif offset >= entry.size or count == 0:
            # still a read: the namespace decides (and audits) it like any other
            await (await self.ns.read_entry(who, entry, min(offset, entry.size), 0)).aclose()
            data, size = b"", entry.size
        else:
            data, entry = await self._read(who, target, entry, offset, count)
            size = entry.size
        p = Packer()
        self._post_op(p, entry, target.export)
        p.uint(len(data))
        p.boolean(offset + len(data) >= size)
        p.opaque(data)
        return p

    async def _read(
        self, who: Principal, target: Target, entry: Entry, offset: int, count: int
    ) -> tuple[bytes, Entry]:
        """A range of the file's current version. NFS has no open to pin a version to: a
        file replaced between the stat and the read (over another protocol) is read again
        as it is now rather than failed."""
        for _ in range(READ_ATTEMPTS - 1):
            try:
                async with await self.ns.read_entry(who, entry, offset, count) as reader:
                    return await reader.read_all(), entry
            except Conflict:
                entry = await self._stat(who, target)
        async with await self.ns.read_entry(who, entry, offset, count) as reader:
            return await reader.read_all(), entry

    @nfs_procedure(2)
    async def write(self, call: Call) -> Packer:
        target, who = self._args(call)
        offset, count, stable = call.args.uhyper(), call.args.uint(), call.args.uint()
        data = call.args.view(MAX_IO)
        if stable > FILE_SYNC:
            raise XdrError(f"stable_how {stable}")
        if count != len(data):
            raise NfsError(e.NFS3ERR_INVAL, "the count is not the data's length")
        self._writable(target)
        before = await self._stat(who, target)
        if before.is_dir:
            raise NfsError(e.NFS3ERR_ISDIR, target.path)
        if before.kind is not EntryKind.FILE:
            raise NfsError(e.NFS3ERR_INVAL, f"{target.path} has no content")
        pre = self._sizes(before, target.object_id)
        spool = self.spools.dirty(target.object_id)
        if self.gate is not None and (spool is None or spool.who != who):
            # refused now rather than at COMMIT, when the client has thrown the data away;
            # each user's first write into a spool (it commits the one before as theirs)
            await self.gate.authorize(who, "write", Action.WRITE, target.path)
        await self._drop_set_id(call, who, target, before)  # refused: no byte taken
        await self.spools.write(who, target.object_id, before, offset, data)
        committed = UNSTABLE
        if stable != UNSTABLE:
            await self.spools.commit(target.object_id)
            committed = FILE_SYNC
        p = Packer()
        await self._wcc(p, who, pre, target.path, target.export)
        p.uint(len(data))
        p.uint(committed)
        p.fixed(self.write_verifier)
        return p

    async def _drop_set_id(self, call: Call, who: Principal, target: Target, entry: Entry) -> None:
        """A write by anyone but the file's owner (or root) clears its set-user-ID bit, and
        its set-group-ID bit where the group may execute it, as a posix kernel does on its
        own disk (the Linux client leaves it to the server: a write is no SETATTR)."""
        bits = entry.mode & (stat_mod.S_ISUID | (stat_mod.S_ISGID * bool(entry.mode & 0o010)))
        uid = None if call.cred is None else call.cred.uid
        if bits and uid not in (0, entry.uid):
            mode = entry.mode & 0o7777 & ~bits
            await self.ns.set_attrs(who, target.path, mode=mode)

    @nfs_procedure(1)
    async def commit(self, call: Call) -> Packer:
        target, who = self._args(call)
        call.args.uhyper()  # offset and count: a commit here is always of the whole file
        call.args.uint()
        pre = self._sizes(await self._stat(who, target), target.object_id)
        await self.spools.commit(target.object_id)
        p = Packer()
        await self._wcc(p, who, pre, target.path, target.export)
        p.fixed(self.write_verifier)
        return p

    async def _created(
        self, p: Packer, who: Principal, target: Target, before: Entry, entry: Entry
    ) -> None:
        """A post_op_fh3, its post_op_attr and the directory's wcc_data."""
        handle, object_id = await self._handle(target.export, entry)
        p.boolean(True)
        p.opaque(handle)
        p.boolean(True)
        self._fattr(p, entry, object_id, target.export)
        await self._wcc(p, who, self._sizes(before, target.object_id), target.path, target.export)

    async def _directory(self, who: Principal, target: Target) -> Entry:
        self._writable(target)
        entry = await self._stat(who, target)
        if not entry.is_dir:
            raise NfsError(e.NFS3ERR_NOTDIR, target.path)
        return entry

    @nfs_procedure(2)
    async def create(self, call: Call) -> Packer:
        target, who, name = self._dirop(call)
        how = call.args.uint()
        s, verifier = Sattr(), None
        if how in (0, 1):
            s = _sattr(call.args)
        elif how == 2:
            verifier = call.args.fixed(8)
        else:
            raise XdrError(f"createmode {how}")
        before = await self._directory(who, target)
        path = paths.join(target.path, _check_name(name))
        mode = 0o644 if s.mode is None else s.mode
        # an exclusive create keeps its verifier as the mtime, so a retransmission of it
        # is told from another client's file (RFC 1813 3.3.8); the client then sets the times
        stamp = None if verifier is None else _verifier_ns(verifier)
        try:
            entry = await self.ns.write(who, path, aiter_bytes(b""), exclusive=True, mode=mode)
            if stamp is not None:
                entry = await self.ns.set_attrs(who, path, mtime_ns=stamp)
        except AlreadyExists:
            entry = await self.ns.stat(who, path)
            retransmitted = stamp is None or entry.mtime_ns == stamp
            if how == 1 or entry.kind is not EntryKind.FILE or not retransmitted:
                raise
            if how == 0 and entry.kind is EntryKind.FILE and s.size == 0 and entry.size:
                # what others wrote lands first, as theirs: this caller's empty file,
                # if the namespace lets it write, is the newer version (a caller it
                # refuses must not throw their writes away)
                await self.spools.commit(self.handles.id(path, entry.id))
                entry = await self.ns.write(who, path, aiter_bytes(b""))
        p = Packer()
        await self._created(p, who, target, before, entry)
        return p

    @nfs_procedure(2)
    async def mkdir(self, call: Call) -> Packer:
        target, who, name = self._dirop(call)
        s = _sattr(call.args)
        before = await self._directory(who, target)
        path = paths.join(target.path, _check_name(name))
        entry = await self.ns.mkdir(who, path)
        if s.mode is not None and s.mode != entry.mode & 0o7777:
            entry = await self.ns.set_attrs(who, path, mode=s.mode)
        p = Packer()
        await self._created(p, who, target, before, entry)
        return p

    @nfs_procedure(2)
    async def symlink(self, call: Call) -> Packer:
        target, who, name = self._dirop(call)
        _sattr(call.args)  # a symlink's own mode means nothing
        link_target = call.args.string(MNTPATHLEN * 4)
        before = await self._directory(who, target)
        path = paths.join(target.path, _check_name(name))
        entry = await self.ns.symlink(who, path, link_target)
        p = Packer()
        await self._created(p, who, target, before, entry)
        return p

    @nfs_procedure(2)
    async def mknod(self, call: Call) -> Packer:
        target, who, name = self._dirop(call)
        kind = call.args.uint()
        if kind not in _MKNOD_BITS:
            raise NfsError(e.NFS3ERR_BADTYPE, f"mknod of type {kind}")
        s = _sattr(call.args)
        rdev = 0
        if kind in (3, 4):
            rdev = os.makedev(call.args.uint(), call.args.uint())
        before = await self._directory(who, target)
        path = paths.join(target.path, _check_name(name))
        mode = _MKNOD_BITS[kind] | (0o644 if s.mode is None else s.mode)
        entry = await self.ns.mknod(who, path, mode, rdev)
        p = Packer()
        await self._created(p, who, target, before, entry)
        return p

    async def _unlink(self, call: Call, *, directory: bool) -> Packer:
        target, who, name = self._dirop(call)
        before = await self._directory(who, target)
        path = paths.join(target.path, _check_name(name))
        entry = await self.ns.stat(who, path)
        if directory and not entry.is_dir:
            raise NfsError(e.NFS3ERR_NOTDIR, path)
        if not directory and entry.is_dir:
            raise NfsError(e.NFS3ERR_ISDIR, path)
        known = self.handles.find(path, entry.id)  # a file never handed out has no id
        linked = entry.nlink > 1 and not entry.is_dir
        if known is not None and linked:  # it lives on under its other names: its writes too
            await self.spools.commit(known)
        await self.ns.remove(who, path, recursive=False)
        if known is not None and linked:
            await self._unlinked(who, target, known, entry)
        elif known is not None:
            self.spools.discard(known)
            self.handles.retire(known)
        if directory:  # ids below a directory go with it
            self.handles.removed(path)
        p = Packer()
        await self._wcc(p, who, self._sizes(before, target.object_id), target.path, target.export)
        return p

    async def _unlinked(self, who: Principal, target: Target, object_id: int, entry: Entry) -> None:
        """One name of the hard-linked file ``object_id`` is gone: an alias is dropped;
        the object's own name gives way to another of its names, at once, so a new file
        at the old name is never taken for it."""
        known = self.handles.known(object_id)
        if known is None or known.entry != entry.id:
            if entry.id is not None:
                self.handles.unalias(entry.id)
            return
        moved = Target(target.export, target.rules, object_id, entry.id, entry.path, target.peer)
        with contextlib.suppress(NfsError):  # moved out of the export: stale, as any such
            if await self._relinked(who, moved) is not None:
                return
        self.spools.discard(object_id)
        self.handles.retire(object_id)

    @nfs_procedure(2)
    async def remove(self, call: Call) -> Packer:
        return await self._unlink(call, directory=False)

    @nfs_procedure(2)
    async def rmdir(self, call: Call) -> Packer:
        return await self._unlink(call, directory=True)

    @nfs_procedure(4)
    async def rename(self, call: Call) -> Packer:
        source, who, src_name = self._dirop(call)
        dest_handle = call.args.opaque(FHSIZE3)
        dst_name = call.args.string(NAME_MAX * 4)
        dest = self._target(call, dest_handle)
        if dest.export.id != source.export.id:
            raise NfsError(e.NFS3ERR_XDEV, "a rename between exports")
        src_before = await self._directory(who, source)
        dst_before = await self._directory(who, dest)
        src = paths.join(source.path, _check_name(src_name))
        dst = paths.join(dest.path, _check_name(dst_name))
        await self.ns.stat(who, src)  # NOENT before anything is committed
        await self.spools.commit_within(src)  # what was written under the old names is kept
        if src != dst:
            await self.ns.rename(who, src, dst, overwrite=True)
            self.handles.renamed(src, dst)
        p = Packer()
        src_pre = self._sizes(src_before, source.object_id)
        await self._wcc(p, who, src_pre, source.path, source.export)
        await self._wcc(p, who, self._sizes(dst_before, dest.object_id), dest.path, dest.export)
        return p

    @nfs_procedure(3)
    async def link(self, call: Call) -> Packer:
        target, who = self._args(call)
        dir_handle = call.args.opaque(FHSIZE3)
        name = call.args.string(NAME_MAX * 4)
        directory = self._target(call, dir_handle)
        if directory.export.id != target.export.id:
            raise NfsError(e.NFS3ERR_XDEV, "a link between exports")
        before = await self._directory(who, directory)
        await self._stat(who, target)
        await self.spools.commit(target.object_id)
        dst = paths.join(directory.path, _check_name(name))
        made = await self.ns.link(who, target.path, dst)
        if made.id is None:  # a create's answer may not know its row yet
            made = await self.ns.stat(who, dst)
        if made.id is not None:  # the new name is the same object, not another
            self.handles.alias(made.id, target.object_id, dst)
        p = Packer()
        self._post_op(p, await self._stat_quiet(who, target.path), target.export)
        pre = self._sizes(before, directory.object_id)
        await self._wcc(p, who, pre, directory.path, directory.export)
        return p

    async def _listing(self, call: Call, *, plus: bool) -> Packer:
        target, who = self._args(call)
        cookie, verifier = call.args.uhyper(), call.args.fixed(8)
        if plus:
            dircount, maxcount = call.args.uint(), call.args.uint()
        else:
            dircount = maxcount = call.args.uint()
        directory = await self._stat(who, target)
        if not directory.is_dir:
            raise NfsError(e.NFS3ERR_NOTDIR, target.path)
        if cookie and verifier != self.cookie_verifier and verifier != bytes(8):
            raise NfsError(e.NFS3ERR_BAD_COOKIE, "a cookie of another listing")
        start_after = self._resume(cookie, target.path)
        body, used, names = Packer(), 0, 0
        budget = maxcount - LISTING_HEADER

        def add(entry: Entry, name: str, object_id: int, cookie: int | None = None) -> bool:
            nonlocal used, names
            item, name_size = self._dir_entry(entry, name, object_id, cookie, target.export, plus)
            if used + item.size > budget or names + name_size > dircount:
                return False
            body.extend(item)
            used, names = used + item.size, names + name_size
            return True

        dots: list[tuple[Entry, str, int, int]] = []
        if cookie == 0:
            dots.append((directory, ".", target.object_id, 1))
        if cookie <= 1:
            parent = None
            if target.path != target.export.path:
                parent = await self._stat_quiet(who, paths.split(target.path)[0])
            up = parent or directory
            dots.append((up, "..", self.handles.id(up.path, up.id), 2))
        eof = all(add(*dot) for dot in dots)
        if eof:
            async for entry in self.ns.list(who, target.path, start_after=start_after):
                if not add(entry, entry.name, await self._object(entry)):
                    eof = False
                    break
        if used == 0 and not eof:
            raise NfsError(e.NFS3ERR_TOOSMALL, "not even one entry fits")
        p = Packer()
        self._post_op(p, directory, target.export)
        p.fixed(self.cookie_verifier)
        p.extend(body)
        p.boolean(False)
        p.boolean(eof)
        return p

    def _resume(self, cookie: int, directory: str) -> str | None:
        """The name a listing resumes after: cookies 1 and 2 are '.' and '..', the others
        object ids (plus 2), so a cookie outlives a restart."""
        if cookie <= 2:
            return None
        known = self.handles.known(cookie - 2)
        if known is None or paths.split(known.path)[0] != directory:
            raise NfsError(e.NFS3ERR_BAD_COOKIE, f"cookie {cookie}")
        return paths.split(known.path)[1]

    def _dir_entry(
        self,
        entry: Entry,
        name: str,
        object_id: int,
        cookie: int | None,
        export: Export,
        plus: bool,
    ) -> tuple[Packer, int]:
        """One entry3 (or entryplus3) and the size of its name part, which is what
        READDIRPLUS's dircount counts; the cookie is the object id plus 2 unless given."""
        if cookie is None:  # a hard link's other names have cookies of their own
            linked = entry.nlink > 1 and not entry.is_dir
            cookie = (
                self.handles.cookie(object_id, entry.id, entry.path) if linked else object_id
            ) + 2
        # in as few parts as XDR allows: one an entry, not one a word
        raw = name.encode()
        p = Packer()
        p.fixed(
            _ENTRY_HEAD.pack(1, object_id & _U64, len(raw))
            + raw + b"\0" * (-len(raw) % 4)
            + _COOKIE.pack(cookie & _U64)
        )  # fmt: skip
        name_size = p.size
        if plus:
            p.fixed(_TRUE)
            self._fattr(p, entry, object_id, export)
            handle = self.handles.encode(export.id, object_id)
            p.fixed(_HANDLE_HEAD.pack(1, len(handle)) + handle + b"\0" * (-len(handle) % 4))
        return p, name_size

    @nfs_procedure(1)
    async def readdir(self, call: Call) -> Packer:
        return await self._listing(call, plus=False)

    @nfs_procedure(1)
    async def readdirplus(self, call: Call) -> Packer:
        return await self._listing(call, plus=True)

    @nfs_procedure(1)
    async def fsstat(self, call: Call) -> Packer:
        target, who = self._args(call)
        entry = await self._stat(who, target)
        p = Packer()
        self._post_op(p, entry, target.export)
        # the namespace spans volumes and sites: no one figure is its free space
        for value in (1 << 50, 1 << 49, 1 << 49, 1 << 32, 1 << 31, 1 << 31):
            p.uhyper(value)
        p.uint(0)  # invarsec: the figures may change at any time
        return p

    @nfs_procedure(1)
    async def fsinfo(self, call: Call) -> Packer:
        target, who = self._args(call)
        entry = await self._stat(who, target)
        p = Packer()
        self._post_op(p, entry, target.export)
        for value in (MAX_IO, MAX_IO, 4096, MAX_IO, MAX_IO, 4096, 64 << 10):
            p.uint(value)
        p.uhyper((1 << 63) - 1)
        p.uint(0)
        p.uint(1)  # time_delta: nanoseconds
        p.uint(FSF3_LINK | FSF3_SYMLINK | FSF3_HOMOGENEOUS | FSF3_CANSETTIME)
        return p

    @nfs_procedure(1)
    async def pathconf(self, call: Call) -> Packer:
        target, who = self._args(call)
        entry = await self._stat(who, target)
        p = Packer()
        self._post_op(p, entry, target.export)
        p.uint(32000)  # linkmax
        p.uint(NAME_MAX)
        for flag in (True, True, False, True):  # no_trunc, chown_restricted, case_*
            p.boolean(flag)
        return p

    # -- MOUNT procedures ------------------------------------------------------------------

    def _export_of(self, path: str) -> Export | None:
        found = [x for x in self.exports.values() if paths.is_within(path, x.path)]
        return max(found, key=lambda x: len(x.path), default=None)

    async def mnt(self, call: Call) -> Packer:
        raw = call.args.string(MNTPATHLEN)
        await self.refresh()
        p = Packer()
        try:
            path = paths.normalize(raw)
        except LoomError:
            p.uint(e.NFS3ERR_NOENT)
            return p
        export = self._export_of(path)
        if export is None:
            p.uint(e.NFS3ERR_NOENT)
            return p
        if not export.admits(call.peer):
            log.info("nfs mount refused", extra={"peer": call.peer, "path": path})
            p.uint(e.NFS3ERR_ACCES)
            return p
        who = self.who(call, export)
        try:
            entry = await self.ns.stat(who, path)
        except PermissionDenied:
            # mounting is not reading: each call through the handle is decided on its own
            entry = None
        except LoomError as exc:
            p.uint(to_nfsstat(exc))
            return p
        if entry is not None and not entry.is_dir:
            p.uint(e.NFS3ERR_NOTDIR)
            return p
        object_id = self.handles.id(path, None if entry is None else entry.id)
        self.mounts.add((call.peer, path))
        p.uint(MNT3_OK)
        p.opaque(self.handles.encode(export.id, object_id))
        flavors = [AUTH_SYS, AUTH_NONE] if export.anonymous else [AUTH_SYS]
        p.uint(len(flavors))
        for flavor in flavors:
            p.uint(flavor)
        return p

    async def dump(self, call: Call) -> Packer:
        p = Packer()
        for host, path in sorted(self.mounts):
            p.boolean(True)
            p.string(host)
            p.string(path)
        p.boolean(False)
        return p

    async def umnt(self, call: Call) -> Packer:
        raw = call.args.string(MNTPATHLEN)
        self.mounts.discard((call.peer, raw))
        return Packer()

    async def umntall(self, call: Call) -> Packer:
        self.mounts = {(h, path) for h, path in self.mounts if h != call.peer}
        return Packer()

    async def export(self, call: Call) -> Packer:
        """The exports the caller may mount (a client such as libnfs mounts every one below
        the one it was asked for, and fails as a whole if one refuses it)."""
        await self.refresh()
        p = Packer()
        mine = [x for x in self.exports.values() if x.admits(call.peer)]
        for export in sorted(mine, key=lambda x: x.path):
            p.boolean(True)
            p.string(export.path)
            for network in export.networks:
                p.boolean(True)
                p.string(str(network))
            p.boolean(False)
        p.boolean(False)
        return p


def _verifier_ns(verifier: bytes) -> int:
    seconds = int.from_bytes(verifier[:4], "big")
    nanos = int.from_bytes(verifier[4:], "big") % 1_000_000_000
    return seconds * 1_000_000_000 + nanos
