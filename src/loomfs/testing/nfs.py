"""NFS clients for tests (testing layer): libnfs's command-line tools, and a small ONC RPC
client that can send what no real client would (garbage, forged handles, unknown programs).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import shutil
import subprocess
from dataclasses import dataclass
from types import TracebackType
from typing import Self

from ..protocols.nfs.pmap import PMAP_PROGRAM, PMAP_VERSION, PMAPPROC_SET, PMAPPROC_UNSET
from ..protocols.nfs.rpc import (
    AUTH_NONE,
    AUTH_SYS,
    CALL,
    MSG_ACCEPTED,
    SUCCESS,
    Call,
    Program,
    RpcServer,
    read_record,
    record,
)
from ..protocols.nfs.server import MOUNT_PROGRAM, NFS_PROGRAM
from ..protocols.nfs.xdr import Packer, Unpacker

LIBNFS_TOOLS = ("nfs-ls", "nfs-cat", "nfs-cp")


def libnfs_tool(name: str) -> str:
    """The path of one of libnfs's tools, or an error that says how to install them."""
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"libnfs's {name} is missing: apt-get install libnfs-utils")
    return found


def nfs_url(port: int, path: str, *, uid: int = 1000, gid: int = 1000) -> str:
    """A libnfs URL for ``path`` on the server at 127.0.0.1:``port``: NFSv3, MOUNT on the
    same port (there is no portmapper), AUTH_SYS as ``uid``/``gid``."""
    query = f"version=3&nfsport={port}&mountport={port}&uid={uid}&gid={gid}"
    return f"nfs://127.0.0.1{path}?{query}"


