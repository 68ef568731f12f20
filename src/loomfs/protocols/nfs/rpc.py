"""ONC RPC version 2 (RFC 5531) over TCP with record marking (protocol layer).

One ``RpcServer`` listens on one port and dispatches calls to the programs it serves
(MOUNT and NFS share it, so a client needs no portmapper). A connection is an
``asyncio.Protocol``: records are cut from the bytes as they arrive (``RecordReader``), a
call whose procedure its program marks ``inline`` is answered at once where it finishes
without waiting, and any other call, or one that must wait, runs on as its own task, so a
client's pipelined requests overlap; replies go out as they finish, matched by xid.

What a call cannot be answered for is answered by the RPC layer itself: another RPC
version (RPC_MISMATCH), a credential that is not AUTH_NONE or AUTH_SYS or is malformed
(AUTH_ERROR), an unknown program, version or procedure (PROG_UNAVAIL, PROG_MISMATCH,
PROC_UNAVAIL) and arguments that are not the procedure's XDR (GARBAGE_ARGS). A record is
read whole before it is decoded, and one larger than ``MAX_RECORD`` (fragments counted
together) closes the connection without reading it, so no length a client sends makes the
server allocate more than that; so does an empty fragment that is not a record's last.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import struct
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Generator, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

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
    #: procedures that may run outside a task until they first wait: none that needs
    #: ``asyncio.current_task()`` before then (``asyncio.timeout``, an HTTP client's)
    inline: frozenset[int] = frozenset()


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


class BadRecord(Exception):
    """A fragment header no client sends: the connection is closed after answering
    ``records``, those completed before it."""

    def __init__(self, message: str, records: list[bytes] | None = None) -> None:
        super().__init__(message)
        self.records = records or []


class RecordTooLarge(BadRecord):
    pass


class BadFragment(BadRecord):
    pass


_WORD = struct.Struct(">I")
#: xid, msg_type, rpcvers, prog, vers, proc, the credential's flavor and length
_HEADER = struct.Struct(">8I")
_AUTH = struct.Struct(">2I")  # the verifier's flavor and length
#: AUTH_SYS credentials remembered parsed (a client sends the same one with every call)
MAX_CREDS = 1024


def _call_header(
    record: bytes,
) -> tuple[int, int, int, int, int, int, bytes, int] | None:
    """(xid, rpcvers, prog, vers, proc, credential flavor, credential body, where the
    arguments start) of a call; None for a record that is not one (a reply, or short)."""
    if len(record) < _HEADER.size + _AUTH.size:
        return None
    xid, mtype, rpcvers, prog, vers, proc, flavor, length = _HEADER.unpack_from(record)
    if mtype != CALL or length > MAX_AUTH:
        return None
    verifier = _HEADER.size + length + -length % 4
    if verifier + _AUTH.size > len(record):
        return None
    body = record[_HEADER.size : _HEADER.size + length]
    # the verifier: AUTH_NONE and AUTH_SYS calls carry none worth reading
    length = _AUTH.unpack_from(record, verifier)[1]
    args = verifier + _AUTH.size + length + -length % 4
    if length > MAX_AUTH or args > len(record):
        return None
    return xid, rpcvers, prog, vers, proc, flavor, body, args


class RecordReader:
    """Record marking (RFC 5531 section 11) parsed from the bytes of a stream in whatever
    chunks they arrive: ``feed`` returns the records completed so far, fragments joined.
    ``RecordTooLarge`` for a record over ``limit`` bytes (known from the fragment header,
    before its bytes are kept) and ``BadFragment`` for an empty fragment that is not a
    record's last (nothing sends one, and a stream of them would be work without end);
    either carries the records the same bytes completed before it."""

    def __init__(self, limit: int = MAX_RECORD) -> None:
        self.limit = limit
        self._buf = bytearray()
        self._parts: list[bytes] = []
        self._size = 0

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        buf = self._buf
        buf += data
        records: list[bytes] = []
        pos, have = 0, len(buf)
        while have - pos >= 4:
            (word,) = _WORD.unpack_from(buf, pos)
            length, last = word & 0x7FFFFFFF, word & 0x80000000
            if self._size + length > self.limit:
                raise RecordTooLarge(f"a record of more than {self.limit} bytes", records)
            if not length and not last:
                raise BadFragment("an empty fragment that is not the record's last", records)
            if have - pos - 4 < length:
                break  # the rest of this fragment is still on its way
            fragment = bytes(buf[pos + 4 : pos + 4 + length])
            pos += 4 + length
            if last:
                if self._parts:
                    self._parts.append(fragment)
                    fragment = b"".join(self._parts)
                    self._parts, self._size = [], 0
                records.append(fragment)
            else:
                self._parts.append(fragment)
                self._size += length
        del buf[:pos]
        return records

    @property
    def idle(self) -> bool:
        """No part of a record held: the stream may end here."""
        return not self._buf and not self._parts


class _Resumed:
    """The rest of a coroutine already stepped once inline (``signal``: what it yielded,
    the future it waits for), for a task to drive on: Python 3.12's eager tasks, which
    3.11 has not got."""

    __slots__ = ("coro", "signal")

    def __init__(self, coro: Coroutine[Any, Any, Packer | None], signal: Any) -> None:
        self.coro, self.signal = coro, signal

    def __await__(self) -> Generator[Any, Any, Packer | None]:
        signal = self.signal
        while True:
            try:
                sent = yield signal
            except BaseException as exc:  # cancellation too: the coroutine decides
                try:
                    signal = self.coro.throw(exc)
                except StopIteration as done:
                    return cast("Packer | None", done.value)
            else:
                try:
                    signal = self.coro.send(sent)
                except StopIteration as done:
                    return cast("Packer | None", done.value)


async def _finish(rest: _Resumed) -> Packer | None:
    return await rest


class _Connection(asyncio.Protocol):
    """One client's connection: records parsed as bytes arrive, each call answered inline
    where its procedure allows and finishes without waiting (no task, no loop turn), else
    by a task of its own. Replies go out as calls finish, each in one write, so a reply
    may overtake an earlier call's (the client matches them by xid, as RFC 5531 lets it).
    Reading pauses while ``CONCURRENCY`` calls are in progress or the transport's send
    buffer is full, and resumes as they finish and it drains."""

    def __init__(self, server: RpcServer) -> None:
        self.server = server
        self.reader = RecordReader()
        self.host = ""
        self.transport: asyncio.Transport | None = None
        self.calls: set[asyncio.Task[Packer | None]] = set()
        self.waiting: deque[bytes] = deque()
        self.send_full = False
        self.reading = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.host = str(peer[0]) if isinstance(peer, tuple) else ""
        self.server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        self.waiting.clear()
        for call in list(self.calls):
            call.cancel()

    def data_received(self, data: bytes) -> None:
        try:
            self.waiting.extend(self.reader.feed(data))
        except BadRecord as exc:
            log.info("nfs connection closed: %s", exc, extra={"peer": self.host})
            self.waiting.extend(exc.records)
            self._pump()  # what came before it is answered, as far as it goes at once
            self.close(flush=True)
            return
        self._pump()

    def eof_received(self) -> bool | None:
        return None  # close: a half-closed client sends nothing more to answer

    def pause_writing(self) -> None:
        self.send_full = True
        self._pump()

    def resume_writing(self) -> None:
        self.send_full = False
        self._pump()

    def close(self, *, flush: bool = False) -> None:
        """Close the connection, sending the replies already written where ``flush``."""
        self.waiting.clear()
        if self.transport is None:
            return
        if flush:
            self.transport.close()
        else:
            self.transport.abort()

    def _pump(self) -> None:
        """Answer waiting calls while there is room; read on only while there is."""
        while self.waiting and len(self.calls) < CONCURRENCY and not self.send_full:
            self._start(self.waiting.popleft())
        room = not self.waiting and len(self.calls) < CONCURRENCY and not self.send_full
        transport = self.transport
        if transport is None or transport.is_closing() or room == self.reading:
            return
        self.reading = room
        if room:
            transport.resume_reading()
        else:
            transport.pause_reading()

    def _start(self, record: bytes) -> None:
        context = contextvars.copy_context()  # what a task would run it in
        coro = self.server.dispatch(record, self.host, inline=True)
        try:
            signal = context.run(coro.send, None)
        except StopIteration as done:
            self._send(done.value)
            return
        call = asyncio.get_running_loop().create_task(
            _finish(_Resumed(coro, signal)), context=context
        )
        self.calls.add(call)
        call.add_done_callback(self._finished)

    def _finished(self, call: asyncio.Task[Packer | None]) -> None:
        self.calls.discard(call)
        if not call.cancelled():
            self._send(call.result())  # dispatch answers every error itself
        self._pump()

    def _send(self, reply: Packer | None) -> None:
        transport = self.transport
        if reply is None or transport is None or transport.is_closing():
            return
        # one write per reply: a record marker sent on its own is a packet of its own
        # (TCP_NODELAY), a second wakeup of the client for every call
        transport.write(b"".join([_WORD.pack(0x80000000 | reply.size), *reply.parts]))


class RpcServer:
    """Serves ``programs`` on one TCP port."""

    def __init__(self, programs: list[Program]) -> None:
        self.programs: dict[int, dict[int, Program]] = {}
        for program in programs:
            self.programs.setdefault(program.number, {})[program.version] = program
        self._server: asyncio.Server | None = None
        self.connections: set[_Connection] = set()
        self._creds: dict[bytes, AuthSys] = {}

    async def start(self, host: str, port: int) -> int:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Connection(self), host, port)
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        calls = [call for connection in self.connections for call in connection.calls]
        for connection in list(self.connections):
            connection.close()
        for call in calls:
            call.cancel()
        await asyncio.gather(*calls, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def dispatch(self, record: bytes, host: str, *, inline: bool = False) -> Packer | None:
        """The reply to one record; None for what is not a call (nothing to answer).
        ``inline``: the caller steps this coroutine outside a task until it first waits,
        so a procedure the program does not mark inline is made to wait a loop turn first
        (it may need ``asyncio.current_task()`` before its first wait, as timeouts do)."""
        head = _call_header(record)
        if head is None:
            return None  # not even a call header: nothing to name in a reply
        xid, rpcvers, prog, vers, proc, flavor, body, args = head
        if rpcvers != 2:
            return denied(xid, RPC_MISMATCH, 2, 2)
        cred = self._creds.get(body) if flavor == AUTH_SYS else None
        if cred is None:
            try:
                cred = _parse_cred(flavor, body)
            except RpcDenied as exc:
                return denied(xid, AUTH_ERROR, exc.stat)
            if cred is not None:
                if len(self._creds) >= MAX_CREDS:
                    self._creds.clear()
                self._creds[body] = cred
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
        if inline and proc not in program.inline:
            await asyncio.sleep(0)
        try:
            u = Unpacker(record)
            u.pos = args
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


async def read_record(reader: asyncio.StreamReader, limit: int = MAX_RECORD) -> bytes | None:
    """One record (its fragments joined) from a stream (a client's side); None at a clean
    end of the stream."""
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
