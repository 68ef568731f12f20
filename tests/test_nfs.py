"""The NFSv3 server with a real second client (libnfs's nfs-ls, nfs-cat, nfs-cp) and a raw
RPC client (``loomfs.testing.nfs``) in front of a ``loomfs hub serve`` process that serves
REST and NFS on the same namespace.

/data is a posix volume exported read-write to loopback; /data/pub is exported read-only,
/data/far only to 10.0.0.0/8. AUTH_SYS uid 1000 is alice, 1001 bob; /data/secret is private
to alice; on /data/shelf alice may write and bob only read. What NFS does is checked on the
volume's disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from loomfs.config import NfsExport
from loomfs.core.acl import ANONYMOUS, AclAuthorizer, AclStore
from loomfs.core.exports import NfsExports, nfs_export
from loomfs.core.registry import open_catalog
from loomfs.core.sites import SiteRegistry
from loomfs.core.types import SYSTEM
from loomfs.core.users import UserRegistry
from loomfs.errors import NotFound, PermissionDenied
from loomfs.fabric.identity import SiteIdentity
from loomfs.hub.namespace import HubNamespace
from loomfs.namespace.governed import GovernedNamespace
from loomfs.protocols.nfs import errors as e
from loomfs.protocols.nfs import pmap
from loomfs.protocols.nfs.handles import HandleTable
from loomfs.protocols.nfs.rpc import (
    AUTH_ERROR,
    AUTH_TOOWEAK,
    GARBAGE_ARGS,
    PROC_UNAVAIL,
    PROG_MISMATCH,
    PROG_UNAVAIL,
    RPC_MISMATCH,
    SUCCESS,
    AuthSys,
    Call,
    RpcDenied,
    record,
)
from loomfs.protocols.nfs.server import (
    MOUNT_PROGRAM,
    NFS_PROGRAM,
    PROGRAMS,
    Export,
    NfsServer,
    principal_of,
)
from loomfs.protocols.nfs.xdr import Packer, Unpacker
from loomfs.rest import wire
from loomfs.rest.client import RestNamespace
from loomfs.testing.hubproc import HubProcess, SiteProcess, SpokeProcess, cli_ok, spoke_args
from loomfs.testing.loop import LoopThread
from loomfs.testing.nfs import (
    FakePortmapper,
    Fattr,
    RpcClient,
    diropargs,
    fattr,
    handle_args,
    libnfs,
    libnfs_tool,
    nfs_url,
    post_op,
    sattr,
    wcc,
)
from loomfs.testing.ports import free_port

MANY = 300  # files in one directory: more than one READDIRPLUS reply of libnfs's size
GETATTR, SETATTR, LOOKUP, ACCESS, READLINK, READ, WRITE, CREATE = 1, 2, 3, 4, 5, 6, 7, 8
MKDIR, SYMLINK, MKNOD, REMOVE, RMDIR, RENAME, LINK = 9, 10, 11, 12, 13, 14, 15
READDIR, READDIRPLUS, FSSTAT, FSINFO, PATHCONF, COMMIT = 16, 17, 18, 19, 20, 21
UNSTABLE, FILE_SYNC = 0, 2
#: the module's one server serves every example (nothing an example does lasts)
FIXTURE = [HealthCheck.function_scoped_fixture]
CONFIG = """
[site]
name = "west"
[hub]
rescan_interval = 0
[log]
format = "text"
[nfs]
listen = "127.0.0.1:0"
commit_delay = 0.5
[nfs.uid_map]
1000 = "alice"
1001 = "bob"
[nfs.exports."/data"]
[nfs.exports."/data/pub"]
access = "ro"
[nfs.exports."/data/far"]
clients = ["10.0.0.0/8"]
"""


@dataclass
class Site:
    hub: HubProcess
    vol: Path
    tmp: Path

    @property
    def port(self) -> int:
        return int(self.hub.urls["nfs"].rpartition(":")[2])

    def url(self, path: str, uid: int = 1000) -> str:
        return nfs_url(self.port, path, uid=uid, gid=uid)

    def client(self, uid: int | None = 1000) -> RpcClient:
        return RpcClient(self.port, uid=uid, gid=uid or 0)


async def _prepare(tmp: Path, vol: Path) -> None:
    catalog = open_catalog(f"sqlite://{tmp / 'site' / 'catalog.db'}")
    await catalog.open()
    try:
        await HubNamespace(catalog).add_volume("/data", f"posix://{vol}")
        users = UserRegistry(catalog)
        for name in ("alice", "bob"):
            await users.add_user(name)
        acl = AclStore(catalog)
        await acl.set_private("/data/secret", True)
        await acl.grant("user:alice", "write", "/data/secret")
        await acl.set_private("/data/shelf", True)
        await acl.grant("user:alice", "write", "/data/shelf")
        await acl.grant("user:bob", "read", "/data/shelf")
    finally:
        await catalog.close()


def _volume(vol: Path) -> None:
    for d in ("many", "pub", "far", "secret", "work", "shelf"):
        (vol / d).mkdir(parents=True)
    for i in range(MANY):
        (vol / "many" / f"f{i:04d}").write_bytes(b"x" * i)
    (vol / "hello.txt").write_bytes(b"hello over nfs\n")
    (vol / "pub" / "r.txt").write_bytes(b"read only")
    (vol / "secret" / "s.txt").write_bytes(b"alice's secret")
    (vol / "shelf" / "book.txt").write_bytes(b"alice writes, bob reads")


@contextlib.contextmanager
def _serving(tmp: Path, vol: Path) -> Iterator[Site]:
    config = tmp / "loomfs.toml"
    config.write_text(CONFIG)
    with HubProcess(tmp / "site", env={"LOOMFS_CONFIG": str(config)}) as hub:
        yield Site(hub, vol, tmp)


def _new_site(tmp: Path) -> Path:
    vol = tmp / "vol"
    _volume(vol)
    (tmp / "site").mkdir()
    asyncio.run(_prepare(tmp, vol))
    return vol


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    for tool in ("nfs-ls", "nfs-cat", "nfs-cp"):
        libnfs_tool(tool)  # fails with how to install it
    tmp = tmp_path_factory.mktemp("nfs")
    with _serving(tmp, _new_site(tmp)) as made:
        yield made


def _tree(root: Path) -> dict[str, bytes | None]:
    return {
        str(p.relative_to(root)): None if p.is_dir() else p.read_bytes()
        for p in sorted(root.rglob("*"))
    }


def _ok(done: object) -> str:
    assert getattr(done, "returncode", 1) == 0, done
    return getattr(done, "stdout", b"").decode()


# -- libnfs: a second client implementation ------------------------------------------------


def test_libnfs_lists_and_reads(site: Site) -> None:
    listing = _ok(libnfs("nfs-ls", site.url("/data")))
    names = {line.split()[-1] for line in listing.splitlines()}
    assert {"hello.txt", "many", "pub", "secret"} <= names
    many = _ok(libnfs("nfs-ls", site.url("/data/many")))
    sizes = {line.split()[-1]: int(line.split()[-2]) for line in many.splitlines()}
    assert sizes == {f"f{i:04d}": i for i in range(MANY)}  # every page, nothing twice
    assert _ok(libnfs("nfs-cat", site.url("/data/hello.txt"))) == "hello over nfs\n"


def test_libnfs_copies_a_large_file_both_ways(site: Site) -> None:
    data = os.urandom(5 << 20) + b"tail"
    local = site.tmp / "up.bin"
    local.write_bytes(data)
    _ok(libnfs("nfs-cp", str(local), site.url("/data/work/big.bin")))
    assert (site.vol / "work" / "big.bin").read_bytes() == data
    back = site.tmp / "down.bin"
    _ok(libnfs("nfs-cp", site.url("/data/work/big.bin"), str(back)))
    assert back.read_bytes() == data
    cat = libnfs("nfs-cat", site.url("/data/work/big.bin"))
    assert (cat.returncode, cat.stdout) == (0, data)


def test_a_read_only_export_refuses_writes_and_keeps_its_files(site: Site) -> None:
    local = site.tmp / "ro.txt"
    local.write_bytes(b"nope")
    before = _tree(site.vol / "pub")
    done = libnfs("nfs-cp", str(local), site.url("/data/pub/new.txt"))
    assert done.returncode != 0
    assert b"ROFS" in done.stderr + done.stdout
    assert _tree(site.vol / "pub") == before
    assert _ok(libnfs("nfs-cat", site.url("/data/pub/r.txt"))) == "read only"


def test_a_client_outside_an_exports_networks_cannot_mount_it(site: Site) -> None:
    done = libnfs("nfs-ls", site.url("/data/far"))
    assert done.returncode != 0

    async def mnt() -> int:
        async with site.client() as c:
            p = Packer()
            p.string("/data/far")
            reply = await c.call(MOUNT_PROGRAM, 3, 1, p.value())
            assert reply.accepted and reply.stat == SUCCESS
            return reply.body.uint()

    assert asyncio.run(mnt()) == e.NFS3ERR_ACCES


# -- governance ----------------------------------------------------------------------------


def _audit(site: Site, user: str) -> list[dict[str, object]]:
    out = cli_ok(site.hub.data_dir, "audit", "query", "--user", user, "--json")
    return [json.loads(line) for line in out.splitlines()]


def test_a_user_the_acl_denies_gets_acces_and_no_bytes(site: Site) -> None:
    assert _ok(libnfs("nfs-cat", site.url("/data/secret/s.txt"))) == "alice's secret"
    denied = libnfs("nfs-cat", site.url("/data/secret/s.txt", uid=1001))
    assert denied.returncode != 0
    assert b"alice's secret" not in denied.stdout
    # an unmapped uid is the anonymous user, who may not see it either
    assert b"alice's secret" not in libnfs("nfs-cat", site.url("/data/secret/s.txt", 4242)).stdout

    async def raw() -> tuple[int, int]:
        async with site.client(1000) as alice, site.client(1001) as bob:
            root = await alice.mount("/data")
            _, secret = await alice.lookup(root, "secret")
            assert secret is not None
            _, handle = await alice.lookup(secret, "s.txt")
            assert handle is not None
            p = Packer()
            p.uhyper(0)
            p.uint(100)
            read = handle_args(handle, p.value())
            body = await bob.nfs(READ, read)
            bob_status = body.uint()
            return bob_status, await alice.status_of(READ, read)

    bob_status, alice_status = asyncio.run(raw())
    assert (bob_status, alice_status) == (e.NFS3ERR_ACCES, e.NFS3_OK)

    def recorded() -> list[dict[str, object]]:
        return [r for r in _audit(site, "bob") if r["result"] == "denied"]

    for _ in range(100):  # the audit log is written behind the requests
        if recorded():
            break
        asyncio.run(asyncio.sleep(0.1))
    rows = recorded()
    assert rows and {r["protocol"] for r in rows} == {"nfs"}
    assert any(r["path"] == "/data/secret/s.txt" for r in rows)


_WRITES = st.lists(
    st.tuples(
        st.sampled_from(("alice", "bob")), st.integers(0, 24), st.binary(min_size=1, max_size=8)
    ),
    min_size=1,
    max_size=8,
)
_SHELVED = iter(range(1_000_000))


@settings(max_examples=12, deadline=None, suppress_health_check=FIXTURE)
@given(steps=_WRITES, truncate=st.booleans())
def test_a_writer_the_acl_refuses_changes_nothing_among_anothers_writes(
    site: Site, steps: list[tuple[str, int, bytes]], truncate: bool
) -> None:
    """On /data/shelf alice may write and bob only read. Whatever order their UNSTABLE
    WRITEs (and a SETATTR of the size by bob) come in, into one file's uncommitted writes,
    bob's are ACCES and the committed file is alice's writes alone: a spool committed as
    its last writer carried bob's bytes in as alice's, and his later writes skipped the
    first-write decision."""
    name = f"race{next(_SHELVED)}.bin"

    async def race() -> bytes:
        model = bytearray()
        async with site.client(1000) as alice, site.client(1001) as bob:
            root = await alice.mount("/data")
            _, shelf = await alice.lookup(root, "shelf")
            assert shelf is not None
            handle = await _create(alice, shelf, name)
            clients = {"alice": alice, "bob": bob}
            for who, offset, data in steps:
                p = Packer()
                p.uhyper(offset)
                p.uint(len(data))
                p.uint(UNSTABLE)
                p.opaque(data)
                status = await clients[who].status_of(WRITE, handle_args(handle, p.value()))
                assert status == (e.NFS3_OK if who == "alice" else e.NFS3ERR_ACCES)
                if who == "alice":
                    model[len(model) : offset] = bytes(max(0, offset - len(model)))
                    model[offset : offset + len(data)] = data
            if truncate:
                args = handle_args(handle, sattr(size=1) + _uint(0))
                assert await bob.status_of(SETATTR, args) == e.NFS3ERR_ACCES
            assert await _commit(alice, handle) == e.NFS3_OK
        return bytes(model)

    expected = asyncio.run(race())
    assert (site.vol / "shelf" / name).read_bytes() == expected


def test_export_clients_must_be_addresses_or_networks() -> None:
    assert NfsExport(clients=["10.0.0.0/8", "::1", "192.168.1.7"]).clients[2] == "192.168.1.7"
    for wrong in ("10.0.0.300/8", "hub.example", ""):
        with pytest.raises(ValidationError, match="not an address or network"):
            NfsExport(clients=[wrong])


def _export(squash: str, anonymous: bool = False) -> Export:
    return Export("/x", 1, (ipaddress.ip_network("127.0.0.0/8"),), False, squash, anonymous)


@given(
    uid=st.integers(0, 3000) | st.just(0),
    squash=st.sampled_from(["root", "all", "none"]),
    mapped=st.dictionaries(st.integers(0, 3000), st.sampled_from(["alice", "bob"])),
)
def test_uids_map_to_users_and_squash_as_the_export_says(
    uid: int, squash: str, mapped: dict[int, str]
) -> None:
    who = principal_of(AuthSys(uid, uid, (), "client"), _export(squash), mapped, "west")
    assert (who.protocol, who.site) == ("nfs", "west")
    if squash == "all" or (uid == 0 and squash == "root"):
        assert (who.user, who.groups) == (ANONYMOUS, frozenset())
    elif uid in mapped:
        assert (who.user, who.groups) == (mapped[uid], frozenset())
    elif uid == 0:  # unsquashed, unmapped root: the administrator
        assert (who.user, who.groups) == ("root", frozenset({"admin"}))
    else:
        assert who.user == ANONYMOUS
    # AUTH_NONE: anonymous where the export allows it, refused where it does not
    assert principal_of(None, _export(squash, anonymous=True), mapped, "west").user == ANONYMOUS
    with pytest.raises(RpcDenied):
        principal_of(None, _export(squash), mapped, "west")


def test_access_answers_what_the_namespace_would_decide(site: Site) -> None:
    book = site.vol / "shelf" / "book.txt"

    async def ask() -> dict[int, int]:
        answers = {}
        async with site.client(1000) as alice, site.client(1001) as bob:
            root = await alice.mount("/data")
            _, shelf = await alice.lookup(root, "shelf")
            assert shelf is not None
            _, handle = await alice.lookup(shelf, "book.txt")
            assert handle is not None
            for uid, c in ((1000, alice), (1001, bob)):
                body = await c.nfs(ACCESS, handle_args(handle, _uint(0x1F)))
                assert body.uint() == e.NFS3_OK
                post_op(body)
                answers[uid] = body.uint()
            # bob's first WRITE is refused at once, not when the client commits
            p = Packer()
            p.uhyper(0)
            p.uint(3)
            p.uint(UNSTABLE)
            p.opaque(b"bob")
            assert await bob.status_of(WRITE, handle_args(handle, p.value())) == e.NFS3ERR_ACCES
        return answers

    answers = asyncio.run(ask())
    assert answers == {1000: 0x1F, 1001: 0x03}  # bob: READ and LOOKUP, nothing that writes
    assert book.read_bytes() == b"alice writes, bob reads"


_ACL_CHANGES = st.lists(
    st.tuples(
        st.sampled_from(("private", "public", "grant", "revoke")),
        st.sampled_from(("/vol", "/vol/d", "/vol/d/f", "/vol/e")),
        st.sampled_from(("list", "read")),
    ),
    max_size=6,
)


@settings(max_examples=12, deadline=None)
@given(_ACL_CHANGES)
def test_access_follows_each_acl_change_at_the_next_call(
    tmp_path_factory: pytest.TempPathFactory, changes: list[tuple[str, str, str]]
) -> None:
    """After each grant, revoke or private mark, the next ACCESS of a plain file answers
    READ exactly as the namespace's own read check decides then: what ACCESS skips for a
    caller whom nothing is refused never outlives a rule that refuses something."""
    tmp = tmp_path_factory.mktemp("access")
    (tmp / "vol" / "d").mkdir(parents=True)
    (tmp / "vol" / "d" / "f").write_bytes(b"f")

    async def run() -> None:
        catalog = open_catalog(f"sqlite://{tmp / 'catalog.db'}")
        await catalog.open()
        hub = HubNamespace(catalog)
        server: NfsServer | None = None
        try:
            await hub.add_volume("/vol", f"posix://{tmp / 'vol'}")
            acl = AclAuthorizer(catalog, refresh=0)
            governed = GovernedNamespace(hub, [acl], rules=acl)
            exports = {"/vol": NfsExport()}
            server = NfsServer(governed, exports, state_dir=tmp / "state",
                               spool_dir=tmp / "spool", uid_map={1000: "alice"},
                               gate=governed)  # fmt: skip
            export = next(iter(server.exports.values()))
            alice = server.who(_alice_call(b""), export)
            entry = await hub.stat(SYSTEM, "/vol/d/f")
            handle = server.handles.encode(export.id, server.handles.id(entry.path, entry.id))
            for change, path, permission in [("ask", "/vol", "read"), *changes]:
                with contextlib.suppress(NotFound):  # unmarking what is not marked, ...
                    if change in ("private", "public"):
                        await acl.store.set_private(path, change == "private")
                    elif change == "grant":
                        await acl.store.grant("user:alice", permission, path)
                    elif change == "revoke":
                        await acl.store.revoke("user:alice", permission, path)
                body = Unpacker((await server.access(_alice_call(handle))).value())
                if body.uint() != e.NFS3_OK:
                    continue  # the stat itself refused: nothing to compare
                post_op(body)
                allowed = body.uint() & 0x01
                try:
                    await governed.check_read(alice, "/vol/d/f")
                except PermissionDenied:
                    assert not allowed, (change, path, permission)
                else:
                    assert allowed, (change, path, permission)
        finally:
            if server is not None:
                server.handles.close()
            await hub.close()
            await catalog.close()

    asyncio.run(run())


def _alice_call(handle: bytes) -> Call:
    args = Packer()
    args.opaque(handle)
    args.uint(0x1F)
    cred = AuthSys(1000, 1000, (), "test")
    return Call(1, NFS_PROGRAM, 3, ACCESS, cred, Unpacker(args.value()), "127.0.0.1")


# -- the RPC layer under bad input -----------------------------------------------------------


def test_unknown_programs_versions_and_procedures_are_clean_rpc_errors(site: Site) -> None:
    async def calls() -> None:
        async with site.client() as c:
            assert (await c.call(NFS_PROGRAM, 3, 0)).stat == SUCCESS
            assert (await c.call(200000, 1, 0)).stat == PROG_UNAVAIL
            mismatch = await c.call(NFS_PROGRAM, 4, 0)
            assert mismatch.stat == PROG_MISMATCH
            assert (mismatch.body.uint(), mismatch.body.uint()) == (3, 3)
            assert (await c.call(NFS_PROGRAM, 3, 22)).stat == PROC_UNAVAIL
            assert (await c.call(MOUNT_PROGRAM, 3, 6)).stat == PROC_UNAVAIL
            old = await c.call(NFS_PROGRAM, 3, 0, rpcvers=3)
            assert (old.accepted, old.stat) == (False, RPC_MISMATCH)
            assert (await c.call(NFS_PROGRAM, 3, GETATTR, b"\0\0")).stat == GARBAGE_ARGS
            # a call in several fragments is one record
            _, header = c.header(NFS_PROGRAM, 3, 0)
            whole = header.value()
            await c.send_raw(len(whole[:10]).to_bytes(4, "big") + whole[:10])
            await c.send_raw(record(whole[10:]))
            reply = await c.receive()
            assert reply is not None
            # REPLY, MSG_ACCEPTED, an empty AUTH_NONE verifier, SUCCESS
            assert reply[4:] == bytes.fromhex("00000001" + "00000000" * 4)
            root = await c.mount("/data")
        async with site.client(uid=None) as anonymous:  # AUTH_NONE: the export allows none
            assert (await anonymous.call(NFS_PROGRAM, 3, 0)).stat == SUCCESS  # NULL: no one
            refused = await anonymous.call(NFS_PROGRAM, 3, GETATTR, handle_args(root))
            assert (refused.accepted, refused.stat) == (False, AUTH_ERROR)
            assert refused.body.uint() == AUTH_TOOWEAK

    asyncio.run(calls())


async def _still_serves(site: Site) -> None:
    async with site.client() as c:
        root = await c.mount("/data")
        assert (await c.lookup(root, "hello.txt"))[0] == e.NFS3_OK


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(proc=st.integers(0, 21), args=st.binary(max_size=200))
def test_random_arguments_are_garbage_or_an_nfs_error_and_change_nothing(
    site: Site, proc: int, args: bytes
) -> None:
    before = _tree(site.vol / "many")

    async def call() -> None:
        async with site.client() as c:
            reply = await c.call(NFS_PROGRAM, 3, proc, args)
            assert reply.accepted
            assert reply.stat in (SUCCESS, GARBAGE_ARGS)
            if reply.stat == SUCCESS and proc:
                # random bytes are never one of this server's handles
                assert reply.body.uint() in (e.NFS3ERR_BADHANDLE, e.NFS3ERR_INVAL)
        await _still_serves(site)

    asyncio.run(call())
    assert _tree(site.vol / "many") == before


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    payload=st.binary(min_size=0, max_size=64),
    cut=st.integers(0, 63),
    length=st.sampled_from([0x7FFFFFFF, 0xFFFFFFFF, 1 << 30, 5 << 20]),
)
def test_truncated_records_and_huge_lengths_do_not_hurt_the_server(
    site: Site, payload: bytes, cut: int, length: int
) -> None:
    async def abuse() -> None:
        async with site.client() as c:  # a record cut short, then the connection closed
            await c.send_raw(record(payload)[: min(cut, len(payload) + 3)])
        async with site.client() as c:  # a length far past what anyone may send
            await c.send_raw(length.to_bytes(4, "big") + payload)
            assert await c.receive() is None  # closed, nothing allocated for it
        async with site.client() as c:  # fragments that add up past the limit
            with contextlib.suppress(ConnectionError):  # closed while it still sends
                for _ in range(3):
                    await c.send_raw((600 << 10).to_bytes(4, "big") + b"\0" * (600 << 10))
            assert await c.receive() is None
        await _still_serves(site)

    asyncio.run(abuse())


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(position=st.integers(0, 29), flip=st.integers(1, 255))
def test_forged_handles_are_badhandle(site: Site, position: int, flip: int) -> None:
    async def forge() -> None:
        async with site.client() as c:
            root = await c.mount("/data")
            _, handle = await c.lookup(root, "hello.txt")
            assert handle is not None
            forged = bytearray(handle)
            forged[position] ^= flip
            assert await c.status_of(GETATTR, handle_args(bytes(forged))) == e.NFS3ERR_BADHANDLE
            p = Packer()
            p.string("x")
            p.uint(0)
            p.uint(0)  # CREATE UNCHECKED, no attributes
            for _ in range(6):
                p.uint(0)
            create = handle_args(bytes(forged), p.value())
            assert await c.status_of(CREATE, create) == e.NFS3ERR_BADHANDLE

    asyncio.run(forge())
    assert not (site.vol / "x").exists()


def test_inner_exports_keep_their_rules_whichever_export_reached_them(site: Site) -> None:
    async def other() -> None:
        async with site.client() as c:
            root = await c.mount("/data")
            _, far = await c.lookup(root, "far")
            assert far is not None
            # reached through /data, /data/far still admits 10.0.0.0/8 only
            assert await c.status_of(GETATTR, handle_args(far)) == e.NFS3ERR_ACCES
            _, pub_via_data = await c.lookup(root, "pub")
            pub = await c.mount("/data/pub")
            write = Packer()
            write.uhyper(0)
            write.uint(3)
            write.uint(FILE_SYNC)
            write.opaque(b"new")
            for directory in (pub_via_data, pub):  # read-only, by either way in
                assert directory is not None
                _, r = await c.lookup(directory, "r.txt")
                assert r is not None
                assert await c.status_of(WRITE, handle_args(r, write.value())) == e.NFS3ERR_ROFS

    asyncio.run(other())
    assert (site.vol / "pub" / "r.txt").read_bytes() == b"read only"


async def _made(c: RpcClient, proc: int, args: bytes) -> tuple[bytes, int]:
    """CREATE, MKDIR or SYMLINK that must succeed: the new handle and its type."""
    body = await c.nfs(proc, args)
    assert body.uint() == e.NFS3_OK
    assert body.boolean()
    handle = body.opaque(64)
    attrs = post_op(body)
    assert attrs is not None
    return handle, attrs.type


def _uint(value: int) -> bytes:
    p = Packer()
    p.uint(value)
    return p.value()


def _readdirplus(handle: bytes) -> bytes:
    p = Packer()
    p.opaque(handle)
    p.uhyper(0)
    p.fixed(bytes(8))
    p.uint(8192)
    p.uint(65536)
    return p.value()


async def test_every_procedure_does_to_the_volume_what_posix_would(site: Site) -> None:
    work = site.vol / "work"
    async with site.client() as c:
        root = await c.mount("/data")
        _, wh = await c.lookup(root, "work")
        assert wh is not None
        d, kind = await _made(c, MKDIR, diropargs(wh, "d") + sattr(mode=0o750))
        assert kind == 2 and (work / "d").stat().st_mode & 0o777 == 0o750
        f, kind = await _made(c, CREATE, diropargs(d, "f") + _uint(0) + sattr(mode=0o640))
        assert kind == 1 and (work / "d" / "f").stat().st_mode & 0o777 == 0o640
        await _write(c, f, 0, b"hello", FILE_SYNC)
        assert (work / "d" / "f").read_bytes() == b"hello"
        when = 1_600_000_000 * 1_000_000_000
        setattr_args = handle_args(f, sattr(size=2, mtime_ns=when) + _uint(0))
        body = await c.nfs(SETATTR, setattr_args)
        assert body.uint() == e.NFS3_OK
        after = wcc(body)
        assert after is not None and (after.size, after.mtime_ns) == (2, when)
        assert (work / "d" / "f").read_bytes() == b"he"
        assert (work / "d" / "f").stat().st_mtime_ns == when
        p = Packer()
        p.string("f")
        link, kind = await _made(c, SYMLINK, diropargs(d, "l") + sattr() + p.value())
        assert kind == 5 and os.readlink(work / "d" / "l") == "f"
        body = await c.nfs(READLINK, handle_args(link))
        assert body.uint() == e.NFS3_OK
        post_op(body)
        assert body.string(255) == "f"
        assert await c.status_of(LINK, handle_args(f, diropargs(wh, "hard"))) == e.NFS3_OK
        assert (work / "hard").read_bytes() == b"he"
        rename = diropargs(wh, "hard") + diropargs(wh, "moved")
        assert await c.status_of(RENAME, rename) == e.NFS3_OK
        assert not (work / "hard").exists() and (work / "moved").read_bytes() == b"he"
        body = await c.nfs(READDIRPLUS, _readdirplus(d))
        assert body.uint() == e.NFS3_OK
        post_op(body)
        body.fixed(8)
        names = []
        while body.boolean():
            body.uhyper()
            names.append(body.string(255))
            body.uhyper()
            post_op(body)
            if body.boolean():
                body.opaque(64)
        assert body.boolean()  # eof
        assert sorted(names) == [".", "..", "f", "l"]
        # LOOKUP: a miss is NOENT, a name under a file NOTDIR, the dots are directories
        assert (await c.lookup(d, "nope"))[0] == e.NFS3ERR_NOENT
        assert (await c.lookup(f, "x"))[0] == e.NFS3ERR_NOTDIR
        assert (await c.lookup(f, ".."))[0] == e.NFS3ERR_NOTDIR
        assert [(await c.lookup(d, dot))[0] for dot in (".", "..")] == [e.NFS3_OK] * 2
        assert await c.status_of(RMDIR, diropargs(wh, "d")) == e.NFS3ERR_NOTEMPTY
        assert await c.status_of(RMDIR, diropargs(d, "f")) == e.NFS3ERR_NOTDIR
        assert await c.status_of(REMOVE, diropargs(wh, "d")) == e.NFS3ERR_ISDIR
        for name in ("f", "l"):
            assert await c.status_of(REMOVE, diropargs(d, name)) == e.NFS3_OK
        assert await c.status_of(RMDIR, diropargs(wh, "d")) == e.NFS3_OK
        assert not (work / "d").exists()
        # f lives on as work/moved, its hard link: its handle too, until that goes
        body = await c.nfs(GETATTR, handle_args(f))
        assert body.uint() == e.NFS3_OK and fattr(body).nlink == 1
        assert await c.status_of(REMOVE, diropargs(wh, "moved")) == e.NFS3_OK
        assert await c.status_of(GETATTR, handle_args(f)) == e.NFS3ERR_STALE
        assert (await c.lookup(d, "f"))[0] == e.NFS3ERR_STALE  # in a removed directory
        # special files hand out the hub's own privileges: they need admin, alice has none
        fifo = diropargs(wh, "fifo") + _uint(7) + sattr(mode=0o644)
        assert await c.status_of(MKNOD, fifo) == e.NFS3ERR_ACCES
        assert not (work / "fifo").exists()
        body = await c.nfs(FSINFO, handle_args(root))
        assert body.uint() == e.NFS3_OK
        post_op(body)
        rtmax, _, _, wtmax = (body.uint() for _ in range(4))
        assert rtmax == wtmax == 1 << 20
        body = await c.nfs(PATHCONF, handle_args(root))
        assert body.uint() == e.NFS3_OK
        post_op(body)
        body.uint()
        assert body.uint() == 255
        assert await c.status_of(FSSTAT, handle_args(root)) == e.NFS3_OK
        body = await c.nfs(ACCESS, handle_args(root, _uint(0x3F)))
        assert body.uint() == e.NFS3_OK
        post_op(body)
        assert body.uint() == 0x3F


def test_mount_lists_exports_and_mounts(site: Site) -> None:
    async def mount() -> tuple[list[str], list[tuple[str, str]], list[tuple[str, str]]]:
        async with site.client() as c:
            await c.mount("/data/work")
            exports = await c.call(MOUNT_PROGRAM, 3, 5)
            found = []
            while exports.body.boolean():
                found.append(exports.body.string(1024))
                while exports.body.boolean():
                    exports.body.string(1024)

            async def dump() -> list[tuple[str, str]]:
                body = (await c.call(MOUNT_PROGRAM, 3, 2)).body
                out = []
                while body.boolean():
                    out.append((body.string(255), body.string(1024)))
                return out

            mounted = await dump()
            p = Packer()
            p.string("/data/work")
            await c.call(MOUNT_PROGRAM, 3, 3, p.value())
            return found, mounted, await dump()

    exports, mounted, unmounted = asyncio.run(mount())
    assert exports == ["/data", "/data/pub"]  # not /data/far: this client may not mount it
    assert ("127.0.0.1", "/data/work") in mounted
    assert ("127.0.0.1", "/data/work") not in unmounted


def test_an_export_added_over_the_admin_api_is_what_mnt_answers(site: Site) -> None:
    """An administrator exports /data/work read-only at run time: MNT and EXPORT answer
    it at once, a write through it is ROFS; a caller who is not one changes nothing.
    Removed, its handles are STALE and a new MNT gets /data's rules again."""
    route = f"{site.hub.url}{wire.ADMIN}/exports/nfs"
    admin = {"Authorization": wire.basic_authorization(*site.hub.admin)}
    rules = {"clients": ["127.0.0.1/32"], "access": "ro"}
    added = {"path": "/data/work", **rules}
    write = Packer()
    write.uhyper(0)
    write.uint(1)
    write.uint(FILE_SYNC)
    write.opaque(b"x")

    async def written(c: RpcClient, root: bytes) -> int:
        _, tent = await c.lookup(root, "tent.txt")
        tent = tent if tent is not None else await _create(c, root, "tent.txt")
        return await c.status_of(WRITE, handle_args(tent, write.value()))

    async def run() -> None:
        async with aiohttp.ClientSession() as http, site.client() as c:
            async with http.post(route, json=added) as refused:
                assert refused.status == 401
            assert "/data/work" not in await _exported(c)
            assert await written(c, await c.mount("/data/work")) == e.NFS3_OK  # /data's rules
            async with http.post(route, json=added, headers=admin) as made:
                assert made.status == 201, await made.text()
            try:
                assert "/data/work" in await _exported(c)
                work = await c.mount("/data/work")
                assert await written(c, work) == e.NFS3ERR_ROFS
            finally:
                gone = {"path": "/data/work"}
                async with http.delete(route, params=gone, headers=admin) as removed:
                    assert removed.status == 204, await removed.text()
            assert await c.status_of(GETATTR, handle_args(work)) == e.NFS3ERR_STALE
            assert await written(c, await c.mount("/data/work")) == e.NFS3_OK
            # a change another process makes in the catalog: taken at the next MNT/EXPORT
            other = open_catalog(f"sqlite://{site.tmp / 'site' / 'catalog.db'}")
            await other.open()
            try:
                elsewhere = NfsExports(other, {})
                await elsewhere.add(*nfs_export("/data/work", rules))
                assert "/data/work" in await _exported(c)
                assert await written(c, await c.mount("/data/work")) == e.NFS3ERR_ROFS
                await elsewhere.remove("/data/work")
                assert "/data/work" not in await _exported(c)
            finally:
                await other.close()

    asyncio.run(run())