def libnfs(*args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[bytes]:
    """Run a libnfs tool (``args[0]``) with the rest as its arguments."""
    return subprocess.run(
        [libnfs_tool(args[0]), *args[1:]],
        capture_output=True, timeout=timeout, check=False,
    )  # fmt: skip


@dataclass(frozen=True)
class Reply:
    """An RPC reply: ``accepted`` with its ``stat`` (SUCCESS and the body in ``body``), or
    denied with the reject reason in ``stat``."""

    accepted: bool
    stat: int
    body: Unpacker


def auth_sys(uid: int, gid: int, machine: str = "test") -> bytes:
    p = Packer()
    p.uint(0)
    p.string(machine)
    p.uint(uid)
    p.uint(gid)
    p.uint(0)
    return p.value()


class RpcClient:
    """One TCP connection to an ONC RPC server; calls one at a time."""

    def __init__(
        self, port: int, *, uid: int | None = 1000, gid: int = 1000, host: str = "127.0.0.1"
    ) -> None:
        self.host, self.port = host, port
        self.uid, self.gid = uid, gid
        self._xids = itertools.count(1)
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def __aenter__(self) -> Self:
        self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._writer is not None
        self._writer.close()
        with contextlib.suppress(ConnectionError):  # the server may have closed it first
            await self._writer.wait_closed()

    def header(self, prog: int, vers: int, proc: int, *, rpcvers: int = 2) -> tuple[int, Packer]:
        xid = next(self._xids)
        p = Packer()
        for word in (xid, CALL, rpcvers, prog, vers, proc):
            p.uint(word)
        if self.uid is None:
            p.uint(AUTH_NONE)
            p.opaque(b"")
        else:
            p.uint(AUTH_SYS)
            p.opaque(auth_sys(self.uid, self.gid))
        p.uint(AUTH_NONE)
        p.opaque(b"")
        return xid, p

    async def send_raw(self, data: bytes) -> None:
        assert self._writer is not None
        self._writer.write(data)
        await self._writer.drain()

    async def receive(self) -> bytes | None:
        """The next reply record; None when the server closed the connection."""
        assert self._reader is not None
        try:
            return await read_record(self._reader)
        except (asyncio.IncompleteReadError, ConnectionError):
            return None

    async def call(
        self, prog: int, vers: int, proc: int, args: bytes = b"", *, rpcvers: int = 2
    ) -> Reply:
        xid, p = self.header(prog, vers, proc, rpcvers=rpcvers)
        await self.send_raw(record(p.value() + args))
        data = await self.receive()
        assert data is not None, "the server closed the connection"
        u = Unpacker(data)
        assert u.uint() == xid
        u.uint()  # REPLY
        if u.uint() != MSG_ACCEPTED:
            return Reply(False, u.uint(), u)
        u.uint()
        u.opaque(400)
        return Reply(True, u.uint(), u)

    async def nfs(self, proc: int, args: bytes = b"") -> Unpacker:
        """An NFSv3 call that the RPC layer must accept; its result body (nfsstat3 first)."""
        reply = await self.call(NFS_PROGRAM, 3, proc, args)
        assert reply.accepted and reply.stat == SUCCESS, reply
        return reply.body

    async def mount(self, path: str) -> bytes:
        """MNT ``path``: the root handle (the status must be MNT3_OK)."""
        p = Packer()
        p.string(path)
        reply = await self.call(MOUNT_PROGRAM, 3, 1, p.value())
        assert reply.accepted and reply.stat == SUCCESS, reply
        status = reply.body.uint()
        assert status == 0, f"MNT {path}: status {status}"
        return reply.body.opaque(64)

    async def lookup(self, directory: bytes, name: str) -> tuple[int, bytes | None]:
        """LOOKUP: (nfsstat3, the handle when found)."""
        p = Packer()
        p.opaque(directory)
        p.string(name)
        body = await self.nfs(3, p.value())
        status = body.uint()
        return status, body.opaque(64) if status == 0 else None

    async def status_of(self, proc: int, args: bytes) -> int:
        """The nfsstat3 an NFS call answers with."""
        return (await self.nfs(proc, args)).uint()


def handle_args(handle: bytes, *more: bytes) -> bytes:
    """XDR arguments that start with a file handle."""
    p = Packer()
    p.opaque(handle)
    return p.value() + b"".join(more)


@dataclass(frozen=True)
class Fattr:
    """The fields of an fattr3 the tests look at."""

    type: int
    mode: int
    nlink: int
    size: int
    fileid: int
    mtime_ns: int
    ctime_ns: int = 0
    uid: int = 0
    gid: int = 0


def fattr(body: Unpacker) -> Fattr:
    kind, mode, nlink, uid, gid = (body.uint() for _ in range(5))
    size = body.uhyper()
    body.uhyper()  # used
    body.uhyper()  # rdev
    body.uhyper()  # fsid
    fileid = body.uhyper()
    body.uhyper()  # atime
    mtime_ns = body.uint() * 1_000_000_000 + body.uint()
    ctime_ns = body.uint() * 1_000_000_000 + body.uint()
    return Fattr(kind, mode, nlink, size, fileid, mtime_ns, ctime_ns, uid, gid)


def post_op(body: Unpacker) -> Fattr | None:
    return fattr(body) if body.boolean() else None


def wcc(body: Unpacker) -> Fattr | None:
    """Skip a wcc_data's pre-op part; its post-op attributes."""
    if body.boolean():
        body.fixed(24)
    return post_op(body)


def sattr(
    *, mode: int | None = None, size: int | None = None, mtime_ns: int | None = None
) -> bytes:
    p = Packer()
    for value in (mode, None, None):  # mode, uid, gid
        p.boolean(value is not None)
        if value is not None:
            p.uint(value)
    p.boolean(size is not None)
    if size is not None:
        p.uhyper(size)
    p.uint(0)  # atime: don't change
    if mtime_ns is None:
        p.uint(0)
    else:
        p.uint(2)  # set to the client's time
        p.uint(mtime_ns // 1_000_000_000)
        p.uint(mtime_ns % 1_000_000_000)
    return p.value()


def diropargs(directory: bytes, name: str) -> bytes:
    p = Packer()
    p.opaque(directory)
    p.string(name)
    return p.value()


class FakePortmapper:
    """A portmapper of the test's own on a free loopback port (PMAP v2 SET and UNSET over
    TCP, as rpcbind takes them): ``mappings`` is what is registered, (program, version,
    protocol) -> port."""

    def __init__(self) -> None:
        self.mappings: dict[tuple[int, int, int], int] = {}
        procedures = {PMAPPROC_SET: self._set, PMAPPROC_UNSET: self._unset}
        self._server = RpcServer([Program(PMAP_PROGRAM, PMAP_VERSION, procedures)])

    async def start(self) -> int:
        return await self._server.start("127.0.0.1", 0)

    async def stop(self) -> None:
        await self._server.stop()

    async def _set(self, call: Call) -> Packer:
        program, version, protocol, port = (call.args.uint() for _ in range(4))
        key = (program, version, protocol)
        taken = key not in self.mappings  # as rpcbind: no second registration
        if taken:
            self.mappings[key] = port
        p = Packer()
        p.boolean(taken)
        return p

    async def _unset(self, call: Call) -> Packer:
        program, version = call.args.uint(), call.args.uint()
        for key in [k for k in self.mappings if k[:2] == (program, version)]:
            del self.mappings[key]
        p = Packer()
        p.boolean(True)
        return p
