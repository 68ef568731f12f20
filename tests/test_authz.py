"""Authorization in one place: the ACL matrix over every protocol, and the rules' semantics.

Users (an owner through a group, a user with a read grant, a user with nothing, the
anonymous caller, an admin) x operations x protocols; every cell is asserted allow or
deny, a denial with the protocol's own error (PermissionDenied/403, AccessDenied,
EACCES, SSH_FX_PERMISSION_DENIED). Each in-process protocol is a row of ``PROTOCOLS``;
FUSE and SFTP run against a hub process (a mount per user; an SSH login per user).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import re
import stat
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import asyncssh
import boto3
import botocore.exceptions
import pytest
from aiohttp import ClientSession, web
from botocore import UNSIGNED
from botocore.config import Config as BotoConfig

from loomfs.config import load_config
from loomfs.core.acl import ANONYMOUS, AclPolicy, AclStore, Rule
from loomfs.core.audit import AuditReader
from loomfs.core.registry import open_catalog
from loomfs.core.types import SYSTEM, Action, EntryKind, Principal
from loomfs.core.users import AccessKey, UserRegistry
from loomfs.errors import (
    AuthenticationFailed,
    InvalidArgument,
    InvalidPath,
    NotFound,
    PermissionDenied,
)
from loomfs.namespace.base import Namespace
from loomfs.namespace.governed import GovernedNamespace
from loomfs.protocols.s3 import S3Gateway
from loomfs.rest.auth import HubAuthenticator
from loomfs.rest.client import RestNamespace
from loomfs.rest.server import RestServer
from loomfs.service import HubService
from loomfs.testing.fabric import Fabric, fabric
from loomfs.testing.fuse import FUSE_MISSING, MountProcess, prepare_site
from loomfs.testing.hubproc import HubProcess, cli_ok
from loomfs.testing.ports import serving
from loomfs.testing.sftp import make_key, openssh_sftp, sftp_batch

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

PROJ = "/vol/private/proj"
DATA = b"governed bytes\n" * 100
OPS = ("stat", "list", "read", "write", "mkdir", "rename", "remove", "set_tags")
# user -> (groups, the operations on PROJ it may do)
USERS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "alice": (frozenset({"research"}), frozenset(OPS)),  # owner, through group research
    "bob": (frozenset(), frozenset({"stat", "list", "read"})),  # read grant of his own
    "dave": (frozenset(), frozenset()),  # a user no rule names
    ANONYMOUS: (frozenset(), frozenset()),
    "carol": (frozenset({"admin"}), frozenset(OPS)),  # group admin may do everything
}


# -- the tree and the rules, the same at every site -----------------------------------------


async def populate(ns: Namespace, catalog: Any, *, users: bool = True) -> dict[str, AccessKey]:
    """The files (written as SYSTEM through the inner namespace), the users (unless the
    caller makes them, as ``loomfs user add`` does for SFTP), the rules."""
    await ns.mkdir(SYSTEM, f"{PROJ}/sub", parents=True)
    await ns.write_bytes(SYSTEM, f"{PROJ}/data.bin", DATA)
    await ns.write_bytes(SYSTEM, "/vol/open.txt", b"open")
    for user in USERS:
        await ns.write_bytes(SYSTEM, f"{PROJ}/ren-{user}", b"r")
        await ns.write_bytes(SYSTEM, f"{PROJ}/rm-{user}", b"r")
    registry, acl = UserRegistry(catalog), AclStore(catalog)
    await acl.add_group("research")
    keys = {}
    for user, (groups, _) in USERS.items():
        if user != ANONYMOUS and users:
            await registry.add_user(user, groups)
            keys[user] = await registry.add_access_key(user)
    await acl.set_private("/vol/private", True)
    await acl.grant("group:research", "write", PROJ)
    await acl.grant("user:bob", "read", PROJ)
    return keys


async def assert_nothing_changed_by_the_denied(ns: Namespace) -> None:
    for user, (_, allowed) in USERS.items():
        if "write" not in allowed:
            assert not await ns.exists(SYSTEM, f"{PROJ}/new-{user}")
        if "mkdir" not in allowed:
            assert not await ns.exists(SYSTEM, f"{PROJ}/dir-{user}")
        if "rename" not in allowed:
            assert await ns.exists(SYSTEM, f"{PROJ}/ren-{user}")
        if "remove" not in allowed:
            assert await ns.exists(SYSTEM, f"{PROJ}/rm-{user}")
    tagger = (await ns.get_tags(SYSTEM, f"{PROJ}/sub")).get("by")
    assert tagger is None or "set_tags" in USERS[tagger][1]


# -- actors: one operation of the matrix over one protocol -----------------------------------

Denied = Callable[[BaseException], bool]


@dataclass
class Actor:
    """How a protocol does each operation as a user, and what its denial looks like."""

    do: Callable[[str, str], Awaitable[None]]  # (operation, user)
    denied: Denied
    unsupported: frozenset[str] = frozenset()  # operations the protocol does not have


async def namespace_op(ns: Namespace, who: Principal, op: str, user: str) -> None:
    match op:
        case "stat":
            await ns.stat(who, f"{PROJ}/data.bin")
        case "list":
            assert "data.bin" in [e.name async for e in ns.list(who, PROJ)]
        case "read":
            assert await ns.read_bytes(who, f"{PROJ}/data.bin") == DATA
        case "write":
            await ns.write_bytes(who, f"{PROJ}/new-{user}", b"new")
        case "mkdir":
            await ns.mkdir(who, f"{PROJ}/dir-{user}")
        case "rename":
            await ns.rename(who, f"{PROJ}/ren-{user}", f"{PROJ}/renamed-{user}")
        case "remove":
            await ns.remove(who, f"{PROJ}/rm-{user}")
        case "set_tags":
            await ns.set_tags(who, f"{PROJ}/sub", {"by": user})


def forbidden(exc: BaseException) -> bool:
    """The namespace's and REST's denial: PermissionDenied, which REST sends as 403."""
    return isinstance(exc, PermissionDenied) and exc.code == "PermissionDenied"


def direct_actor(ns: Namespace, users: dict[str, Principal]) -> Actor:
    async def do(op: str, user: str) -> None:
        await namespace_op(ns, users[user], op, user)

    return Actor(do, forbidden)


@contextlib.asynccontextmanager
async def rest_actor(app: web.Application, keys: dict[str, AccessKey]) -> AsyncIterator[Actor]:
    """``app`` served, and a client per user with that user's credentials."""
    async with serving(app) as url:
        by_user = {
            user: RestNamespace(url, credentials=(k.access_key, k.secret))
            for user, k in keys.items()
        }
        by_user[ANONYMOUS] = RestNamespace(url)

        async def do(op: str, user: str) -> None:
            await namespace_op(by_user[user], SYSTEM, op, user)  # the server decides who

        try:
            yield Actor(do, forbidden)
        finally:
            for client in by_user.values():
                await client.close()