async def _exported(c: RpcClient) -> list[str]:
    exports, found = await c.call(MOUNT_PROGRAM, 3, 5), []
    while exports.body.boolean():
        found.append(exports.body.string(1024))
        while exports.body.boolean():
            exports.body.string(1024)
    return found


def _readdir_args(handle: bytes, cookie: int, verifier: bytes, count: int) -> bytes:
    p = Packer()
    p.uhyper(cookie)
    p.fixed(verifier)
    p.uint(count)
    return handle_args(handle, p.value())


def test_readdirplus_gives_each_name_its_attributes_and_a_handle_of_it(site: Site) -> None:
    """Every entryplus3 of /data/many, parsed word by word: the name, its file's size,
    and a handle whose GETATTR is the same object."""

    async def listed() -> dict[str, tuple[int, int, int]]:
        found: dict[str, tuple[int, int, int]] = {}
        async with site.client() as c:
            root = await c.mount("/data")
            _, many = await c.lookup(root, "many")
            assert many is not None
            cookie, verifier, eof = 0, bytes(8), False
            while not eof:
                p = Packer()
                p.uhyper(cookie)
                p.fixed(verifier)
                p.uint(8192)
                p.uint(32768)
                body = await c.nfs(READDIRPLUS, handle_args(many, p.value()))
                assert body.uint() == e.NFS3_OK
                post_op(body)
                verifier = body.fixed(8)
                while body.boolean():
                    fileid, name, cookie = body.uhyper(), body.string(255), body.uhyper()
                    attrs = post_op(body)
                    assert attrs is not None and attrs.fileid == fileid
                    assert body.boolean()
                    handle = body.opaque(64)
                    if name.startswith("f"):
                        again = await c.nfs(GETATTR, handle_args(handle))
                        assert again.uint() == e.NFS3_OK
                        found[name] = (attrs.size, fileid, fattr(again).fileid)
                eof = body.boolean()
                body.done()
        return found

    found = asyncio.run(listed())
    assert sorted(found) == [f"f{i:04d}" for i in range(MANY)]
    for name, (size, fileid, again) in found.items():
        assert (size, again) == (int(name[1:]), fileid)


