"""Local reads at a spoke (protocol layer, server side): a loader on the spoke's machine
reads what the spoke's cache holds from the cache file itself, not through its HTTP.

The REST API announces (``GET /v1/local``, answered to an authenticated caller) an abstract
unix socket, named at random when the spoke starts, and a token. A client connects, checks
that the greeting is that token (so a process that took over the name of a spoke gone
since cannot pose as it and collect credentials), then sends requests, one
``SOCK_SEQPACKET`` message each (JSON)::

    {"auth": "Basic ..." | null, "reads": [{"path": "/data/a", "offset": 0, "length": null}]}

and gets one message back, ``{"reads": [answer, ...]}`` in the same order, with one open
descriptor (``SCM_RIGHTS``) for each answer that says ``"fd": true``, in that order:

- ``{"entry": {...}, "fd": true, "offset": o, "length": n}``: read ``n`` bytes at ``o``
  of the descriptor (read-only, of this version's cache file);
- ``{"entry": {...}, "fd": false}``: no local file can be handed out (a sealed cache, a
  write not yet at the hub): read it over HTTP;
- ``{"error": {...}, "status": 403}``: the read's refusal, as the REST API answers it.

Each read is the namespace's ``read`` for the caller the credentials say, as a GET of the
file is: the same decision, the same audit, a cold file fetched into the cache first, the
reads of one request side by side (a batch of planned files is one round trip). A
descriptor is handed out only for a region whose bytes never change while it is open
(``FileRegion.fixed``: verified cache blocks; eviction unlinks the file, which the
descriptor still reads), and only once the read is verified, so it cannot be raced by
eviction, and it opens that one file, never a path the client could bend elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import secrets
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import web

from ..core.types import Principal
from ..errors import InvalidArgument, LoomError
from ..namespace.base import Namespace
from . import wire

log = logging.getLogger(__name__)

ROUTE = f"{wire.API}/local"
#: the most reads one request may ask for (a message carries at most 253 descriptors)
MAX_READS = 64
MAX_MESSAGE = 1 << 20
Answer = tuple[dict[str, Any], int | None]


def socket_address(name: str) -> str:
    """The address of an announced socket name: ``@name`` is Linux's abstract namespace."""
    return "\0" + name[1:] if name.startswith("@") else name


async def send_message(conn: socket.socket, data: bytes, fds: list[int]) -> None:
    """One message with its descriptors, on a non-blocking socket."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            if fds:
                socket.send_fds(conn, [data], fds)
            else:
                conn.sendmsg([data])
            return
        except BlockingIOError:
            await _writable(loop, conn)


async def _writable(loop: asyncio.AbstractEventLoop, conn: socket.socket) -> None:
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_writer(conn.fileno(), wake)
    try:
        await ready
    finally:
        loop.remove_writer(conn.fileno())


def _reads(request: Any) -> list[tuple[str, int, int | None]]:
    reads = request.get("reads") if isinstance(request, dict) else None
    if not isinstance(reads, list) or not 0 < len(reads) <= MAX_READS:
        raise InvalidArgument(f"'reads' must be a list of 1 to {MAX_READS} reads")
    found = []
    for read in reads:
        path = read.get("path") if isinstance(read, dict) else None
        offset, length = (read.get("offset", 0), read.get("length")) if path else (0, None)
        if (
            not isinstance(path, str)
            or type(offset) is not int
            or offset < 0
            or not (length is None or (type(length) is int and length >= 0))
        ):
            raise InvalidArgument("a read is {'path': str, 'offset': int >= 0, 'length': int|null}")
        found.append((path, offset, length))
    return found


def _refusal(exc: LoomError) -> dict[str, Any]:
    return {**wire.error_body(exc), "status": wire.status_of(exc)}


class LocalReads:
    """The spoke's local socket. ``authenticate`` turns a request's ``Authorization``
    header (or none) into its caller, as the REST API's middleware does."""

    def __init__(
        self,
        namespace: Namespace,
        authenticate: Callable[[str | None], Awaitable[Principal]],
    ) -> None:
        self.namespace = namespace
        self.authenticate = authenticate
        self.name = f"@loomfs-local-{secrets.token_hex(8)}"
        self.token = secrets.token_hex(16)
        self._connections: set[asyncio.Task[None]] = set()

    def routes(self) -> list[web.RouteDef]:
        async def announce(request: web.Request) -> web.Response:
            return web.json_response({"socket": self.name, "token": self.token})

        return [web.get(ROUTE, announce)]

    async def serving(self, app: web.Application) -> AsyncIterator[None]:
        """Listen while the REST app runs (an aiohttp cleanup context)."""
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        listener.setblocking(False)
        listener.bind(socket_address(self.name))
        listener.listen(128)
        accepting = asyncio.create_task(self._accept(listener))
        try:
            yield
        finally:
            accepting.cancel()
            for task in [accepting, *self._connections]:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            listener.close()

    async def _accept(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            conn, _ = await loop.sock_accept(listener)
            conn.setblocking(False)
            task = asyncio.create_task(self._serve(conn))
            self._connections.add(task)
            task.add_done_callback(self._connections.discard)

    async def _serve(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        try:
            await send_message(conn, json.dumps({"token": self.token}).encode(), [])
            while message := await loop.sock_recv(conn, MAX_MESSAGE):
                answer, fds = await self._answer(message)
                try:
                    await send_message(conn, json.dumps(answer).encode(), fds)
                finally:
                    for fd in fds:
                        os.close(fd)
        except OSError as exc:  # the client went away, or its process ended
            log.debug("local read connection ended: %s", exc)
        finally:
            conn.close()

    async def _answer(self, message: bytes) -> tuple[dict[str, Any], list[int]]:
        try:
            request = json.loads(message)
            reads = _reads(request)
            who = await self.authenticate(request.get("auth"))
        except json.JSONDecodeError:
            return _refusal(InvalidArgument("a local read request is one JSON object")), []
        except LoomError as exc:
            return _refusal(exc), []
        # side by side: a batch's cold files are fetched together (one after another,
        # bench/train_stall.py's epochs were slower, the link less busy)
        answers: list[Answer] = await asyncio.gather(*(self._open(who, *r) for r in reads))
        return {"reads": [a for a, _ in answers]}, [fd for _, fd in answers if fd is not None]

    async def _open(self, who: Principal, path: str, offset: int, length: int | None) -> Answer:
        try:
            async with await self.namespace.read(who, path, offset, length) as reader:
                answer: dict[str, Any] = {"entry": wire.entry_json(reader.entry)}
                region = reader.region
                if region is None or not region.fixed:
                    return {**answer, "fd": False}, None
                await reader.verify()
                # the client's own: closing the reader (the cache's hold) leaves it open
                fd = fcntl.fcntl(region.fd, fcntl.F_DUPFD_CLOEXEC, 0)
                return {**answer, "fd": True, "offset": region.offset, "length": region.length}, fd
        except LoomError as exc:
            return _refusal(exc), None