def s3_actor(endpoint: str, keys: dict[str, AccessKey]) -> Actor:
    def client(key: AccessKey | None) -> S3Client:
        config = BotoConfig(retries={"max_attempts": 1}, s3={"addressing_style": "path"})
        if key is None:
            config = config.merge(BotoConfig(signature_version=UNSIGNED))
        return boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id=key.access_key if key else "x",
            aws_secret_access_key=key.secret if key else "x",
            config=config,
        )

    clients = {user: client(keys.get(user)) for user in USERS}
    prefix = PROJ.removeprefix("/vol/")

    def call(op: str, user: str) -> None:
        s3 = clients[user]
        match op:
            case "stat":
                s3.head_object(Bucket="vol", Key=f"{prefix}/data.bin")
            case "list":
                found = s3.list_objects_v2(Bucket="vol", Prefix=f"{prefix}/")
                assert f"{prefix}/data.bin" in [o["Key"] for o in found.get("Contents", [])]
            case "read":
                body = s3.get_object(Bucket="vol", Key=f"{prefix}/data.bin")["Body"].read()
                assert body == DATA
            case "write":
                s3.put_object(Bucket="vol", Key=f"{prefix}/new-{user}", Body=b"new")
            case "mkdir":
                s3.put_object(Bucket="vol", Key=f"{prefix}/dir-{user}/", Body=b"")
            case "remove":
                s3.delete_object(Bucket="vol", Key=f"{prefix}/rm-{user}")

    def denied(exc: BaseException) -> bool:
        if not isinstance(exc, botocore.exceptions.ClientError):
            return False
        status = exc.response["ResponseMetadata"]["HTTPStatusCode"]
        code = exc.response["Error"]["Code"]
        return status == 403 and code in ("AccessDenied", "403")  # HEAD carries no body

    async def do(op: str, user: str) -> None:
        await asyncio.to_thread(call, op, user)

    # S3 has no rename; object tagging is not in the gateway (yet): NotImplemented for all
    return Actor(do, denied, unsupported=frozenset({"rename", "set_tags"}))


def fuse_actor(mountpoint: Path) -> Actor:
    proj = mountpoint / PROJ.removeprefix("/")  # the mount shows the whole namespace

    def call(op: str, user: str) -> None:
        match op:
            case "stat":
                os.stat(proj / "data.bin")
            case "list":
                assert "data.bin" in os.listdir(proj)
            case "read":
                assert (proj / "data.bin").read_bytes() == DATA
            case "write":
                (proj / f"new-{user}").write_bytes(b"new")
            case "mkdir":
                os.mkdir(proj / f"dir-{user}")
            case "rename":
                os.rename(proj / f"ren-{user}", proj / f"renamed-{user}")
            case "remove":
                os.unlink(proj / f"rm-{user}")
            case "set_tags":
                os.setxattr(proj / "sub", "user.by", user.encode())

    def denied(exc: BaseException) -> bool:
        return isinstance(exc, PermissionError) and exc.errno == errno.EACCES

    async def do(op: str, user: str) -> None:
        await asyncio.to_thread(call, op, user)

    return Actor(do, denied)


@contextlib.asynccontextmanager
async def sftp_actor(port: int, keys: Path) -> AsyncIterator[Actor]:
    """An SSH login per user (its key from ``keys``), asyncssh's SFTP client on it. SFTP
    has no tags (nor an anonymous login: that row is not run)."""
    sessions: dict[str, asyncssh.SFTPClient] = {}
    async with contextlib.AsyncExitStack() as stack:

        async def client(user: str) -> asyncssh.SFTPClient:
            if user not in sessions:
                login = asyncssh.connect(
                    "127.0.0.1", port, username=user, client_keys=[str(keys / user)],
                    known_hosts=None, agent_path=None, password=None,
                )  # fmt: skip
                conn = await stack.enter_async_context(await login)
                sessions[user] = await stack.enter_async_context(conn.start_sftp_client())
            return sessions[user]

        async def do(op: str, user: str) -> None:
            sftp = await client(user)
            match op:
                case "stat":
                    await sftp.stat(f"{PROJ}/data.bin")
                case "list":
                    assert "data.bin" in await sftp.listdir(PROJ)
                case "read":
                    async with sftp.open(f"{PROJ}/data.bin", "rb") as f:
                        got: object = await f.read()  # bytes ("b"), typed as str
                        assert got == DATA
                case "write":
                    async with sftp.open(f"{PROJ}/new-{user}", "wb") as f:
                        await f.write(b"new")
                case "mkdir":
                    await sftp.mkdir(f"{PROJ}/dir-{user}")
                case "rename":
                    await sftp.rename(f"{PROJ}/ren-{user}", f"{PROJ}/renamed-{user}")
                case "remove":
                    await sftp.remove(f"{PROJ}/rm-{user}")

        def denied(exc: BaseException) -> bool:
            return isinstance(exc, asyncssh.SFTPError) and exc.code == asyncssh.FX_PERMISSION_DENIED

        yield Actor(do, denied, unsupported=frozenset({"set_tags"}))