@settings(max_examples=8, deadline=None, suppress_health_check=FIXTURE)
@given(count=st.integers(200, 6000))
def test_readdir_pages_list_every_name_once_within_the_count(site: Site, count: int) -> None:
    async def pages() -> list[str]:
        async with site.client() as c:
            root = await c.mount("/data")
            _, many = await c.lookup(root, "many")
            assert many is not None
            names: list[str] = []
            cookie, verifier, eof = 0, bytes(8), False
            while not eof:
                reply = await c.call(
                    NFS_PROGRAM, 3, READDIR, _readdir_args(many, cookie, verifier, count)
                )
                body = reply.body
                assert len(body.data) - body.pos <= count  # the reply fits what was asked
                assert body.uint() == e.NFS3_OK
                post_op(body)
                verifier = body.fixed(8)
                while body.boolean():
                    body.uhyper()
                    names.append(body.string(255))
                    cookie = body.uhyper()
                eof = body.boolean()
            return names

    names = asyncio.run(pages())
    assert sorted(names) == sorted([".", "..", *(f"f{i:04d}" for i in range(MANY))])


@settings(max_examples=12, deadline=None, suppress_health_check=FIXTURE)
@given(
    writes=st.lists(
        st.tuples(st.integers(0, 300_000), st.binary(min_size=1, max_size=70_000), st.booleans()),
        min_size=1,
        max_size=8,
    )
)
def test_writes_anywhere_then_commit_are_the_file_a_local_disk_would_hold(
    site: Site, writes: list[tuple[int, bytes, bool]]
) -> None:
    """Each write is UNSTABLE or FILE_SYNC; after COMMIT the volume holds what the same
    writes at the same offsets give on a local file (holes read as zeros)."""
    model = bytearray(b"seed" * 10)
    path = site.vol / "work" / "model.bin"

    async def write() -> None:
        rest = RestNamespace(site.hub.url, credentials=site.hub.admin)
        try:  # over another protocol: the first write starts from it
            await rest.write_bytes(SYSTEM, "/data/work/model.bin", bytes(model))
        finally:
            await rest.close()
        async with site.client() as c:
            root = await c.mount("/data")
            _, work = await c.lookup(root, "work")
            assert work is not None
            _, handle = await c.lookup(work, "model.bin")
            assert handle is not None
            for offset, data, stable in writes:
                await _write(c, handle, offset, data, FILE_SYNC if stable else UNSTABLE)
                if len(model) < offset:
                    model.extend(bytes(offset - len(model)))
                model[offset : offset + len(data)] = data
            assert await _commit(c, handle) == e.NFS3_OK

    asyncio.run(write())
    assert path.read_bytes() == bytes(model)


