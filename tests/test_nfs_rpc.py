"""The ONC RPC edge of the NFS server on its own: record marking cut from a byte stream in
any chunks, calls answered inline or by a task, backpressure, and the connection closed
(and the server unharmed) at a fragment header no client sends. In process, on loopback."""

from __future__ import annotations

import asyncio
import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loomfs.protocols.nfs import rpc
from loomfs.protocols.nfs.rpc import (
    AUTH_SYS,
    CONCURRENCY,
    MAX_RECORD,
    BadFragment,
    Call,
    Program,
    RecordReader,
    RecordTooLarge,
    RpcServer,
    record,
)
from loomfs.protocols.nfs.xdr import Packer, Unpacker
from loomfs.testing.nfs import RpcClient, auth_sys

PROG = 400001
ECHO, ECHO_LATER, HOLD = 1, 2, 3


def _fragments(payload: bytes, cuts: list[int], empty_last: bool) -> bytes:
    """``payload`` in record marking, cut at ``cuts`` (an empty last fragment after it
    where ``empty_last``)."""
    points = sorted({c % len(payload) for c in cuts} - {0}) if payload else []
    pieces = [payload[a:b] for a, b in zip([0, *points], [*points, len(payload)], strict=True)]
    if empty_last and payload:
        pieces.append(b"")
    out = b""
    for i, piece in enumerate(pieces):
        last = 0x80000000 if i == len(pieces) - 1 else 0
        out += (last | len(piece)).to_bytes(4, "big") + piece
    return out


def _chunks(stream: bytes, how: str, sizes: list[int]) -> list[bytes]:
    if how == "bytes":
        return [stream[i : i + 1] for i in range(len(stream))]
    if how == "whole":
        return [stream]
    out, pos = [], 0
    for size in sizes:
        out.append(stream[pos : pos + size])
        pos += size
    out.append(stream[pos:])
    return out


calls_st = st.lists(
    st.tuples(
        st.binary(max_size=300),
        st.lists(st.integers(0, 1000), max_size=6),
        st.booleans(),
    ),
    min_size=1,
    max_size=12,
)
chunking_st = st.tuples(
    st.sampled_from(["bytes", "whole", "random"]),
    st.lists(st.integers(1, 200), max_size=40),
)


@settings(max_examples=150, deadline=None)
@given(calls=calls_st, chunking=chunking_st)
def test_records_in_any_fragments_and_chunks_decode_to_the_same_records(
    calls: list[tuple[bytes, list[int], bool]], chunking: tuple[str, list[int]]
) -> None:
    stream = b"".join(_fragments(*call) for call in calls)
    reader = RecordReader()
    got: list[bytes] = []
    for chunk in _chunks(stream, *chunking):
        got += reader.feed(chunk)
    assert got == [payload for payload, _, _ in calls]
    assert reader.idle


@settings(max_examples=50, deadline=None)
@given(
    whole=st.integers(0, 3),
    length=st.integers(1, 0x7FFFFFFF),
    last=st.booleans(),
)
def test_a_fragment_header_no_client_sends_is_refused_before_its_bytes(
    whole: int, length: int, last: bool
) -> None:
    reader = RecordReader(limit=1000)
    good = b"".join(record(bytes([i]) * 10) for i in range(whole))
    assert reader.feed(good) == [bytes([i]) * 10 for i in range(whole)]
    if length > 1000:  # past the limit: refused from the header alone
        with pytest.raises(RecordTooLarge):
            reader.feed(((0x80000000 if last else 0) | length).to_bytes(4, "big"))
    else:  # an empty fragment that is not a record's last
        assert reader.feed(length.to_bytes(4, "big") + b"x" * length) == []  # a first part
        with pytest.raises(BadFragment):
            reader.feed((0).to_bytes(4, "big"))


# -- over a socket -----------------------------------------------------------------------


class _Echo:
    """A program whose procedures answer their arguments: at once, after a wait, or after
    ``release`` (counting how many are held at once)."""

    def __init__(self) -> None:
        self.held = 0
        self.most = 0
        self.release = asyncio.Event()
        self.full = asyncio.Event()

    async def echo(self, call: Call) -> Packer:
        p = Packer()
        p.fixed(bytes(call.args.data[call.args.pos :]))
        return p

    async def echo_later(self, call: Call) -> Packer:
        await asyncio.sleep(0)
        assert asyncio.current_task() is not None  # the rest runs in a task
        return await self.echo(call)

    async def hold(self, call: Call) -> Packer:
        self.held += 1
        self.most = max(self.most, self.held)
        if self.held == CONCURRENCY:
            self.full.set()
        await self.release.wait()
        self.held -= 1
        return await self.echo(call)

    def program(self) -> Program:
        procedures = {ECHO: self.echo, ECHO_LATER: self.echo_later, HOLD: self.hold}
        return Program(PROG, 1, procedures, inline=frozenset({ECHO, ECHO_LATER}))


def _pad(data: bytes) -> bytes:
    return data + b"\0" * (-len(data) % 4)


