"""ONC RPC version 2 (RFC 5531) over TCP with record marking (protocol layer).

One ``RpcServer`` listens on one port and dispatches calls to the programs it serves
(MOUNT and NFS share it, so a client needs no portmapper). Each call runs as its own task,
so a client's pipelined requests overlap; replies go out as they finish, matched by xid.

What a call cannot be answered for is answered by the RPC layer itself: another RPC
version (RPC_MISMATCH), a credential that is not AUTH_NONE or AUTH_SYS or is malformed
(AUTH_ERROR), an unknown program, version or procedure (PROG_UNAVAIL, PROG_MISMATCH,
PROC_UNAVAIL) and arguments that are not the procedure's XDR (GARBAGE_ARGS). A record is
read whole before it is decoded, and one larger than ``MAX_RECORD`` (fragments counted
together) closes the connection without reading it, so no length a client sends makes the
server allocate more than that.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from .xdr import Packer, Unpacker, XdrError

log = logging.getLogger(__name__)

#: a 1 MiB WRITE (FSINFO's wtmax) with its headers fits; nothing larger is read
MAX_RECORD = (1 << 20) + (64 << 10)
#: calls of one connection in progress at once
CONCURRENCY = 32

CALL, REPLY = 0, 1
MSG_ACCEPTED, MSG_DENIED = 0, 1
SUCCESS, PROG_UNAVAIL, PROG_MISMATCH, PROC_UNAVAIL, GARBAGE_ARGS, SYSTEM_ERR = range(6)
RPC_MISMATCH, AUTH_ERROR = 0, 1
AUTH_BADCRED, AUTH_TOOWEAK = 1, 5
AUTH_NONE, AUTH_SYS = 0, 1
MAX_AUTH = 400  # RFC 5531: opaque_auth bodies are at most 400 bytes
MAX_MACHINE_NAME = 255
MAX_GIDS = 16


@dataclass(frozen=True, slots=True)
class AuthSys:
    uid: int
    gid: int
    gids: tuple[int, ...]
    machine: str


@dataclass(slots=True)
class Call:
    xid: int
    prog: int
    vers: int
    proc: int
    #: None: AUTH_NONE
    cred: AuthSys | None
    args: Unpacker
    #: the client's address as the socket reports it
    peer: str


class RpcDenied(Exception):
    """Refuse a call with MSG_DENIED AUTH_ERROR (a procedure that needs a stronger
    credential than the call carries)."""

    def __init__(self, stat: int = AUTH_TOOWEAK) -> None:
        super().__init__(stat)
        self.stat = stat


Procedure = Callable[[Call], Awaitable[Packer]]


@dataclass
class Program:
    number: int
    version: int
    procedures: Mapping[int, Procedure] = field(default_factory=dict)


def _parse_cred(flavor: int, body: bytes) -> AuthSys | None:
    if flavor == AUTH_NONE:
        return None
    if flavor != AUTH_SYS:
        raise RpcDenied(AUTH_TOOWEAK)
    try:
        u = Unpacker(body)
        u.uint()  # stamp
        machine = u.string(MAX_MACHINE_NAME)
        uid, gid = u.uint(), u.uint()
        count = u.uint()
        if count > MAX_GIDS:
            raise XdrError(f"{count} groups in AUTH_SYS")
        gids = tuple(u.uint() for _ in range(count))
        u.done()
    except XdrError:
        raise RpcDenied(AUTH_BADCRED) from None
    return AuthSys(uid, gid, gids, machine)


def _reply_header(xid: int) -> Packer:
    p = Packer()
    p.uint(xid)
    p.uint(REPLY)
    return p


def accepted(xid: int, stat: int) -> Packer:
    """The header of an accepted reply (AUTH_NONE verifier) with ``stat``."""
    p = _reply_header(xid)
    p.uint(MSG_ACCEPTED)
    p.uint(AUTH_NONE)
    p.uint(0)
    p.uint(stat)
    return p


def denied(xid: int, reason: int, value: int, high: int = 0) -> Packer:
    p = _reply_header(xid)
    p.uint(MSG_DENIED)
    p.uint(reason)
    p.uint(value)
    if reason == RPC_MISMATCH:
        p.uint(high)
    return p


class RpcServer:
    """Serves ``programs`` on one TCP port."""

    def __init__(self, programs: list[Program]) -> None:
        self.programs: dict[int, dict[int, Program]] = {}
        for program in programs:
            self.programs.setdefault(program.number, {})[program.version] = program
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    async def start(self, host: str, port: int) -> int:
        self._server = await asyncio.start_server(self._serve, host, port)
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await asyncio.sleep(0)  # a connection accepted just now gets to its task first
        for task in list(self._connections):
            task.cancel()
        for task in list(self._connections):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._server is not None:
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        peer = writer.get_extra_info("peername")
        host = str(peer[0]) if isinstance(peer, tuple) else ""
        slots = asyncio.Semaphore(CONCURRENCY)
        calls: set[asyncio.Task[None]] = set()
        try:
            while True:
                record = await read_record(reader)
                if record is None:
                    break
                await slots.acquire()
                call = asyncio.create_task(self._answer(record, host, writer, slots))
                calls.add(call)
                call.add_done_callback(calls.discard)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away, or cut a record short: nothing to answer
        except RecordTooLarge as exc:
            log.info("nfs connection closed: %s", exc, extra={"peer": host})
        finally:
            for call in list(calls):
                call.cancel()
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            self._connections.discard(task)

    async def _answer(
        self, record: bytes, host: str, writer: asyncio.StreamWriter, slots: asyncio.Semaphore
    ) -> None:
        try:
            reply = await self.dispatch(record, host)
            if reply is not None and not writer.is_closing():
                # one send per reply: a record marker sent on its own is a packet of its
                # own (TCP_NODELAY), a second wakeup of the client for every call
                marker = (0x80000000 | reply.size).to_bytes(4, "big")
                writer.writelines([marker, *reply.parts])
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            slots.release()

    async def dispatch(self, record: bytes, host: str) -> Packer | None:
        """The reply to one record; None for what is not a call (nothing to answer)."""
        u = Unpacker(record)
        try:
            xid, mtype = u.uint(), u.uint()
            if mtype != CALL:
                return None
            rpcvers = u.uint()
            prog, vers, proc = u.uint(), u.uint(), u.uint()
            flavor, body = u.uint(), u.opaque(MAX_AUTH)
            u.uint()  # the verifier's flavor: AUTH_NONE and AUTH_SYS calls carry none
            u.opaque(MAX_AUTH)
        except XdrError:
            return None  # not even a call header: nothing to name in a reply
        if rpcvers != 2:
            return denied(xid, RPC_MISMATCH, 2, 2)
        try:
            cred = _parse_cred(flavor, body)
        except RpcDenied as exc:
            return denied(xid, AUTH_ERROR, exc.stat)
        versions = self.programs.get(prog)
        if versions is None:
            return accepted(xid, PROG_UNAVAIL)
        program = versions.get(vers)
        if program is None:
            reply = accepted(xid, PROG_MISMATCH)
            reply.uint(min(versions))
            reply.uint(max(versions))
            return reply
        procedure = program.procedures.get(proc)
        if procedure is None:
            return accepted(xid, PROC_UNAVAIL)
        try:
            body_out = await procedure(Call(xid, prog, vers, proc, cred, u, host))
        except XdrError as exc:
            log.debug("garbage args", extra={"prog": prog, "proc": proc, "reason": str(exc)})
            return accepted(xid, GARBAGE_ARGS)
        except RpcDenied as exc:
            return denied(xid, AUTH_ERROR, exc.stat)
        except Exception:
            log.exception("unexpected error in an nfs call", extra={"prog": prog, "proc": proc})
            return accepted(xid, SYSTEM_ERR)
        reply = accepted(xid, SUCCESS)
        reply.extend(body_out)
        return reply


class RecordTooLarge(Exception):
    pass


async def read_record(reader: asyncio.StreamReader, limit: int = MAX_RECORD) -> bytes | None:
    """One record (its fragments joined); None at a clean end of the stream."""
    parts: list[bytes] = []
    size = 0
    while True:
        try:
            marker = await reader.readexactly(4)
        except asyncio.IncompleteReadError as exc:
            if not exc.partial and not parts:
                return None
            raise
        word = int.from_bytes(marker, "big")
        length = word & 0x7FFFFFFF
        size += length
        if size > limit:
            raise RecordTooLarge(f"a record of more than {limit} bytes")
        parts.append(await reader.readexactly(length))
        if word & 0x80000000:
            return b"".join(parts)


def record(payload: bytes) -> bytes:
    """``payload`` as one last fragment: what a client sends."""
    return (0x80000000 | len(payload)).to_bytes(4, "big") + payload