def test_concurrent_stable_writes_to_one_new_file_all_land(site: Site) -> None:
    """Writes racing each other's commits (each FILE_SYNC write commits the file): none is
    lost to a spool started from what the file was before another's commit."""
    parts = [bytes([65 + i]) * (1000 + i) for i in range(4)]
    offsets = [sum(len(p) for p in parts[:i]) for i in range(len(parts))]

    async def race() -> None:
        clients = [site.client() for _ in parts]
        for c in clients:
            await c.__aenter__()
        try:
            root = await clients[0].mount("/data")
            _, work = await clients[0].lookup(root, "work")
            assert work is not None
            for n in range(8):
                handle = await _create(clients[0], work, f"race{n}.bin")
                await asyncio.gather(
                    *(
                        _write(c, handle, offset, part, FILE_SYNC)
                        for c, offset, part in zip(clients, offsets, parts, strict=True)
                    )
                )
        finally:
            for c in clients:
                await c.__aexit__(None, None, None)

    asyncio.run(race())
    for n in range(8):
        assert (site.vol / "work" / f"race{n}.bin").read_bytes() == b"".join(parts)


def test_a_change_over_another_protocol_shows_in_attributes_and_reads(site: Site) -> None:
    async def change() -> None:
        rest = RestNamespace(site.hub.url, credentials=site.hub.admin)
        try:
            await rest.write_bytes(SYSTEM, "/data/work/shared.txt", b"first")
            async with site.client() as c:
                root = await c.mount("/data")
                _, work = await c.lookup(root, "work")
                assert work is not None
                _, handle = await c.lookup(work, "shared.txt")
                assert handle is not None
                body = await c.nfs(GETATTR, handle_args(handle))
                assert body.uint() == e.NFS3_OK
                first = fattr(body)
                await rest.write_bytes(SYSTEM, "/data/work/shared.txt", b"second, longer")
                body = await c.nfs(GETATTR, handle_args(handle))
                assert body.uint() == e.NFS3_OK
                second = fattr(body)
                # same file (handle and fileid), new size and mtime: a client's cache drops it
                assert second.fileid == first.fileid
                assert (second.size, second.mtime_ns > first.mtime_ns) == (14, True)
                p = Packer()
                p.uhyper(0)
                p.uint(100)
                body = await c.nfs(READ, handle_args(handle, p.value()))
                assert body.uint() == e.NFS3_OK
                post_op(body)
                body.uint()
                assert body.boolean()  # eof
                assert body.opaque(100) == b"second, longer"
        finally:
            await rest.close()

    asyncio.run(change())