async def run_matrix(actor: Actor, users: list[str] | None = None) -> list[str]:
    """Every cell; the cells whose outcome differs from the expectation."""
    wrong = []
    for user in users or list(USERS):
        allowed = USERS[user][1]
        for op in OPS:
            if op in actor.unsupported:
                continue
            try:
                await actor.do(op, user)
            except Exception as exc:
                if op in allowed or not actor.denied(exc):
                    wrong.append(f"{user} {op}: expected {op in allowed}, got {exc!r}")
            else:
                if op not in allowed:
                    wrong.append(f"{user} {op}: allowed, expected a denial")
    return wrong


# -- sites to run the matrix against ---------------------------------------------------------


@dataclass
class Governed:
    env: Fabric
    keys: dict[str, AccessKey]
    principals: dict[str, Principal]


@pytest.fixture
async def governed(tmp_path: Path) -> AsyncIterator[Governed]:
    async with fabric(tmp_path) as env:
        keys = await populate(env.hub.namespace, env.hub.catalog)
        await env.hub.authorizer.reload()
        users = UserRegistry(env.hub.catalog)
        principals = {name: (await users.get_user(name)).principal("api") for name in keys} | {
            ANONYMOUS: Principal(ANONYMOUS, protocol="api")
        }
        yield Governed(env, keys, principals)


PROTOCOLS: dict[str, Callable[[Governed, Path], contextlib.AbstractAsyncContextManager[Actor]]]


@contextlib.asynccontextmanager
async def api_protocol(g: Governed, tmp: Path) -> AsyncIterator[Actor]:
    yield direct_actor(g.env.hub.governed, g.principals)


@contextlib.asynccontextmanager
async def rest_protocol(g: Governed, tmp: Path) -> AsyncIterator[Actor]:
    hub = g.env.hub
    server = RestServer(hub.governed, hub, authenticate=hub.authenticator())
    async with rest_actor(server.app(), g.keys) as actor:
        yield actor


@contextlib.asynccontextmanager
async def s3_protocol(g: Governed, tmp: Path) -> AsyncIterator[Actor]:
    hub = g.env.hub
    gateway = S3Gateway(
        hub.governed,
        UserRegistry(hub.catalog),
        {"vol": "/vol"},
        staging=tmp / "s3-staging",
        uploads=hub.catalog.upload_records(),
    )
    async with serving(gateway.app()) as url:
        yield s3_actor(url, g.keys)


@contextlib.asynccontextmanager
async def spoke_protocol(g: Governed, tmp: Path) -> AsyncIterator[Actor]:
    """The spoke's own REST API, its users' credentials checked by the hub."""
    env = g.env
    check = HubAuthenticator(env.client(env.first), site=env.first, anonymous=True)
    server = RestServer(env.spoke, spoke=env.spoke, site=env.first, authenticate=check)
    try:
        async with rest_actor(server.app(), g.keys) as actor:
            yield actor
    finally:
        await check.hub.close()


PROTOCOLS = {
    "api": api_protocol,
    "rest": rest_protocol,
    "s3": s3_protocol,
    "spoke": spoke_protocol,
    # "fuse" runs in test_matrix_fuse (a mount process per user, see there), "sftp" in
    # test_matrix_sftp (a hub process serving SFTP, users made by `loomfs user add`)
}


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
async def test_matrix(governed: Governed, tmp_path: Path, protocol: str) -> None:
    async with PROTOCOLS[protocol](governed, tmp_path) as actor:
        wrong = await run_matrix(actor)
    assert not wrong, "\n".join(wrong)
    await assert_nothing_changed_by_the_denied(governed.env.hub.namespace)


def test_matrix_fuse(tmp_path: Path) -> None:
    """A mount per user, each with ``--uid-map`` making this process's uid that user; the
    groups (research, admin) come from the site's registry, not from the mount."""
    if not os.path.exists("/dev/fuse"):
        pytest.fail(FUSE_MISSING)
    volume = tmp_path / "volume"
    volume.mkdir()
    (tmp_path / "site").mkdir()
    config = prepare_site(tmp_path / "site", {"/vol": volume})

    async def setup() -> None:
        service = HubService(load_config(config))
        await service.start()
        try:
            await populate(service.namespace, service.catalog)
        finally:
            await service.stop()

    asyncio.run(setup())
    wrong: list[str] = []
    for user in USERS:
        mountpoint = tmp_path / f"mnt-{user}"
        mount = MountProcess(config, mountpoint, "--uid-map", f"{os.getuid()}={user}").start()
        try:
            wrong += asyncio.run(run_matrix(fuse_actor(mountpoint), [user]))
        finally:
            mount.stop()

    async def check() -> None:
        service = HubService(load_config(config))
        await service.start()
        try:
            await assert_nothing_changed_by_the_denied(service.namespace)
        finally:
            await service.stop()

    assert not wrong, "\n".join(wrong)
    asyncio.run(check())


