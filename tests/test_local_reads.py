"""Local reads at a spoke (``rest.local``, ``sdk.local``): a loader on the spoke's machine
gets a descriptor of the cache file for each read the spoke allows it, and nothing else."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loomfs.core.audit import AuditReader
from loomfs.core.types import SYSTEM
from loomfs.errors import NotFound, PermissionDenied
from loomfs.rest.auth import HubAuthenticator
from loomfs.rest.client import RestNamespace
from loomfs.rest.local import LocalReads, socket_address
from loomfs.rest.server import RestServer
from loomfs.sdk.local import LocalReader
from loomfs.testing.ports import serving
from test_authz import DATA, PROJ, Governed, governed  # noqa: F401 - the fixture


@dataclass
class Local:
    url: str
    server: LocalReads
    clients: dict[str, RestNamespace]

    async def reader(self, user: str) -> LocalReader:
        client = self.clients[user]
        announced = await client.local_reads()
        assert announced is not None
        reader = LocalReader(announced, client.authorization)
        assert await asyncio.to_thread(reader.connect)
        return reader


@contextlib.asynccontextmanager
async def local_spoke(g: Governed) -> AsyncIterator[Local]:
    """The spoke's REST API with its local socket, and a client per user."""
    env = g.env
    check = HubAuthenticator(env.client(env.first), site=env.first, anonymous=True)
    local = LocalReads(env.spoke, check.principal_of)
    server = RestServer(
        env.spoke, spoke=env.spoke, site=env.first, authenticate=check,
        routes=local.routes(), running=[local.serving],
    )  # fmt: skip
    try:
        async with serving(server.app()) as url:
            clients = {
                user: RestNamespace(url, credentials=(key.access_key, key.secret))
                for user, key in g.keys.items()
            }
            try:
                yield Local(url, local, clients)
            finally:
                for client in clients.values():
                    await client.close()
    finally:
        await check.hub.close()


def raw_request(server: LocalReads, auth: str | None, paths: list[str]) -> tuple[Any, int]:
    """One request on the socket as a client of its own: the answer, and how many
    descriptors came with it (closed here)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
        sock.connect(socket_address(server.name))
        assert json.loads(sock.recv(1 << 16)) == {"token": server.token}
        reads = [{"path": p, "offset": 0, "length": None} for p in paths]
        sock.sendall(json.dumps({"auth": auth, "reads": reads}).encode())
        message, fds, _, _ = socket.recv_fds(sock, 1 << 20, 64)
        for fd in fds:
            os.close(fd)
        return json.loads(message), len(fds)


async def test_a_denied_user_gets_no_descriptor_and_reads_are_audited_as_the_user(
    governed: Governed,  # noqa: F811 - the fixture
) -> None:
    env, hub = governed.env, governed.env.hub
    path = f"{PROJ}/data.bin"
    async with local_spoke(governed) as local:
        bob = await local.reader("bob")
        assert await asyncio.to_thread(bob.read_many, [(path, 0, None), (path, 3, 5)]) == [
            DATA,
            DATA[3:8],
        ]
        assert env.spoke.cache.versions(path)  # served from the cache file
        dave = await local.reader("dave")
        with pytest.raises(PermissionDenied):
            await asyncio.to_thread(dave.read_many, [(path, 0, None)])
        # on the wire: a refusal and no descriptor, though bob's read left it cached
        auth = local.clients["dave"].authorization
        answer, fds = await asyncio.to_thread(raw_request, local.server, auth, [path])
        assert fds == 0
        assert answer["reads"][0]["status"] == 403 and "entry" not in answer["reads"][0]
        wrong = "Basic " + "eA==" * 3
        answer, fds = await asyncio.to_thread(raw_request, local.server, wrong, [path])
        assert fds == 0 and answer["status"] in (400, 401)
    assert hub.audit is not None
    await asyncio.to_thread(hub.audit.flush, 30)
    seen = {
        (r.user, r.site, r.op, r.path, r.result) for r in AuditReader(hub.config.audit_dir).query()
    }
    assert any(
        u == "bob" and s == env.first and res == "ok" and p == path for u, s, _, p, res in seen
    )
    assert any(u == "dave" and p == path and res == "denied" for u, _, _, p, res in seen)


FILES = ("data.bin", "a", "b", "denied", "missing")


async def test_a_batch_gets_a_descriptor_per_granted_read_in_order(
    governed: Governed,  # noqa: F811 - the fixture
) -> None:
    """Whatever a batch mixes, each read is answered in its place, a descriptor comes for
    exactly the reads the user may make of files that exist, and the SDK's reader hands
    back their bytes or raises the first refusal."""
    hub = governed.env.hub.namespace
    contents = {"data.bin": DATA, "a": b"a" * 70_000, "b": b""}
    for name, data in contents.items():
        await hub.write_bytes(SYSTEM, f"{PROJ}/{name}", data)
    await hub.write_bytes(SYSTEM, "/vol/private/denied", b"not bob's")
    async with local_spoke(governed) as local:
        auth = local.clients["bob"].authorization
        bob = await local.reader("bob")

        @settings(max_examples=15, deadline=None)
        @given(batch=st.lists(st.sampled_from(FILES), min_size=1, max_size=8))
        def check(batch: list[str]) -> None:  # in a thread: the test's loop serves the socket
            paths = [f"/vol/private/{n}" if n == "denied" else f"{PROJ}/{n}" for n in batch]
            answer, fds = raw_request(local.server, auth, paths)
            assert fds == sum(n in contents for n in batch)
            assert [("entry" in a) for a in answer["reads"]] == [n in contents for n in batch]
            reads = [(p, 0, None) for p in paths]
            if all(n in contents for n in batch):
                assert bob.read_many(reads) == [contents[n] for n in batch]
            else:
                first = next(n for n in batch if n not in contents)
                with pytest.raises(NotFound if first == "missing" else PermissionDenied):
                    bob.read_many(reads)

        await asyncio.to_thread(check)