async def _read_all(c: RpcClient, handle: bytes) -> tuple[int, bytes]:
    """READ of a small file's first 4 KiB: (status, bytes)."""
    p = Packer()
    p.uhyper(0)
    p.uint(4096)
    body = await c.nfs(READ, handle_args(handle, p.value()))
    status = body.uint()
    if status != e.NFS3_OK:
        return status, b""
    post_op(body)
    body.uint()
    body.boolean()
    return status, body.opaque(4096)


def test_a_handle_follows_its_file_through_renames_over_another_protocol(site: Site) -> None:
    """Handles name the entry, not its path: a file renamed over REST (alone, then with
    its directory) is still read and written through the handle a client held, a new file
    at the old name is another object, and a removed one is STALE."""
    work = site.vol / "work"

    async def wander() -> None:
        rest = RestNamespace(site.hub.url, credentials=site.hub.admin)
        try:
            await rest.mkdir(SYSTEM, "/data/work/camp")
            await rest.write_bytes(SYSTEM, "/data/work/camp/tent.txt", b"pitched")
            async with site.client() as c:
                root = await c.mount("/data")
                _, camp = await c.lookup(root, "work")
                assert camp is not None
                _, camp = await c.lookup(camp, "camp")
                assert camp is not None
                _, tent = await c.lookup(camp, "tent.txt")
                assert tent is not None
                body = await c.nfs(GETATTR, handle_args(tent))
                assert body.uint() == e.NFS3_OK
                fileid = fattr(body).fileid
                await rest.rename(SYSTEM, "/data/work/camp/tent.txt", "/data/work/camp/moved.txt")
                await rest.write_bytes(SYSTEM, "/data/work/camp/tent.txt", b"a new tent")
                assert await _read_all(c, tent) == (e.NFS3_OK, b"pitched")
                await rest.rename(SYSTEM, "/data/work/camp", "/data/work/base")
                assert await _read_all(c, tent) == (e.NFS3_OK, b"pitched")
                body = await c.nfs(GETATTR, handle_args(tent))
                assert body.uint() == e.NFS3_OK
                assert fattr(body).fileid == fileid
                await _write(c, tent, 0, b"struck!", FILE_SYNC)
                assert (work / "base" / "moved.txt").read_bytes() == b"struck!"
                assert (work / "base" / "tent.txt").read_bytes() == b"a new tent"
                # the directory's handle followed it too: its listing is the new one
                _, other = await c.lookup(camp, "tent.txt")
                assert other is not None and other != tent
                assert await _read_all(c, other) == (e.NFS3_OK, b"a new tent")
                await rest.remove(SYSTEM, "/data/work/base/moved.txt")
                assert await c.status_of(GETATTR, handle_args(tent)) == e.NFS3ERR_STALE
                assert await _read_all(c, other) == (e.NFS3_OK, b"a new tent")
        finally:
            await rest.close()

    asyncio.run(wander())