def test_matrix_sftp(tmp_path: Path) -> None:
    """A ``loomfs hub serve`` process serving SFTP over the whole namespace: its sessions
    go through the hub's governed namespace (the same rules as every protocol), and every
    decision lands in the hub's audit log. Users and their SSH keys come from `loomfs
    user add --ssh-key`; OpenSSH's own client sees the same denials."""
    openssh_sftp()  # fails with how to install it
    volume, keys, data_dir = tmp_path / "volume", tmp_path / "keys", tmp_path / "site"
    for d in (volume, keys, data_dir):
        d.mkdir()
    config = tmp_path / "loomfs.toml"
    config.write_text(
        f"[site]\ndata_dir = {json.dumps(str(data_dir))}\n[hub]\nrescan_interval = 0\n"
        '[sftp]\nlisten = "127.0.0.1:0"\nroot = "/"\n'
    )

    async def setup() -> None:
        service = HubService(load_config(config))
        await service.start()
        try:
            await service.namespace.add_volume("/vol", f"posix://{volume}")
            await populate(service.namespace, service.catalog, users=False)
        finally:
            await service.stop()

    asyncio.run(setup())
    users = [u for u in USERS if u != ANONYMOUS]
    for user in users:
        make_key(keys / user)
        groups = [a for g in sorted(USERS[user][0]) for a in ("--group", g)]
        cli_ok(
            data_dir,
            "user",
            "add",
            user,
            *groups,
            "--ssh-key",
            str(keys / f"{user}.pub"),
            "--offline",
        )

    async def matrix(port: int) -> list[str]:
        async with sftp_actor(port, keys) as actor:
            return await run_matrix(actor, users)

    with HubProcess(data_dir, env={"LOOMFS_CONFIG": str(config)}) as hub:
        port = int(hub.urls["sftp"].rpartition(":")[2])
        wrong = asyncio.run(matrix(port))
        # OpenSSH's client: bob reads, dave is refused reading and writing
        (tmp_path / "up.txt").write_bytes(b"up")
        get = f"get {PROJ}/data.bin got.bin\n"
        assert sftp_batch(port, "bob", keys / "bob", get, cwd=tmp_path).returncode == 0
        assert (tmp_path / "got.bin").read_bytes() == DATA
        (tmp_path / "got.bin").unlink()
        done = sftp_batch(port, "dave", keys / "dave", get, cwd=tmp_path)
        # the client globs the name first and calls a refused stat "not found"
        assert done.returncode != 0 and "not found" in done.stderr, done.stderr
        assert not (tmp_path / "got.bin").exists()
        put = f"put up.txt {PROJ}/by-dave\n"
        done = sftp_batch(port, "dave", keys / "dave", put, cwd=tmp_path)
        assert done.returncode != 0 and "Permission denied" in done.stderr, done.stderr
    assert not wrong, "\n".join(wrong)

    async def check() -> None:
        service = HubService(load_config(config))
        await service.start()
        try:
            await assert_nothing_changed_by_the_denied(service.namespace)
            assert not await service.namespace.exists(SYSTEM, f"{PROJ}/by-dave")
        finally:
            await service.stop()

    asyncio.run(check())
    records = [
        json.loads(line)
        for line in cli_ok(data_dir, "audit", "query", "--user", "dave", "--json").splitlines()
    ]
    refused = {(r["op"], r["path"]) for r in records if r["result"] == "denied"}
    assert {r["protocol"] for r in records} == {"sftp"}
    assert ("read", f"{PROJ}/data.bin") in refused or ("stat", f"{PROJ}/data.bin") in refused
    assert ("mkdir", f"{PROJ}/dir-dave") in refused
    assert ("rename", f"{PROJ}/ren-dave") in refused
    assert ("stat", f"{PROJ}/rm-dave") in refused  # SFTP's remove looks first


# -- semantics ---------------------------------------------------------------------------------


def rule(path: str, subject: str, permission: str) -> Rule:
    return Rule(path, subject, Action(permission), 0)


ALICE = Principal("alice", frozenset({"research"}))
BOB = Principal("bob")


def test_open_until_a_rule_governs() -> None:
    policy = AclPolicy([rule("/data/team", "group:research", "read")])
    anonymous = Principal(ANONYMOUS, protocol="rest")
    assert policy.allows(anonymous, Action.WRITE, "/data/other")  # nothing governs it
    assert policy.allows(anonymous, Action.WRITE, "/data")  # nor its parent
    assert not policy.allows(anonymous, Action.READ, "/data/team")
    assert not policy.allows(BOB, Action.READ, "/data/team/x")


def test_inheritance_and_implication() -> None:
    policy = AclPolicy(
        [rule("/d", "group:research", "write"), rule("/d/deep/er", "user:bob", "read")]
    )
    assert policy.allows(ALICE, Action.READ, "/d/a/b/c")  # write implies read, inherited
    assert policy.allows(ALICE, Action.WRITE, "/d/deep/er/x")  # a deeper rule takes nothing
    assert not policy.allows(ALICE, Action.ADMIN, "/d/a")
    assert policy.allows(BOB, Action.READ, "/d/deep/er/x")
    assert not policy.allows(BOB, Action.WRITE, "/d/deep/er/x")
    assert not policy.allows(BOB, Action.READ, "/d/other")
    admin = AclPolicy([rule("/d", "user:bob", "admin")])
    assert all(admin.allows(BOB, a, "/d/x") for a in Action)


def test_private_export_denies_by_default_and_shows_the_way() -> None:
    policy = AclPolicy([rule("/p/a/b", "user:bob", "read")], private=["/p"])
    assert not policy.allows(ALICE, Action.READ, "/p/x")
    assert not policy.allows(Principal(ANONYMOUS), Action.READ, "/p")
    # bob may walk down to his grant, seeing the way but nothing beside it
    assert policy.allows(BOB, Action.LIST, "/p")
    assert policy.allows(BOB, Action.LIST, "/p/a")
    assert not policy.allows(BOB, Action.READ, "/p/a")  # the way, not its content
    assert not policy.allows(BOB, Action.LIST, "/p/c")
    assert not policy.allows(BOB, Action.WRITE, "/p/a")
    assert not policy.subtree_open(BOB, Action.LIST, "/p")
    assert policy.subtree_open(BOB, Action.LIST, "/p/a/b")
    assert policy.allows(SYSTEM, Action.ADMIN, "/p/x")


