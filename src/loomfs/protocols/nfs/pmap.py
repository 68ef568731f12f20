"""Registration with a portmapper (protocol layer): rpcbind's PMAP v2 SET and UNSET.

A client that is not told the ports (the Kubernetes NFS CSI recipe mounts with
``vers=3,proto=tcp,nolock`` only) asks the server's rpcbind where NFS and MOUNT listen.
Where ``[nfs] rpcbind`` names one, the server registers both programs on TCP at start and
takes them out at stop. rpcbind accepts a registration only from a loopback address and a
reserved source port (below 1024), so the call is made from one where the process may bind
it (as root); a portmapper that is not there, or refuses, is logged and NFS serves on.
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import logging
import socket
from collections.abc import Sequence

from .rpc import AUTH_NONE, CALL, MSG_ACCEPTED, SUCCESS, read_record, record
from .xdr import Packer, Unpacker, XdrError

log = logging.getLogger(__name__)

PMAP_PROGRAM, PMAP_VERSION = 100000, 2
PMAPPROC_SET, PMAPPROC_UNSET = 1, 2
IPPROTO_TCP = 6
RESERVED = range(1023, 511, -1)  # where bindresvport(3) looks
TIMEOUT = 5.0
_xids = itertools.count(1)


def _reserved_socket(host: str) -> socket.socket:
    """A TCP socket bound to a reserved port where that is allowed, else to any port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setblocking(False)
    for port in RESERVED:
        try:
            sock.bind(("", port))
        except PermissionError:
            break  # not root: rpcbind will refuse, and says so
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            continue
        return sock
    return sock


async def _call(host: str, port: int, proc: int, args: bytes) -> bool:
    xid = next(_xids)
    p = Packer()
    for word in (xid, CALL, 2, PMAP_PROGRAM, PMAP_VERSION, proc, AUTH_NONE, 0, AUTH_NONE, 0):
        p.uint(word)
    sock = _reserved_socket(host)
    try:
        await asyncio.get_running_loop().sock_connect(sock, (host, port))
        reader, writer = await asyncio.open_connection(sock=sock)
    except BaseException:
        sock.close()
        raise
    try:
        writer.write(record(p.value() + args))
        await writer.drain()
        reply = await read_record(reader)
    finally:
        writer.close()
    if reply is None:
        raise ConnectionError("the portmapper closed the connection")
    u = Unpacker(reply)
    if u.uint() != xid or u.uint() != 1 or u.uint() != MSG_ACCEPTED:
        return False
    u.uint()
    u.opaque(400)
    return u.uint() == SUCCESS and u.boolean()


def _mapping(program: int, version: int, port: int) -> bytes:
    p = Packer()
    for word in (program, version, IPPROTO_TCP, port):
        p.uint(word)
    return p.value()


async def register(
    address: tuple[str, int], programs: Sequence[tuple[int, int]], port: int
) -> bool:
    """Register each (program, version) on TCP ``port`` (replacing what an earlier run
    left); whether the portmapper took them all."""
    host, pmap_port = address
    try:
        async with asyncio.timeout(TIMEOUT):
            taken = True
            for program, version in programs:
                await _call(host, pmap_port, PMAPPROC_UNSET, _mapping(program, version, 0))
                taken &= await _call(
                    host, pmap_port, PMAPPROC_SET, _mapping(program, version, port)
                )
    except (OSError, TimeoutError, XdrError) as exc:
        log.info(
            "no portmapper at %s:%s to register nfs with (%s): clients give port= and mountport=",
            host, pmap_port, exc, extra={"rpcbind": f"{host}:{pmap_port}"},
        )  # fmt: skip
        return False
    if not taken:
        log.warning(
            "the portmapper at %s:%s refused to register nfs (it takes registrations only "
            "from a reserved port: run as root)", host, pmap_port,
            extra={"rpcbind": f"{host}:{pmap_port}"},
        )  # fmt: skip
    return taken


async def unregister(address: tuple[str, int], programs: Sequence[tuple[int, int]]) -> None:
    host, pmap_port = address
    try:
        async with asyncio.timeout(TIMEOUT):
            for program, version in programs:
                await _call(host, pmap_port, PMAPPROC_UNSET, _mapping(program, version, 0))
    except (OSError, TimeoutError, XdrError) as exc:
        log.info("could not take nfs out of the portmapper: %s", exc)
