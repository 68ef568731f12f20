"""The WAN emulators: bytes arrive intact, cuts drop and refuse, pacing arithmetic; the
kernel-shaped link carries bytes intact through its relay, from another namespace."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import struct
import subprocess
import threading
from collections.abc import AsyncIterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loomfs.testing.kwan import KernelLink
from loomfs.testing.wan import LinkEmulator, TokenBucket


@pytest.fixture
async def echo() -> AsyncIterator[int]:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    yield int(server.sockets[0].getsockname()[1])
    server.close()
    await server.wait_closed()


async def roundtrip(port: int, payload: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(payload)
    writer.write_eof()
    got = await reader.read()
    writer.close()
    return got


async def test_bytes_cross_intact_and_are_counted(echo: int) -> None:
    payload = os.urandom(3 * 1024 * 1024 + 7)
    async with LinkEmulator("127.0.0.1", echo, rate=200e6, latency=0.002) as link:
        assert await roundtrip(link.port, payload) == payload
        results = await asyncio.gather(*(roundtrip(link.port, payload[:100_000]) for _ in range(4)))
        assert all(r == payload[:100_000] for r in results)
    assert link.up.bytes == link.down.bytes == len(payload) + 4 * 100_000


async def test_cut_drops_and_refuses_until_restored(echo: int) -> None:
    async with LinkEmulator("127.0.0.1", echo) as link:
        reader, writer = await asyncio.open_connection("127.0.0.1", link.port)
        writer.write(b"ping")
        assert await reader.readexactly(4) == b"ping"
        link.cut()
        assert link.is_cut
        with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
            writer.write(b"more")
            await writer.drain()
            await reader.readexactly(4)
        writer.close()
        with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
            r2, w2 = await asyncio.open_connection("127.0.0.1", link.port)
            w2.write(b"x")
            await r2.readexactly(1)
        link.restore()
        assert await roundtrip(link.port, b"back again") == b"back again"


def reset(writer: asyncio.StreamWriter) -> None:
    """Drop a connection as a killed process's is dropped: a reset, not an end of file."""
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def test_a_reset_on_either_side_drops_the_other_at_once() -> None:
    """A killed hub resets its connections: the client behind the link hears it then,
    not at its read timeout (and the same for a client that resets)."""
    server_side: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]]
    server_side = asyncio.Queue()

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server_side.put((reader, writer))

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = int(server.sockets[0].getsockname()[1])
    try:
        async with LinkEmulator("127.0.0.1", port) as link:
            for upstream_resets in (True, False):
                reader, writer = await asyncio.open_connection("127.0.0.1", link.port)
                writer.write(b"ping")
                far_reader, far_writer = await server_side.get()
                assert await far_reader.readexactly(4) == b"ping"
                resetting, waiting = (
                    (far_writer, reader) if upstream_resets else (writer, far_reader)
                )
                reset(resetting)
                async with asyncio.timeout(30):  # a hang guard: today's bug waited forever
                    with contextlib.suppress(ConnectionError):
                        assert await waiting.read() == b""
                for w in (writer, far_writer):
                    w.close()
    finally:
        server.close()
        await server.wait_closed()


async def test_unreachable_target_closes_the_client(echo: int) -> None:
    async with LinkEmulator("127.0.0.1", 9) as link:
        assert await roundtrip(link.port, b"hello") == b""


def test_token_bucket_paces_to_the_rate() -> None:
    now = [0.0]
    bucket = TokenBucket(rate=1000.0, burst=500, clock=lambda: now[0])
    assert bucket.delay(500) == 0.0  # the burst goes at once
    assert bucket.delay(1000) == pytest.approx(1.0)  # then 1000 bytes take a second
    now[0] = 1.0
    assert bucket.delay(500) == pytest.approx(0.5)
    now[0] = 10.0  # idle time refills at most one burst
    assert bucket.delay(500) == 0.0
    assert bucket.delay(1) == pytest.approx(0.001)
    with pytest.raises(ValueError):
        TokenBucket(rate=0)


# ---------------------------------------------------------------- the kernel-shaped link


def _echo_in(link: KernelLink) -> int:
    """An echo server on the far namespace's loopback (a thread per connection); its port."""
    server = link.in_netns(lambda: socket.create_server(("127.0.0.1", 0)))

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                while data := conn.recv(65536):
                    conn.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    return int(server.getsockname()[1])


def _send_and_end(sock: socket.socket, payload: bytes) -> None:
    sock.sendall(payload)
    sock.shutdown(socket.SHUT_WR)


@given(sizes=st.lists(st.integers(0, 3 << 20), min_size=1, max_size=3))
@settings(max_examples=4, deadline=None)
def test_the_kernel_link_carries_bytes_intact_both_ways_through_its_relay(
    sizes: list[int],
) -> None:
    with KernelLink(rate=400e6, latency=0.001) as link:
        port = _echo_in(link)
        host, relayed = link.forward(port)
        before = link.down.bytes
        for size in sizes:
            payload = os.urandom(size)
            with socket.create_connection((host, relayed)) as sock:
                sender = threading.Thread(target=_send_and_end, args=(sock, payload))
                sender.start()
                got = bytearray()
                while data := sock.recv(1 << 20):
                    got += data
                sender.join()
            assert bytes(got) == payload
        assert link.down.bytes - before >= sum(sizes)  # it crossed the veth pair
        assert link.cpu_seconds() >= 0.0
    assert link.netns not in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                            text=True, check=True).stdout  # fmt: skip


def test_a_reply_crosses_the_relay_whole_while_the_connection_stays_open() -> None:
    # a request and its reply, the next request only after it: a blocking splice held
    # the reply's tail in the relay until more bytes came (kernel 6.18), which never did
    with KernelLink(rate=100e6, latency=0.02) as link:
        host, relayed = link.forward(_echo_in(link))
        with socket.create_connection((host, relayed)) as sock:
            sock.settimeout(30)  # a hang fails the test instead of stopping the suite
            for size in (524_588, 3_000, 524_588, 1_100_000, 524_588):
                payload = os.urandom(size)
                sock.sendall(payload)
                got = bytearray()
                while len(got) < size:
                    data = sock.recv(1 << 20)
                    assert data, "the relay closed the connection"
                    got += data
                assert bytes(got) == payload
