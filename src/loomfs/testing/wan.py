"""A WAN between two sites on one machine (testing layer): a shaping TCP proxy.

The kernel here has no netem, so the link between a hub and a spoke is emulated in
user space: every byte crosses this proxy, which delays it by a one-way latency and paces
it through a token bucket shared by all connections in that direction (a link's bandwidth
is shared, not per connection). ``cut()`` drops every connection and refuses new ones
until ``restore()``, as a dropped link does. Tests, the demo and benchmarks all use it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

CHUNK = 64 * 1024


class TokenBucket:
    """Paces bytes to ``rate`` bytes/s with bursts of at most ``burst`` bytes.

    ``delay(n)`` says how long to wait before ``n`` bytes may go, and books them; the clock
    is injectable so the arithmetic can be tested without sleeping.
    """

    def __init__(
        self, rate: float, burst: int | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if rate <= 0:
            raise ValueError("rate must be positive")
        self.rate = rate
        self.burst = burst if burst is not None else max(CHUNK, int(rate / 50))
        self._clock = clock
        self._tokens = float(self.burst)
        self._stamp = clock()

    def delay(self, n: int) -> float:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now
        self._tokens -= n
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate


@dataclass(slots=True)
class Direction:
    """One direction of the link: its shaping and what crossed it."""

    rate: float | None = None  # bytes/s; None = unshaped
    latency: float = 0.0  # one-way seconds
    bytes: int = 0
    bucket: TokenBucket | None = field(default=None, repr=False)

    def reshape(self, rate: float | None, latency: float) -> None:
        self.rate, self.latency = rate, latency
        self.bucket = TokenBucket(rate) if rate else None


class LinkEmulator:
    """Listens on 127.0.0.1 and forwards to ``target``, shaped both ways."""

    def __init__(
        self,
        target_host: str,
        target_port: int,
        *,
        rate: float | None = None,
        latency: float = 0.0,
        listen_port: int = 0,
    ) -> None:
        self.target = (target_host, target_port)
        self.listen_port = listen_port
        self.up = Direction()  # client -> target
        self.down = Direction()  # target -> client
        self.shape(rate, latency)
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._cut = False

    def shape(self, rate: float | None, latency: float = 0.0) -> None:
        """Set bandwidth (bytes/s, each direction) and one-way latency (seconds)."""
        self.up.reshape(rate, latency)
        self.down.reshape(rate, latency)

    @property
    def port(self) -> int:
        assert self._server is not None, "start() first"
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> LinkEmulator:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.listen_port)
        return self

    async def stop(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        await asyncio.gather(*self._connections, return_exceptions=True)

    def cut(self) -> None:
        """Drop every connection now and refuse new ones until ``restore()``."""
        self._cut = True
        for task in list(self._connections):
            task.cancel()

    def restore(self) -> None:
        self._cut = False

    @property
    def is_cut(self) -> bool:
        return self._cut

    async def __aenter__(self) -> LinkEmulator:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._cut:
            writer.transport.abort()
            return
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            self._connections.discard(task)
            return
        pipes = [
            asyncio.create_task(self._pipe(reader, up_writer, self.up)),
            asyncio.create_task(self._pipe(up_reader, writer, self.down)),
        ]
        try:
            await asyncio.gather(*pipes)
        except (asyncio.CancelledError, ConnectionError):
            pass
        finally:
            # a cancelled gather only asks its pipes to stop: wait until they have, or
            # ``stop`` returns while they still run and the loop closes under them
            for pipe in pipes:
                pipe.cancel()
            await asyncio.gather(*pipes, return_exceptions=True)
            for w in (writer, up_writer):
                w.transport.abort()
            self._connections.discard(task)

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, way: Direction
    ) -> None:
        """Copy one direction: a reader task stamps chunks as they arrive, this one sends
        each when its latency has passed and the bucket allows, keeping the order. The
        end of the stream passes on the same way: an end of file as an end of file, a reset
        (say a killed process's) as a ``ConnectionResetError`` that ends the connection,
        both sides dropped at once (``_accept``), instead of leaving the other side waiting
        for bytes that never come."""
        queue: asyncio.Queue[tuple[float, bytes | None]] = asyncio.Queue(maxsize=256)

        async def receive() -> None:
            try:
                while data := await reader.read(CHUNK):
                    await queue.put((time.monotonic() + way.latency, data))
            except OSError:
                await queue.put((time.monotonic() + way.latency, None))
                return
            await queue.put((0.0, b""))

        receiver = asyncio.create_task(receive())
        try:
            while True:
                due, data = await queue.get()
                if data is None:
                    raise ConnectionResetError("the other side reset the connection")
                if not data:
                    with contextlib.suppress(OSError):
                        writer.write_eof()
                    break
                wait = due - time.monotonic()
                if way.bucket is not None:
                    wait = max(wait, way.bucket.delay(len(data)))
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(data)
                way.bytes += len(data)
                await writer.drain()
            await receiver
        finally:
            receiver.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                await receiver