def test_list_and_put_grants_and_the_built_in_groups() -> None:
    policy = AclPolicy(
        [
            rule("/b", "group:everyone", "list"),
            rule("/b", "group:authenticated", "put"),
            rule("/b/pub", "group:everyone", "read"),
        ],
        private=["/b"],
    )
    anonymous = Principal(ANONYMOUS, protocol="s3")
    # list: names and metadata, not content
    assert policy.allows(anonymous, Action.LIST, "/b/x")
    assert not policy.allows(anonymous, Action.READ, "/b/x")
    assert policy.allows(anonymous, Action.READ, "/b/pub")
    # put: change without reading; every authenticated user, never the anonymous one
    assert policy.allows(BOB, Action.WRITE, "/b/x")
    assert not policy.allows(BOB, Action.READ, "/b/x")
    assert not policy.allows(anonymous, Action.WRITE, "/b/x")
    assert not policy.allows(BOB, Action.ADMIN, "/b/x")


def test_registry_groups_count_whatever_the_protocol_says() -> None:
    policy = AclPolicy(
        [rule("/d", "group:research", "read")], members={"alice": frozenset({"research"})}
    )
    assert policy.allows(Principal("alice", protocol="fuse"), Action.READ, "/d/x")
    # the anonymous caller never gets a registered user's groups
    assert not AclPolicy(
        [rule("/d", "group:research", "read")], members={ANONYMOUS: frozenset({"research"})}
    ).allows(Principal(ANONYMOUS), Action.READ, "/d")


async def test_listing_hides_what_the_caller_may_not_see(governed: Governed) -> None:
    ns, who = governed.env.hub.governed, governed.principals
    assert {e.name async for e in ns.list(who["dave"], "/vol")} == {"open.txt"}
    assert {e.name async for e in ns.list(who["bob"], "/vol")} == {"open.txt", "private"}
    assert [e.name async for e in ns.list(who["bob"], "/vol/private")] == ["proj"]
    with pytest.raises(PermissionDenied):
        [e async for e in ns.list(who["dave"], "/vol/private")]


async def test_revoke_in_another_process_takes_effect(governed: Governed) -> None:
    """The CLI's catalog connection is not the hub's: the hub follows the generation."""
    hub = governed.env.hub
    hub.authorizer.refresh = 0.0  # look at the generation on every call (no waiting here)
    bob = governed.principals["bob"]
    assert await hub.governed.read_bytes(bob, f"{PROJ}/data.bin") == DATA
    other = open_catalog(hub.catalog.url)
    await other.open()
    try:
        await AclStore(other).revoke("user:bob", "read", PROJ)
    finally:
        await other.close()
    with pytest.raises(PermissionDenied):
        await hub.governed.read_bytes(bob, f"{PROJ}/data.bin")


async def test_wrong_rest_credentials_are_refused_and_change_nothing(governed: Governed) -> None:
    hub = governed.env.hub
    alice = governed.keys["alice"]
    server = RestServer(hub.governed, hub, authenticate=hub.authenticator())
    async with serving(server.app()) as url:
        wrong = RestNamespace(url, credentials=(alice.access_key, "not-the-secret-at-all"))
        try:
            with pytest.raises(AuthenticationFailed, match="wrong access key id or secret"):
                await wrong.write_bytes(SYSTEM, f"{PROJ}/intruder", b"x")
        finally:
            await wrong.close()
        async with (
            ClientSession() as http,
            http.put(
                f"{url}/v1/files/vol/open.txt",
                data=b"changed",
                headers={"Authorization": "Basic bm90LWJhc2U2NA=="},  # "not-base64"
            ) as response,
        ):
            assert response.status == 401
            assert response.headers["WWW-Authenticate"].startswith("Basic")
            assert (await response.json())["error"]["code"] == "AuthenticationFailed"
    assert not await hub.namespace.exists(SYSTEM, f"{PROJ}/intruder")
    assert await hub.namespace.read_bytes(SYSTEM, "/vol/open.txt") == b"open"


async def test_anonymous_can_be_turned_off(governed: Governed) -> None:
    hub = governed.env.hub
    hub.config.hub.anonymous = False
    server = RestServer(hub.governed, hub, authenticate=hub.authenticator())
    async with serving(server.app()) as url:
        anonymous = RestNamespace(url)
        try:
            with pytest.raises(AuthenticationFailed, match="needs credentials"):
                await anonymous.stat(SYSTEM, "/vol/open.txt")
        finally:
            await anonymous.close()


async def test_spoke_cache_does_not_leak(governed: Governed) -> None:
    """A file alice read at the spoke (cached, under a lease) is not served to dave, and a
    revoked right stops serving cached data once the decision's lease term is over."""
    env, who = governed.env, governed.principals
    alice = Principal("alice", site=env.first, protocol="rest")
    dave = Principal("dave", site=env.first, protocol="rest")
    assert await env.spoke.read_bytes(alice, f"{PROJ}/data.bin") == DATA
    assert env.spoke.cache.versions(f"{PROJ}/data.bin")
    assert env.spoke.leased
    with pytest.raises(PermissionDenied):
        await env.spoke.read_bytes(dave, f"{PROJ}/data.bin")
    with pytest.raises(PermissionDenied):
        await env.spoke.stat(dave, f"{PROJ}/data.bin")
    assert who["alice"].groups == frozenset({"research"})


async def test_spoke_write_commits_as_its_writer(governed: Governed) -> None:
    """The hub decides a journaled write for the user who made it, not for the site."""
    env = governed.env
    dave = Principal("dave", site=env.first, protocol="rest")
    with pytest.raises(PermissionDenied):
        await env.spoke.write_bytes(dave, f"{PROJ}/by-dave", b"x")
    assert not env.spoke.journal.pending(f"{PROJ}/by-dave")
    with pytest.raises(NotFound):
        await env.hub.namespace.stat(SYSTEM, f"{PROJ}/by-dave")
    alice = Principal("alice", site=env.first, protocol="rest")
    await env.spoke.write_bytes(alice, f"{PROJ}/by-alice", b"x")
    assert await env.hub.namespace.read_bytes(SYSTEM, f"{PROJ}/by-alice") == b"x"