async def _attrs(c: RpcClient, handle: bytes) -> Fattr:
    body = await c.nfs(GETATTR, handle_args(handle))
    assert body.uint() == e.NFS3_OK
    return fattr(body)


async def _listed(c: RpcClient, directory: bytes, cookie: int = 0) -> dict[str, tuple[int, int]]:
    """READDIRPLUS from ``cookie``: each name's (fileid, cookie)."""
    p = Packer()
    p.opaque(directory)
    p.uhyper(cookie)
    p.fixed(bytes(8))
    p.uint(8192)
    p.uint(65536)
    body = await c.nfs(READDIRPLUS, p.value())
    assert body.uint() == e.NFS3_OK
    post_op(body)
    body.fixed(8)
    found = {}
    while body.boolean():
        fileid, name, next_cookie = body.uhyper(), body.string(255), body.uhyper()
        post_op(body)
        if body.boolean():
            body.opaque(64)
        found[name] = (fileid, next_cookie)
    return found


def test_the_names_of_a_hard_linked_file_are_one_nfs_object(site: Site) -> None:
    """pjdfstest link/00: every name of a file has the same handle, fileid and link count
    (the client caches attributes by handle: names of their own showed each other's
    chmod, write or unlink late); a write through one name reads through the others;
    READDIR gives each name a cookie of its own; when the first name goes, the others
    keep the handle, and a new file at the old name is another object."""
    work = site.vol / "work"

    async def linked() -> None:
        rest = RestNamespace(site.hub.url, credentials=site.hub.admin)
        try:
            async with site.client() as c:
                root = await c.mount("/data")
                _, wh = await c.lookup(root, "work")
                assert wh is not None
                f = await _create(c, wh, "orig")
                await _write(c, f, 0, b"one", FILE_SYNC)
                assert await c.status_of(LINK, handle_args(f, diropargs(wh, "twin"))) == e.NFS3_OK
                await rest.link(SYSTEM, "/data/work/orig", "/data/work/third")  # over REST
                handles = [(await c.lookup(wh, n))[1] for n in ("orig", "twin", "third")]
                assert handles == [f, f, f]
                first = await _attrs(c, f)
                assert first.nlink == 3
                await _write(c, f, 0, b"two", FILE_SYNC)
                assert (work / "twin").read_bytes() == (work / "third").read_bytes() == b"two"
                listed = await _listed(c, wh)
                assert {listed[n][0] for n in ("orig", "twin", "third")} == {first.fileid}
                cookies = [listed[n][1] for n in ("orig", "twin", "third")]
                assert len(set(cookies)) == 3
                for name, (_, cookie) in listed.items():  # a listing resumes after any name
                    assert name not in await _listed(c, wh, cookie)
                assert await c.status_of(REMOVE, diropargs(wh, "orig")) == e.NFS3_OK
                after = await _attrs(c, f)
                assert (after.fileid, after.nlink) == (first.fileid, 2)
                assert (await c.lookup(wh, "twin"))[1] == f
                assert await _read_all(c, f) == (e.NFS3_OK, b"two")
                new = await _create(c, wh, "orig")
                assert new != f and (await _attrs(c, new)).fileid != first.fileid
                await rest.remove(SYSTEM, "/data/work/twin")  # the object's name now, over REST
                assert (await _attrs(c, f)).nlink == 1
                assert (await c.lookup(wh, "third"))[1] == f
                for name in ("orig", "third"):
                    assert await c.status_of(REMOVE, diropargs(wh, name)) == e.NFS3_OK
                assert await c.status_of(GETATTR, handle_args(f)) == e.NFS3ERR_STALE
                # names under two exports' rules stay two objects: a read-only export's
                # name is no way to write the other's
                await rest.write_bytes(SYSTEM, "/data/work/both.txt", b"rw")
                await rest.link(SYSTEM, "/data/work/both.txt", "/data/pub/both.txt")
                _, pub = await c.lookup(root, "pub")
                assert pub is not None
                _, in_pub = await c.lookup(pub, "both.txt")
                _, in_work = await c.lookup(wh, "both.txt")
                assert in_pub is not None and in_work is not None and in_pub != in_work
                await _write(c, in_work, 0, b"RW", FILE_SYNC)
                p = Packer()
                p.uhyper(0)
                p.uint(1)
                p.uint(FILE_SYNC)
                p.opaque(b"x")
                assert await c.status_of(WRITE, handle_args(in_pub, p.value())) == e.NFS3ERR_ROFS
                assert (site.vol / "pub" / "both.txt").read_bytes() == b"RW"
        finally:
            await rest.close()

    asyncio.run(linked())


@settings(max_examples=8, deadline=None, suppress_health_check=FIXTURE)
@given(mode=st.integers(0, 0o7777))
@example(mode=0o6140)  # the set-group-ID bit stays (no group execute): keeping it is no giving
def test_a_write_by_another_than_the_owner_clears_the_set_id_bits(site: Site, mode: int) -> None:
    """pjdfstest chmod/12: a write by a non-owner clears S_ISUID, and S_ISGID where the
    group may execute, in the WRITE's own attributes and on the volume (the Linux client
    leaves this to the server); the other bits stay."""
    name = f"setid{next(_SHELVED)}.bin"
    expected = mode & ~(stat.S_ISUID | (stat.S_ISGID if mode & stat.S_IXGRP else 0))

    async def written() -> int:
        rest = RestNamespace(site.hub.url, credentials=site.hub.admin)
        try:
            await rest.write_bytes(SYSTEM, f"/data/work/{name}", b"tool")
            await rest.set_attrs(SYSTEM, f"/data/work/{name}", mode=mode)  # set-id: admin's
        finally:
            await rest.close()
        async with site.client() as c:  # alice, uid 1000: not the owner
            root = await c.mount("/data")
            _, wh = await c.lookup(root, "work")
            assert wh is not None
            _, handle = await c.lookup(wh, name)
            assert handle is not None
            p = Packer()
            p.uhyper(0)
            p.uint(1)
            p.uint(UNSTABLE)
            p.opaque(b"T")
            body = await c.nfs(WRITE, handle_args(handle, p.value()))
            assert body.uint() == e.NFS3_OK
            after = wcc(body)
            assert after is not None
            assert await _commit(c, handle) == e.NFS3_OK
            return after.mode

    assert asyncio.run(written()) == expected
    on_disk = (site.vol / "work" / name).stat()
    assert stat.S_IMODE(on_disk.st_mode) == expected
    assert (site.vol / "work" / name).read_bytes() == b"Tool"


_LINK_STEPS = st.lists(
    st.tuples(
        st.sampled_from(("link", "rest-link", "unlink", "rest-unlink", "rename", "write")),
        st.integers(0, 7),
    ),
    max_size=8,
)


