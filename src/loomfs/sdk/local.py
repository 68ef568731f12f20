"""Local reads from a spoke on this machine (protocol layer, client side): the bytes of a
cached file come from the cache file, read with ``pread`` on a descriptor the spoke hands
over its local socket (``rest.local``), not through the spoke's HTTP.

Synchronous and per process on purpose: a DataLoader worker calls it from its own thread,
with no hop to an I/O loop, and a forked worker opens a connection of its own (a socket
shared across a fork would interleave two processes' answers). Whoever cannot read
locally (a spoke on another machine, one that hands out no descriptor for a file) is
told so with ``None`` and reads over HTTP.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from collections.abc import Sequence
from typing import Any

from ..errors import Conflict, LoomError
from ..rest import wire
from ..rest.local import MAX_MESSAGE, MAX_READS, socket_address

log = logging.getLogger(__name__)

#: a read: (namespace path, offset, length or None for the rest of the file)
Read = tuple[str, int, int | None]


class LocalReader:
    """Reads through one spoke's local socket, as the caller ``authorization`` (an HTTP
    ``Authorization`` header value, or None: the anonymous caller) names."""

    def __init__(self, announcement: dict[str, Any], authorization: str | None) -> None:
        self.address = socket_address(str(announcement["socket"]))
        self.token = str(announcement["token"])
        self.authorization = authorization
        self._sock: socket.socket | None = None
        self._pid = 0

    def connect(self) -> bool:
        """Whether the spoke is on this machine and answers as itself."""
        try:
            self._connection()
        except (OSError, LoomError) as exc:
            log.info("no local reads from the spoke (reading over HTTP): %s", exc)
            return False
        return True

    def _connection(self) -> socket.socket:
        if self._sock is not None and self._pid == os.getpid():
            return self._sock
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            sock.connect(self.address)
            greeting = json.loads(sock.recv(MAX_MESSAGE) or b"{}")
        except (OSError, ValueError):
            sock.close()
            raise
        if greeting.get("token") != self.token:
            sock.close()
            raise LoomError(f"the socket {self.address!r} is not the spoke that announced it")
        self._sock, self._pid = sock, os.getpid()
        return sock

    def close(self) -> None:
        if self._sock is not None and self._pid == os.getpid():
            self._sock.close()
        self._sock = None

    def read_many(self, reads: Sequence[Read]) -> list[bytes | None]:
        """The bytes of each read, in order (``MAX_READS`` at a time), or None where the
        spoke hands out no local file for it; a refusal raises it, as HTTP would."""
        got: list[bytes | None] = []
        for start in range(0, len(reads), MAX_READS):
            got += self._batch(reads[start : start + MAX_READS])
        return got

    def _batch(self, reads: Sequence[Read]) -> list[bytes | None]:
        sock = self._connection()
        request = {
            "auth": self.authorization,
            "reads": [{"path": p, "offset": o, "length": n} for p, o, n in reads],
        }
        try:
            sock.sendall(json.dumps(request).encode())
            message, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, MAX_READS)
        except OSError:
            self.close()
            raise
        try:
            if not message:
                self.close()
                raise ConnectionResetError("the spoke closed its local socket")
            answer = json.loads(message)
            if "reads" not in answer:
                raise wire.error_from(int(answer.get("status", 500)), answer)
            return _read_answers(answer["reads"], iter(fds))
        finally:
            for fd in fds:
                os.close(fd)


def _read_answers(answers: list[dict[str, Any]], fds: Any) -> list[bytes | None]:
    got: list[bytes | None] = []
    refusal: LoomError | None = None
    for answer in answers:
        if "error" in answer:
            refusal = refusal or wire.error_from(int(answer.get("status", 500)), answer)
            got.append(None)
        elif answer["fd"]:
            got.append(_pread_all(next(fds), answer["offset"], answer["length"]))
        else:
            got.append(None)
    if refusal is not None:  # after every descriptor was taken in order
        raise refusal
    return got


def _pread_all(fd: int, offset: int, length: int) -> bytes:
    data = os.pread(fd, length, offset)
    if len(data) == length:
        return data
    parts, pos = [data], offset + len(data)
    while pos < offset + length:
        part = os.pread(fd, offset + length - pos, pos)
        if not part:
            raise Conflict("a cache file the spoke handed out is shorter than it said")
        parts.append(part)
        pos += len(part)
    return b"".join(parts)