@settings(max_examples=30, deadline=None)
@given(calls=calls_st, chunking=chunking_st, later=st.lists(st.booleans(), min_size=12))
def test_calls_in_any_fragments_and_chunks_are_each_answered_once(
    calls: list[tuple[bytes, list[int], bool]], chunking: tuple[str, list[int]], later: list[bool]
) -> None:
    async def run() -> None:
        echo = _Echo()
        server = RpcServer([echo.program()])
        port = await server.start("127.0.0.1", 0)
        try:
            async with RpcClient(port) as c:
                wanted, stream = {}, b""
                for (args, cuts, empty_last), slow in zip(calls, later, strict=False):
                    xid, header = c.header(PROG, 1, ECHO_LATER if slow else ECHO)
                    stream += _fragments(header.value() + args, cuts, empty_last)
                    wanted[xid] = _pad(args)
                for chunk in _chunks(stream, *chunking):
                    await c.send_raw(chunk)
                got = {}
                for _ in wanted:
                    reply = await c.receive()
                    assert reply is not None
                    # xid, REPLY, MSG_ACCEPTED, AUTH_NONE verifier, SUCCESS; the echo
                    got[int.from_bytes(reply[:4], "big")] = reply[24:]
                assert got == wanted
        finally:
            await server.stop()

    asyncio.run(run())


def test_reading_pauses_while_concurrency_calls_wait_and_every_call_is_answered() -> None:
    async def run() -> None:
        echo = _Echo()
        server = RpcServer([echo.program()])
        port = await server.start("127.0.0.1", 0)
        try:
            async with RpcClient(port) as c:
                xids = set()
                stream = b""
                for i in range(3 * CONCURRENCY):
                    xid, header = c.header(PROG, 1, HOLD)
                    stream += record(header.value() + i.to_bytes(4, "big"))
                    xids.add(xid)
                await c.send_raw(stream)
                await echo.full.wait()
                await asyncio.sleep(0.05)  # a server that reads on would start more now
                (connection,) = server.connections
                assert not connection.reading  # the rest waits in the socket and the queue
                echo.release.set()
                answered = set()
                for _ in xids:
                    reply = await c.receive()
                    assert reply is not None
                    answered.add(int.from_bytes(reply[:4], "big"))
                assert answered == xids
                assert echo.most == CONCURRENCY
                assert connection.reading
        finally:
            await server.stop()

    asyncio.run(run())


@pytest.mark.parametrize(
    "bad",
    [
        (MAX_RECORD + 1).to_bytes(4, "big"),
        (0x80000000 | 0x7FFFFFFF).to_bytes(4, "big"),
        (0).to_bytes(4, "big"),
        # the second header alone takes the record past the limit: nothing is left unread
        (600 << 10).to_bytes(4, "big") + b"\0" * (600 << 10) + (600 << 10).to_bytes(4, "big"),
    ],
    ids=["over-the-limit", "huge-last", "empty-not-last", "fragments-over-the-limit"],
)
def test_a_bad_fragment_header_closes_the_connection_with_a_log_line(
    bad: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    async def run() -> None:
        echo = _Echo()
        server = RpcServer([echo.program()])
        port = await server.start("127.0.0.1", 0)
        try:
            async with RpcClient(port) as c:
                _, header = c.header(PROG, 1, ECHO)
                await c.send_raw(record(header.value() + b"ok!!") + bad)
                first = await c.receive()  # the call before it is answered
                assert first is not None and first[24:] == b"ok!!"
                assert await c.receive() is None  # then the connection is closed
            async with RpcClient(port) as c:  # and the server still serves
                assert (await c.call(PROG, 1, ECHO, b"more")).body.fixed(4) == b"more"
        finally:
            await server.stop()

    with caplog.at_level(logging.INFO, logger="loomfs.protocols.nfs.rpc"):
        asyncio.run(run())
    assert any("nfs connection closed" in r.getMessage() for r in caplog.records)


WHO = 4


async def _who(call: Call) -> Packer:
    p = Packer()
    assert call.cred is not None
    for word in (call.cred.uid, call.cred.gid, len(call.cred.gids)):
        p.uint(word)
    p.string(call.cred.machine)
    return p


@settings(max_examples=40, deadline=None)
@given(
    creds=st.lists(
        st.tuples(st.integers(0, 5), st.integers(0, 5), st.sampled_from(["a", "bb"])),
        min_size=1,
        max_size=30,
    ),
    remembered=st.integers(1, 4),
)
def test_each_call_is_decided_with_its_own_credential(
    creds: list[tuple[int, int, str]], remembered: int
) -> None:
    server = RpcServer([Program(PROG, 1, {WHO: _who})])

    async def run() -> None:
        for i, (uid, gid, machine) in enumerate(creds):
            p = Packer()
            for word in (i, 0, 2, PROG, 1, WHO, AUTH_SYS):
                p.uint(word)
            p.opaque(auth_sys(uid, gid, machine))
            p.uint(0)
            p.opaque(b"")
            reply = await server.dispatch(p.value(), "127.0.0.1")
            assert reply is not None
            body = Unpacker(reply.value()[24:])
            assert (body.uint(), body.uint(), body.uint(), body.string(8)) == (
                uid,
                gid,
                0,
                machine,
            )

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rpc, "MAX_CREDS", remembered)  # forgetting is taken too
        asyncio.run(run())
    assert len(server._creds) <= remembered