@settings(max_examples=6, deadline=None, suppress_health_check=FIXTURE)
@given(steps=_LINK_STEPS)
def test_every_name_of_a_file_is_its_one_handle_through_links_unlinks_and_renames(
    site: Site, steps: list[tuple[str, int]]
) -> None:
    """Whatever links, unlinks and renames (over NFS or REST) a file's names go through,
    every name the file still has looks up to the handle first handed out, with the
    file's fileid, link count and bytes."""
    top = f"linkage{next(_SHELVED)}"

    async def wander() -> None:
        rest = RestNamespace(site.hub.url, credentials=site.hub.admin)
        try:
            await rest.mkdir(SYSTEM, f"/data/work/{top}")
            async with site.client() as c:
                root = await c.mount("/data")
                _, wh = await c.lookup(root, "work")
                assert wh is not None
                _, d = await c.lookup(wh, top)
                assert d is not None
                handle = await _create(c, d, "n0")
                await _write(c, handle, 0, b"v0", FILE_SYNC)
                names, content, made = ["n0"], b"v0", 1
                for op, pick in steps:
                    name = names[pick % len(names)]
                    if op in ("link", "rest-link", "rename"):
                        new, made = f"n{made}", made + 1
                        if op == "link":
                            args = handle_args(handle, diropargs(d, new))
                            assert await c.status_of(LINK, args) == e.NFS3_OK
                        elif op == "rest-link":
                            await rest.link(
                                SYSTEM, f"/data/work/{top}/{name}", f"/data/work/{top}/{new}"
                            )
                        else:
                            args = diropargs(d, name) + diropargs(d, new)
                            assert await c.status_of(RENAME, args) == e.NFS3_OK
                            names.remove(name)
                        names.append(new)
                    elif op in ("unlink", "rest-unlink") and len(names) > 1:
                        if op == "unlink":
                            assert await c.status_of(REMOVE, diropargs(d, name)) == e.NFS3_OK
                        else:
                            await rest.remove(SYSTEM, f"/data/work/{top}/{name}")
                        names.remove(name)
                    elif op == "write":
                        content = f"v{made}".encode()
                        await _write(c, (await c.lookup(d, name))[1] or b"", 0, content, FILE_SYNC)
                    attrs = await _attrs(c, handle)
                    assert (attrs.nlink, attrs.size) == (len(names), len(content))
                    for each in names:
                        assert (await c.lookup(d, each))[1] == handle, (op, each, names)
                    assert await _read_all(c, handle) == (e.NFS3_OK, content)
        finally:
            await rest.close()

    asyncio.run(wander())


def test_a_size_beyond_the_disks_limit_is_inval_and_changes_nothing(site: Site) -> None:
    """pjdfstest ftruncate/12: a truncate to ~1 PB is EFBIG or EINVAL, not a server fault."""
    path = site.vol / "work" / "huge.txt"

    async def grow() -> int:
        rest = RestNamespace(site.hub.url, credentials=site.hub.admin)
        try:
            await rest.write_bytes(SYSTEM, "/data/work/huge.txt", b"small")
        finally:
            await rest.close()
        async with site.client() as c:
            root = await c.mount("/data")
            _, work = await c.lookup(root, "work")
            assert work is not None
            _, handle = await c.lookup(work, "huge.txt")
            assert handle is not None
            return await c.status_of(SETATTR, handle_args(handle, sattr(size=10**15) + _uint(0)))

    assert asyncio.run(grow()) == e.NFS3ERR_INVAL
    assert path.read_bytes() == b"small"


_PATHS = st.sampled_from(["/d/a", "/d/b", "/d/c", "/e/a"])
_SEEN = st.tuples(st.just("seen"), _PATHS, st.integers(1, 4))
_MOVED = st.tuples(st.just("renamed"), _PATHS, _PATHS)
_GONE = st.tuples(st.just("retired"), _PATHS, st.integers(1, 4))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.one_of(_SEEN, _MOVED, _GONE), max_size=30))
def test_one_entry_is_one_object_id_wherever_it_is_seen(
    tmp_path_factory: pytest.TempPathFactory, steps: list[tuple[str, str, object]]
) -> None:
    """Whatever paths an entry is seen at, and whatever renames the table is told of, an
    entry keeps its object id until it is retired, and two entries never share one."""
    table = HandleTable(tmp_path_factory.mktemp("handles"))
    given_ids: dict[int, int] = {}
    try:
        for op, path, other in steps:
            if op == "seen":
                assert isinstance(other, int)
                object_id = table.id(path, other)
                assert given_ids.setdefault(other, object_id) == object_id
                assert table.known(object_id) == (path, True, other)
            elif op == "renamed":
                assert isinstance(other, str)
                if not other.startswith(path + "/"):
                    table.renamed(path, other)
            elif isinstance(other, int) and other in given_ids:
                table.retire(given_ids.pop(other))
            assert len(set(given_ids.values())) == len(given_ids)
    finally:
        table.close()


_STEPS = st.one_of(
    _SEEN,
    _MOVED,
    _GONE,
    st.tuples(st.just("removed"), _PATHS, st.none()),
    st.tuples(st.just("adopted"), _PATHS, st.integers(1, 4)),
    st.tuples(st.just("aliased"), _PATHS, st.integers(1, 4)),
)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.booleans(), _STEPS), max_size=30))
def test_what_the_handle_table_keeps_read_is_what_it_holds(
    tmp_path_factory: pytest.TempPathFactory, steps: list[tuple[bool, tuple[str, str, object]]]
) -> None:
    """The table keeps the rows it read in memory: after any writes (renames, removals,
    retirements, aliases, adoptions, new ids), each object and entry it answers for is
    what a second table over the same file, which kept nothing, reads from disk."""
    directory = tmp_path_factory.mktemp("kept")
    table = HandleTable(directory)
    seen: set[tuple[str, int | None]] = set()
    try:
        for anonymous, (op, path, other) in steps:
            entry = None if anonymous or not isinstance(other, int) else other
            if op == "seen":
                table.id(path, entry)
                seen.add((path, entry))
            elif op == "renamed" and isinstance(other, str) and not other.startswith(path + "/"):
                table.renamed(path, other)
            elif op == "removed":
                table.removed(path)
            elif op in ("retired", "adopted", "aliased"):
                object_id = table.find(path)
                if object_id is not None and op == "retired":
                    table.retire(object_id)
                elif object_id is not None and op == "adopted" and isinstance(other, int):
                    table.adopt(object_id, other)
                elif object_id is not None and isinstance(other, int):
                    table.alias(other + 10, object_id, path)
            fresh = HandleTable(directory)
            try:
                for object_id in range(1, 40):
                    assert table.known(object_id) == fresh.known(object_id)
                for at, by in seen | {(p, e + 10) for p, e in seen if e is not None}:
                    assert table.find(at, by) == fresh.find(at, by)
            finally:
                fresh.close()
    finally:
        table.close()


_NAMES = st.sampled_from(["/d/a", "/d/b", "/d/c", "/e/a", "/e/b"])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(("see", "alias", "gone")), _NAMES), max_size=25))
def test_the_names_of_one_file_share_its_object_and_keep_their_own_paths(
    tmp_path_factory: pytest.TempPathFactory, steps: list[tuple[str, str]]
) -> None:
    """One hard-linked file, its names at paths (entry = the path's index): an alias
    finds the file's object by its entry, seeing an alias where it is moves neither the
    object's own path nor another name's cookie, and each name's cookie keeps its path."""
    table = HandleTable(tmp_path_factory.mktemp("aliases"))
    entries = {path: i + 1 for i, path in enumerate(["/d/a", "/d/b", "/d/c", "/e/a", "/e/b"])}
    owner: tuple[int, str] | None = None  # (object id, its own name)
    aliased: set[str] = set()
    try:
        for op, path in steps:
            entry = entries[path]
            if owner is None:
                owner = (table.id(path, entry), path)
            elif op == "see" and path in aliased | {owner[1]}:  # seen again where it is
                assert table.id(path, entry) == owner[0]
            elif op == "alias" and path != owner[1]:
                table.alias(entry, owner[0], path)
                aliased.add(path)
            elif op == "gone" and path == owner[1] and aliased:
                heir = sorted(aliased)[0]
                table.moved_to(owner[0], heir, entries[heir])
                aliased.discard(heir)
                owner = (owner[0], heir)
            elif op == "gone" and path in aliased:
                table.unalias(entry)
                aliased.discard(path)
            assert table.known(owner[0]) == (owner[1], True, entries[owner[1]])
            cookies = {name: table.cookie(owner[0], entries[name], name) for name in aliased}
            assert len(set(cookies.values()) | {owner[0]}) == len(aliased) + 1
            for name, cookie in cookies.items():
                assert table.find(name, entries[name]) == owner[0]
                known = table.known(cookie)
                assert known is not None and known.path == name
    finally:
        table.close()


# -- writes, COMMIT and handles over restarts ------------------------------------------------


async def _create(c: RpcClient, directory: bytes, name: str) -> bytes:
    p = Packer()
    p.string(name)
    p.uint(1)  # GUARDED
    for _ in range(6):
        p.uint(0)
    body = await c.nfs(CREATE, handle_args(directory, p.value()))
    assert body.uint() == e.NFS3_OK
    assert body.boolean()
    return body.opaque(64)