async def test_a_spoke_may_not_assert_system(governed: Governed) -> None:
    env = governed.env
    link = env.client(env.first, forward=True)
    try:
        with pytest.raises(AuthenticationFailed, match="may not act as system"):
            await link.stat(Principal("system", protocol="rest"), f"{PROJ}/data.bin")
    finally:
        await link.close()


# -- the commands, against a hub process ---------------------------------------------------------


def cli(
    hub: HubProcess, *args: str, env: dict[str, str] | None = None, stdin: bytes | None = None
) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "LOOMFS_SITE__DATA_DIR": str(hub.data_dir), **(env or {})}
    for name in ("LOOMFS_ACCESS_KEY", "LOOMFS_SECRET_KEY"):
        if env is None or name not in env:
            environment.pop(name, None)
    return subprocess.run(
        [sys.executable, "-m", "loomfs.cli", "--hub", hub.url, *args],
        env=environment, input=stdin.decode() if stdin else None,
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip


def eventually(check: Callable[[], bool]) -> None:
    """Until a running hub has followed a change made by another process (it looks every
    couple of seconds); the deadline only stops a broken run."""
    deadline = time.monotonic() + 60
    while not check():
        assert time.monotonic() < deadline, "the hub never followed the change"
        time.sleep(0.2)


def test_commands_govern_a_running_hub(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "proj").mkdir(parents=True)
    (data / "proj" / "a.txt").write_text("a")
    with HubProcess(tmp_path / "site") as hub:
        assert cli(hub, "volume", "add", "/d", f"posix://{data}").returncode == 0
        assert cli(hub, "group", "add", "research").returncode == 0
        made = cli(hub, "user", "add", "alice", "--group", "research")
        assert made.returncode == 0, made.stderr
        key = re.search(r"access key id:\s+(\S+)", made.stdout)
        secret = re.search(r"secret access key:\s+(\S+)", made.stdout)
        assert key and secret
        alice = {"LOOMFS_ACCESS_KEY": key[1], "LOOMFS_SECRET_KEY": secret[1]}
        nobody = {"LOOMFS_SITE__DATA_DIR": str(tmp_path / "elsewhere")}  # not the hub's CLI
        assert "research" in cli(hub, "group", "list").stdout
        assert cli(hub, "acl", "private", "/d").returncode == 0
        typo = cli(hub, "acl", "grant", "reserch", "write", "/d/proj")
        assert typo.returncode == 1 and "no group or user named 'reserch'" in typo.stderr
        granted = cli(hub, "acl", "grant", "research", "write", "/d/proj")
        assert "group:research may write /d/proj" in granted.stdout
        listed = cli(hub, "acl", "list").stdout
        assert "group:research" in listed and "(private export)" in listed

        eventually(lambda: cli(hub, "ls", "/d").returncode == 1)
        assert "PermissionDenied" in cli(hub, "cat", "/d/proj/a.txt").stderr
        # volumes are administered by admins only, whatever the rules give on the path
        assert "PermissionDenied" in cli(hub, "volume", "remove", "/d", env=alice).stderr
        assert "AuthenticationFailed" in cli(hub, "volume", "remove", "/d", env=nobody).stderr
        assert "alice (groups research)" in cli(hub, "whoami", env=alice).stdout
        assert cli(hub, "cat", "/d/proj/a.txt", env=alice).stdout == "a"
        put = cli(hub, "put", "-", "/d/proj/b.txt", env=alice, stdin=b"b")
        assert put.returncode == 0, put.stderr
        wrong = {**alice, "LOOMFS_SECRET_KEY": "x" * 40}
        refused = cli(hub, "put", "-", "/d/proj/c.txt", env=wrong, stdin=b"c")
        assert refused.returncode == 1 and "AuthenticationFailed" in refused.stderr
        assert not (data / "proj" / "c.txt").exists()

        assert cli(hub, "acl", "revoke", "research", "write", "/d/proj").returncode == 0
        eventually(lambda: cli(hub, "cat", "/d/proj/a.txt", env=alice).returncode == 1)
        assert cli(hub, "group", "remove", "research").returncode == 0
        assert "research" not in cli(hub, "group", "list").stdout


async def test_bad_rules_are_refused_and_change_nothing(tmp_path: Path) -> None:
    catalog = open_catalog(f"sqlite://{tmp_path / 'catalog.db'}")
    await catalog.open()
    try:
        store = AclStore(catalog)
        before = await store.generation()
        with pytest.raises(InvalidArgument, match="user:NAME or group:NAME"):
            await store.grant("role:x", "read", "/d")
        with pytest.raises(InvalidArgument, match="list, read, put, write or admin"):
            await store.grant("user:bob", "own", "/d")
        with pytest.raises(InvalidPath):
            await store.grant("user:bob", "read", "/d/../etc")
        with pytest.raises(NotFound):
            await store.revoke("user:bob", "read", "/d")
        await store.add_group("research")
        await store.grant("group:research", "read", "/d")
        with pytest.raises(InvalidArgument, match="acl revoke"):
            await store.remove_group("research")  # a rule still names it
        rules, private, policy = await store.snapshot()
        assert [(r.subject, r.permission) for r in rules] == [("group:research", Action.READ)]
        assert private == [] and policy.generation == before + 2
    finally:
        await catalog.close()


async def test_a_bare_name_resolves_to_a_built_in_group_too(tmp_path: Path) -> None:
    catalog = open_catalog(f"sqlite://{tmp_path / 'catalog.db'}")
    await catalog.open()
    try:
        store = AclStore(catalog)
        await UserRegistry(catalog).add_user("carol", frozenset({"research"}))
        resolved = {n: await store.resolve(n) for n in ("everyone", "authenticated", "research")}
        assert resolved == {
            "everyone": "group:everyone",
            "authenticated": "group:authenticated",
            "research": "group:research",
        }
        assert await store.resolve("carol") == "user:carol"
        with pytest.raises(NotFound, match="no group or user named 'nobody'"):
            await store.resolve("nobody")
    finally:
        await catalog.close()


class Sink:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str, str, int]] = []

    def record(
        self, who: Principal, op: str, path: str, result: str, *, nbytes: int = 0, detail: str = ""
    ) -> None:
        self.events.append((who.user, op, path, result, nbytes))


