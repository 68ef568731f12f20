"""HTTP helpers shared by the HTTP protocol edges (protocol layer): REST and S3.

File bodies go out with sendfile when the reader has a local region, and the last byte of
every body is held back until the read is verified, so a file changed in place while it
was sent ends in a short body (the connection is cut), never in a complete-looking mix.
A small body is read whole and verified before the status line, so there it is an error.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
from collections.abc import Callable

from aiohttp import web

from ..errors import Conflict, RangeNotSatisfiable
from ..namespace.base import Reader

log = logging.getLogger(__name__)

# bodies up to this size are read into memory and sent with the headers
SMALL_BODY = 64 * 1024


async def send_body(
    request: web.Request,
    response: web.StreamResponse,
    reader: Reader,
    sent: Callable[[int], None] = lambda n: None,
) -> None:
    """Write the reader's bytes after ``response.prepare``; ``sent`` counts them."""
    if reader.length == 0:
        await reader.verify()
        return
    if reader.region is not None:
        transport = request.transport
        if transport is None:
            raise ConnectionResetError("client went away")
        with os.fdopen(os.dup(reader.region.fd), "rb") as fobj:
            if reader.length > 1:
                await asyncio.get_running_loop().sendfile(
                    transport, fobj, reader.region.offset, reader.length - 1
                )
            last = os.pread(reader.region.fd, 1, reader.region.offset + reader.length - 1)
        await reader.verify()
        await response.write(last)
        sent(reader.length)
        return
    held: bytes | None = None
    async for chunk in reader.chunks():
        if held:
            await response.write(held)
            sent(len(held))
        held = chunk
    await reader.verify()
    if held:
        await response.write(held)
        sent(len(held))


async def small_body(reader: Reader) -> bytes:
    """All of a small reader's bytes, verified. A local region is read with one pread on
    the event loop, as ``send_body`` reads the last byte: for a few KiB, a thread or
    sendfile's setup costs more than the copy (profiled on 4 KiB S3 GETs)."""
    if reader.region is not None:
        data = os.pread(reader.region.fd, reader.length, reader.region.offset)
        if len(data) != reader.length:
            raise Conflict(
                f"file shrank while it was read: {reader.entry.path}", path=reader.entry.path
            )
    else:
        data = b"".join([chunk async for chunk in reader.chunks()])
    await reader.verify()
    return data


async def send_body_or_cut(
    request: web.Request,
    response: web.StreamResponse,
    reader: Reader,
    sent: Callable[[int], None] = lambda n: None,
) -> bool:
    """``send_body`` after the status line went out: on failure the only honest signal
    left is to cut the connection before the last byte. False when it was cut."""
    try:
        await send_body(request, response, reader, sent)
    except Exception as exc:
        level = logging.WARNING if isinstance(exc, Conflict) else logging.ERROR
        log.log(level, "read aborted: %r", exc, extra={"path": reader.entry.path})
        if request.transport is not None:
            request.transport.close()
        return False
    return True


async def serve_reader(
    request: web.Request,
    reader: Reader,
    headers: dict[str, str],
    *,
    ranged: bool,
    sent: Callable[[int], None] = lambda n: None,
) -> web.StreamResponse:
    """Answer a GET or HEAD with ``reader``'s bytes: 206 with Content-Range when a range
    was asked for, else 200; a small body is read and verified first and goes out with
    the headers in one write, a larger one by ``send_body_or_cut``."""
    if ranged:
        end = reader.offset + reader.length - 1
        headers = {**headers, "Content-Range": f"bytes {reader.offset}-{end}/{reader.entry.size}"}
    if request.method != "HEAD" and reader.length <= SMALL_BODY:
        body = await small_body(reader)
        sent(len(body))
        return web.Response(status=206 if ranged else 200, headers=headers, body=body)
    response = web.StreamResponse(status=206 if ranged else 200, headers=headers)
    response.content_length = reader.length
    await response.prepare(request)
    if request.method != "HEAD" and not await send_body_or_cut(request, response, reader, sent):
        return response
    await response.write_eof()
    return response


_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """(offset, length) for a single 'bytes=' range, or None for the whole object.

    A malformed or multi-range header is ignored (RFC 9110 allows serving the whole
    representation); an unsatisfiable one raises ``RangeNotSatisfiable`` (416).
    """
    if not header:
        return None
    match = _RANGE.match(header.strip())
    if match is None or match.group(1) == match.group(2) == "":
        return None
    first, last = match.group(1), match.group(2)
    if first == "":  # suffix: the last N bytes
        count = min(int(last), size)
        if count == 0:
            raise RangeNotSatisfiable(f"range {header} selects nothing of {size} bytes")
        return size - count, count
    start = int(first)
    end = size - 1 if last == "" else min(int(last), size - 1)
    if start >= size or end < start:
        raise RangeNotSatisfiable(f"range {header} is outside 0-{size}")
    return start, end - start + 1