async def _write(c: RpcClient, handle: bytes, offset: int, data: bytes, stable: int) -> bytes:
    """WRITE; the write verifier."""
    p = Packer()
    p.uhyper(offset)
    p.uint(len(data))
    p.uint(stable)
    p.opaque(data)
    body = await c.nfs(WRITE, handle_args(handle, p.value()))
    assert body.uint() == e.NFS3_OK
    for _ in range(2):  # wcc_data: pre_op_attr and post_op_attr
        if body.boolean():
            body.fixed(24 if _ == 0 else 84)
    assert body.uint() == len(data)
    body.uint()
    return body.fixed(8)


async def _commit(c: RpcClient, handle: bytes) -> int:
    p = Packer()
    p.uhyper(0)
    p.uint(0)
    return await c.status_of(COMMIT, handle_args(handle, p.value()))


def test_unstable_writes_land_as_one_version_on_commit(site: Site) -> None:
    path = site.vol / "work" / "unstable.bin"

    async def writes() -> None:
        async with site.client() as c:
            root = await c.mount("/data")
            _, work = await c.lookup(root, "work")
            assert work is not None
            handle = await _create(c, work, "unstable.bin")
            await _write(c, handle, 0, b"a" * 1000, UNSTABLE)
            await _write(c, handle, 1000, b"b" * 1000, UNSTABLE)
            # nothing committed yet: the file on the volume is still the empty one
            assert path.read_bytes() == b""
            p = Packer()
            p.uhyper(500)
            p.uint(1000)
            body = await c.nfs(READ, handle_args(handle, p.value()))  # reads see the writes
            assert body.uint() == e.NFS3_OK
            if body.boolean():
                body.fixed(84)
            assert body.uint() == 1000
            body.boolean()
            assert body.opaque(1000) == b"a" * 500 + b"b" * 500
            assert await _commit(c, handle) == e.NFS3_OK
            assert path.read_bytes() == b"a" * 1000 + b"b" * 1000

    asyncio.run(writes())


def test_an_idle_unstable_write_is_committed_after_a_delay(site: Site) -> None:
    path = site.vol / "work" / "idle.txt"

    async def write() -> None:
        async with site.client() as c:
            root = await c.mount("/data")
            _, work = await c.lookup(root, "work")
            assert work is not None
            handle = await _create(c, work, "idle.txt")
            await _write(c, handle, 0, b"left alone", UNSTABLE)
            while path.read_bytes() != b"left alone":  # noqa: ASYNC110 - [nfs] commit_delay
                await asyncio.sleep(0.1)

    asyncio.run(write())


def test_handles_and_cookies_survive_kill_9_and_the_verifier_changes(tmp_path: Path) -> None:
    vol = _new_site(tmp_path)

    async def before(site: Site) -> tuple[bytes, bytes, bytes, int]:
        async with site.client() as c:
            root = await c.mount("/data")
            _, hello = await c.lookup(root, "hello.txt")
            _, work = await c.lookup(root, "work")
            assert hello is not None and work is not None
            handle = await _create(c, work, "stable.txt")
            verifier = await _write(c, handle, 0, b"stable", FILE_SYNC)
            # a READDIR page of /data/many, to resume from after the restart
            _, many = await c.lookup(root, "many")
            assert many is not None
            p = Packer()
            p.uhyper(0)
            p.fixed(bytes(8))
            p.uint(1024)
            body = await c.nfs(READDIR, handle_args(many, p.value()))
            assert body.uint() == e.NFS3_OK
            if body.boolean():
                body.fixed(84)
            body.fixed(8)
            cookie = 0
            while body.boolean():
                body.uhyper()
                body.string(255)
                cookie = body.uhyper()
            return hello, handle, verifier, cookie

    with _serving(tmp_path, vol) as site:
        hello, handle, verifier, cookie = asyncio.run(before(site))
        site.hub.kill()  # kill -9: what was acknowledged as stable is on disk
    assert (vol / "work" / "stable.txt").read_bytes() == b"stable"

    async def after(site: Site) -> None:
        async with site.client() as c:
            assert await c.status_of(GETATTR, handle_args(hello)) == e.NFS3_OK
            assert await _write(c, handle, 6, b"!", UNSTABLE) != verifier
            assert await _commit(c, handle) == e.NFS3_OK
            root = await c.mount("/data")
            _, many = await c.lookup(root, "many")
            assert many is not None
            p = Packer()
            p.uhyper(cookie)
            p.fixed(bytes(8))
            p.uint(1 << 16)
            body = await c.nfs(READDIR, handle_args(many, p.value()))
            assert body.uint() == e.NFS3_OK
            p = Packer()
            p.opaque(root)
            p.string("hello.txt")
            assert await c.status_of(REMOVE, p.value()) == e.NFS3_OK
            assert await c.status_of(GETATTR, handle_args(hello)) == e.NFS3ERR_STALE

    with _serving(tmp_path, vol) as site:
        asyncio.run(after(site))
    assert (vol / "work" / "stable.txt").read_bytes() == b"stable!"
    assert not (vol / "hello.txt").exists()


async def _prepare_hub(hub_dir: Path, spoke_dir: Path, data: Path) -> None:
    catalog = open_catalog(f"sqlite://{hub_dir / 'catalog.db'}")
    await catalog.open()
    try:
        await HubNamespace(catalog).add_volume("/datasets/d", f"posix://{data}")
        await SiteRegistry(catalog).add((spoke_dir / "identity" / "site.pem").read_bytes())
    finally:
        await catalog.close()


def test_a_spoke_serves_its_namespace_over_nfs(tmp_path: Path) -> None:
    hub_dir, spoke_dir, data = tmp_path / "hub", tmp_path / "spoke", tmp_path / "data"
    data.mkdir()
    (data / "in.txt").write_bytes(b"from the hub\n" * 1000)
    SiteIdentity.create(hub_dir / "identity", "hub-eu")
    SiteIdentity.create(spoke_dir / "identity", "gpu-west")
    asyncio.run(_prepare_hub(hub_dir, spoke_dir, data))
    (tmp_path / "out.txt").write_bytes(b"written at the spoke")
    with HubProcess(hub_dir, {"LOOMFS_FABRIC__LISTEN": "127.0.0.1:0"}) as hub:
        env = {"LOOMFS_NFS__LISTEN": "127.0.0.1:0", "LOOMFS_NFS__UID_MAP": '{"1000": "carol"}'}
        args = spoke_args(hub_dir, hub.urls["fabric"], "/datasets/d")
        with SpokeProcess(spoke_dir, env, args=args) as spoke:
            port = int(spoke.urls["nfs"].rpartition(":")[2])
            cat = libnfs("nfs-cat", nfs_url(port, "/datasets/d/in.txt"))
            assert (cat.returncode, cat.stdout) == (0, (data / "in.txt").read_bytes())
            put = libnfs("nfs-cp", str(tmp_path / "out.txt"), nfs_url(port, "/datasets/d/out.txt"))
            assert put.returncode == 0, put.stderr
    # without write-back a spoke's write is the hub's before it is acknowledged
    assert (data / "out.txt").read_bytes() == b"written at the spoke"


class ServeNfs(SiteProcess):
    command = ("serve", "nfs")  # its --listen is the NFS address


def test_serve_nfs_command(tmp_path: Path) -> None:
    env = {"LOOMFS_HUB__LISTEN": "127.0.0.1:0"}
    with ServeNfs(tmp_path / "site", env) as served:
        assert served.urls["nfs"].startswith("nfs://127.0.0.1:")
        port = int(served.urls["nfs"].rpartition(":")[2])

        async def null() -> int:
            async with RpcClient(port) as c:
                return (await c.call(MOUNT_PROGRAM, 3, 0)).stat

        assert asyncio.run(null()) == SUCCESS
    assert (tmp_path / "site" / "nfs" / "handle.key").stat().st_mode & 0o077 == 0


def test_the_server_registers_with_a_portmapper_and_leaves_it_at_stop(tmp_path: Path) -> None:
    with LoopThread() as loop:
        portmapper = FakePortmapper()
        pmap_port = loop.run(portmapper.start())
        portmapper.mappings[(NFS_PROGRAM, 3, 6)] = 1  # left by an earlier run: replaced
        env = {"LOOMFS_HUB__LISTEN": "127.0.0.1:0", "LOOMFS_NFS__RPCBIND": f"127.0.0.1:{pmap_port}"}
        with ServeNfs(tmp_path / "site", env) as served:
            port = int(served.urls["nfs"].rpartition(":")[2])
            assert portmapper.mappings == {(NFS_PROGRAM, 3, 6): port, (MOUNT_PROGRAM, 3, 6): port}
        assert portmapper.mappings == {}
        loop.run(portmapper.stop())
    # no portmapper there: the server says so and serves on
    assert asyncio.run(pmap.register(("127.0.0.1", free_port()), PROGRAMS, 2049)) is False