async def test_every_call_is_recorded_once_with_its_outcome(governed: Governed) -> None:
    hub, who = governed.env.hub, governed.principals
    sink = Sink()
    ns = GovernedNamespace(hub.namespace, [hub.authorizer], audit=sink)
    data = f"{PROJ}/data.bin"
    assert await ns.read_bytes(who["bob"], data, 10, 20) == DATA[10:30]
    async with await ns.read(who["bob"], data) as reader:  # opened, closed unread
        assert reader.length == len(DATA)
    with pytest.raises(PermissionDenied):
        await ns.stat(who["dave"], data)
    with pytest.raises(NotFound):
        await ns.stat(who["alice"], f"{PROJ}/missing")
    with pytest.raises(PermissionDenied):  # both paths of a rename are checked
        await ns.rename(who["bob"], data, f"{PROJ}/moved")
    assert [e async for e in ns.list(who["bob"], PROJ)]
    # a posix volume's reader offers its local file region (for sendfile), which a consumer
    # reads without us: a reader that was not streamed counts its whole range
    unread = len(DATA)
    assert sink.events == [
        ("bob", "read", data, "ok", 20),
        ("bob", "read", data, "ok", unread),
        ("dave", "stat", data, "denied", 0),
        ("alice", "stat", f"{PROJ}/missing", "NotFound", 0),
        ("bob", "rename", data, "denied", 0),
        ("bob", "list", PROJ, "ok", 0),
    ]


async def test_hard_links_and_special_files_are_governed(governed: Governed) -> None:
    """mknod is a write of its path and needs admin by name (a device node or FIFO on
    the volume's disk is a privilege, whatever the data rules say); a hard link a write of
    both names (a write through the new one changes the source in place), over the API
    and over REST alike."""
    hub, who = governed.env.hub, governed.principals
    sink = Sink()
    ns = GovernedNamespace(hub.namespace, [hub.authorizer], audit=sink, rules=hub.authorizer)
    data = f"{PROJ}/data.bin"
    with pytest.raises(PermissionDenied):  # read only: no name to write through
        await ns.link(who["bob"], data, "/vol/bob-link")
    with pytest.raises(PermissionDenied):  # an open name, but a source it may not see
        await ns.link(who["dave"], data, "/vol/dave-link")
    with pytest.raises(PermissionDenied):
        await ns.link(who["alice"], data, "/vol/private/outside")
    with pytest.raises(PermissionDenied):
        await ns.mknod(who["bob"], f"{PROJ}/fifo-bob", stat.S_IFIFO | 0o644)
    assert (await ns.link(who["alice"], data, f"{PROJ}/alias")).nlink == 2
    with pytest.raises(PermissionDenied):  # write on the path is not enough
        await ns.mknod(who["alice"], f"{PROJ}/fifo", stat.S_IFIFO | 0o644)
    fifo = await ns.mknod(who["carol"], f"{PROJ}/fifo", stat.S_IFIFO | 0o644)
    assert fifo.kind is EntryKind.FIFO
    assert not await hub.namespace.exists(SYSTEM, "/vol/bob-link")
    assert not await hub.namespace.exists(SYSTEM, f"{PROJ}/fifo-bob")
    assert sink.events == [
        ("bob", "link", data, "denied", 0),
        ("dave", "link", data, "denied", 0),
        ("alice", "link", "/vol/private/outside", "denied", 0),
        ("bob", "mknod", f"{PROJ}/fifo-bob", "denied", 0),
        ("alice", "link", data, "ok", 0),
        ("alice", "mknod", f"{PROJ}/fifo", "denied", 0),
        ("carol", "mknod", f"{PROJ}/fifo", "ok", 0),
    ]
    # the REST routes authenticate and forward the caller as every other route
    server = RestServer(hub.governed, hub, authenticate=hub.authenticator())
    async with serving(server.app()) as url:
        bob = RestNamespace(url, credentials=(governed.keys["bob"].access_key,
                                              governed.keys["bob"].secret))  # fmt: skip
        alice = RestNamespace(url, credentials=(governed.keys["alice"].access_key,
                                                governed.keys["alice"].secret))  # fmt: skip
        try:
            with pytest.raises(PermissionDenied):
                await bob.link(SYSTEM, data, "/vol/bob-link")
            with pytest.raises(PermissionDenied):
                await bob.mknod(SYSTEM, f"{PROJ}/fifo-bob", stat.S_IFIFO | 0o600)
            assert (await alice.link(SYSTEM, data, f"{PROJ}/alias2")).nlink == 3
            with pytest.raises(PermissionDenied):
                await alice.mknod(SYSTEM, f"{PROJ}/sock", stat.S_IFSOCK | 0o600)
            assert not await hub.namespace.exists(SYSTEM, f"{PROJ}/sock")
            # atime through set_attrs is a write of the path, like mtime
            with pytest.raises(PermissionDenied):
                await bob.set_attrs(SYSTEM, data, atime_ns=10**18)
            assert (await alice.set_attrs(SYSTEM, data, atime_ns=10**18)).atime_ns == 10**18
        finally:
            await bob.close()
            await alice.close()


async def test_a_spoke_checks_credentials_with_its_hub(governed: Governed) -> None:
    env, alice = governed.env, governed.keys["alice"]
    check = HubAuthenticator(env.client(env.first), site=env.first, anonymous=True)
    server = RestServer(env.spoke, spoke=env.spoke, site=env.first, authenticate=check)
    try:
        async with serving(server.app()) as url:
            right = RestNamespace(url, credentials=(alice.access_key, alice.secret))
            wrong = RestNamespace(url, credentials=(alice.access_key, "y" * 40))
            try:
                found = await right.whoami()
                assert (found["user"], found["groups"]) == ("alice", ["research"])
                assert found["site"] == env.first
                with pytest.raises(AuthenticationFailed):
                    await wrong.write_bytes(SYSTEM, f"{PROJ}/intruder", b"x")
            finally:
                await right.close()
                await wrong.close()
    finally:
        await check.hub.close()
    assert not await env.hub.namespace.exists(SYSTEM, f"{PROJ}/intruder")


# -- the chunk link, write leases and the hub's audit log -------------------------------------


async def test_chunk_link_serves_maps_only_to_readers(governed: Governed) -> None:
    """A file's chunk map (a small file whole) is a read by the user the spoke opens it
    for; chunks by id are the site's own, never a user's; a chunked commit is a write as
    its writer. The spoke's cold open of a large file asks for the map as its user."""
    env, hub = governed.env, governed.env.hub
    big, small = f"{PROJ}/big.bin", f"{PROJ}/data.bin"
    content = os.urandom(3 << 20)  # above the spoke's whole-file size: a chunk map
    await hub.namespace.write_bytes(SYSTEM, big, content)
    bob, dave, alice = (
        Principal(u, site=env.first, protocol="rest") for u in ("bob", "dave", "alice")
    )
    link = env.client(env.first, forward=True)
    try:
        for path in (big, small):
            with pytest.raises(PermissionDenied):
                await link.open_chunked(path, small=1 << 20, who=dave)
        opened = await link.open_chunked(big, small=1 << 20, who=bob)
        assert opened.chunk_map is not None and opened.chunk_map.size == len(content)
        assert (await link.open_chunked(small, small=1 << 20, who=bob)).whole == DATA
        cmap = (await link.open_chunked(big, small=1 << 20)).chunk_map  # the site itself
        assert cmap is not None
        ids = [p.id.hex() for p in cmap][:4]
        for route in ("chunks", "chunks/missing"):
            with pytest.raises(PermissionDenied, match="sites only"):
                await link._json("POST", f"/v1/{route}", json={"ids": ids}, who=bob)
        assert await link.missing_chunks([p.id for p in cmap]) == []  # as the site: fine
        with pytest.raises(PermissionDenied):
            await link.commit_chunks(f"{PROJ}/copy-by-bob", cmap, who=bob)
        copied = await link.commit_chunks(f"{PROJ}/copy-by-alice", cmap, who=alice)
        assert copied.size == len(content)
    finally:
        await link.close()
    assert not await hub.namespace.exists(SYSTEM, f"{PROJ}/copy-by-bob")
    assert await hub.namespace.read_bytes(SYSTEM, f"{PROJ}/copy-by-alice") == content
    # at the spoke: a cold open brings the map for its user, and the cache holds nothing
    # for dave to take afterwards
    with pytest.raises(PermissionDenied):
        await env.spoke.read_bytes(dave, big)
    assert await env.spoke.read_bytes(alice, big) == content
    with pytest.raises(PermissionDenied):
        await env.spoke.read_bytes(dave, big)


async def test_write_leases_are_governed(governed: Governed) -> None:
    env, hub, who = governed.env, governed.env.hub, governed.principals
    with pytest.raises(PermissionDenied):
        await hub.governed.lease_write(who["bob"], f"{PROJ}/data.bin")  # read only
    assert await hub.governed.lease_write(who["alice"], f"{PROJ}/data.bin") > 0
    with pytest.raises(PermissionDenied):
        await hub.governed.release_write(who["dave"], f"{PROJ}/data.bin")
    await hub.governed.release_write(who["alice"], f"{PROJ}/data.bin")
    # through a spoke, the lease is taken as the writer, before any byte is journaled
    dave = Principal("dave", site=env.first, protocol="rest")
    with pytest.raises(PermissionDenied):
        await env.spoke.lease_write(dave, f"{PROJ}/data.bin")
    alice = Principal("alice", site=env.first, protocol="rest")
    assert await env.spoke.lease_write(alice, f"{PROJ}/data.bin") > 0
    await env.spoke.release_write(alice, f"{PROJ}/data.bin")


async def test_governed_calls_land_in_the_hubs_audit_log(governed: Governed) -> None:
    """The hub's own AuditLog (hash-chained, on disk) gets every governed call, also
    those a spoke forwards for its users."""
    env, hub = governed.env, governed.env.hub
    assert hub.audit is not None and hub.governed.audit is hub.audit
    dave = Principal("dave", site=env.first, protocol="rest")
    bob = Principal("bob", site=env.first, protocol="rest")
    with pytest.raises(PermissionDenied):
        await env.spoke.stat(dave, f"{PROJ}/data.bin")
    assert await env.spoke.read_bytes(bob, f"{PROJ}/data.bin") == DATA
    await asyncio.to_thread(hub.audit.flush, 30)
    reader = AuditReader(hub.config.audit_dir)
    assert reader.verify().ok
    seen = {(r.user, r.site, r.protocol, r.op, r.path, r.result) for r in reader.query()}
    assert ("dave", env.first, "rest", "stat", f"{PROJ}/data.bin", "denied") in seen
    assert any(u == "bob" and s == env.first and res == "ok" for u, s, _, _, _, res in seen)
