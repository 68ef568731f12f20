"""The hub's admin API (``rest.admin``): users, keys, groups, ACL rules, sites and policies
need an explicit admin right on what they change, whatever the data rules say, and every
outcome lands in the audit log; the CLI's admin commands go through it."""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loomfs import paths
from loomfs.config import Config
from loomfs.core.acl import ADMIN_GROUP, ANONYMOUS
from loomfs.core.audit import AuditReader
from loomfs.core.placement import Policy, PolicyStore
from loomfs.core.sites import SiteRegistry
from loomfs.core.users import UserRegistry
from loomfs.fabric.identity import SiteIdentity
from loomfs.rest import wire
from loomfs.service import HubService
from loomfs.testing.hubproc import HubProcess, run_cli

Client = TestClient[web.Request, web.Application]
WHO = (ANONYMOUS, "alice", "xadmin", "root")  # plain user, admin of /x only, group admin
A = wire.ADMIN


@dataclass
class Site:
    hub: HubService
    http: Client
    keys: dict[str, tuple[str, str]]
    certs: dict[str, str]  # site name -> PEM, for sites to add


async def _prepare(hub: HubService, tmp: Path) -> tuple[dict[str, tuple[str, str]], dict[str, str]]:
    """The callers, and for each caller what its removals remove (so an allowed call
    succeeds): a user, a group, a rule under /x, a site and a policy of its own."""
    users, acl = UserRegistry(hub.catalog), hub.authorizer.store
    sites, policies = SiteRegistry(hub.catalog), PolicyStore(hub.catalog)
    keys = {}
    for name, groups in (("alice", set()), ("root", {ADMIN_GROUP}), ("xadmin", set())):
        await users.add_user(name, frozenset(groups))
        key = await users.add_access_key(name)
        keys[name] = (key.access_key, key.secret)
    await acl.grant("user:xadmin", "admin", "/x")
    await acl.grant("user:alice", "write", "/")  # data rights, never admin
    certs = {}
    for who in WHO:
        await users.add_user(f"gone-{who}")
        await acl.add_group(f"gone-{who}")
        await acl.grant(f"user:gone-{who}", "read", f"/x/r-{who}")
        for prefix in ("gone", "new"):
            cert = SiteIdentity.create(tmp / f"{prefix}-{who}", f"{prefix}-{who}").cert_pem
            certs[f"{prefix}-{who}"] = cert.decode()
        await sites.add(certs[f"gone-{who}"].encode())
        await policies.put(Policy.build(f"gone-{who}", ["/z/**"], ["region=eu"]))
    await hub.authorizer.reload()
    return keys, certs


@pytest.fixture
async def site(tmp_path: Path) -> AsyncIterator[Site]:
    config = Config.model_validate({"site": {"data_dir": str(tmp_path / "hub")}})
    hub = HubService(config)
    await hub.start()
    http: Client = TestClient(TestServer(hub.rest_server().app()))
    await http.start_server()
    try:
        keys, certs = await _prepare(hub, tmp_path)
        yield Site(hub, http, keys, certs)
    finally:
        await http.close()
        await hub.stop()


def _auth(site: Site, who: str) -> dict[str, str]:
    if who == ANONYMOUS:
        return {}
    return {"Authorization": wire.basic_authorization(*site.keys[who])}


Call = Callable[[Client, dict[str, str], Site, str], Awaitable[aiohttp.ClientResponse]]


def _rule(path: str) -> dict[str, str]:
    return {"subject": "user:alice", "permission": "read", "path": path}


#: route -> (the call, the path its admin right is decided on)
ROUTES: dict[str, tuple[Call, Callable[[str], str]]] = {
    "users": (lambda c, h, s, w: c.get(f"{A}/users", headers=h), lambda w: "/"),
    "add user": (
        lambda c, h, s, w: c.post(f"{A}/users", json={"user": f"u-{w}"}, headers=h),
        lambda w: "/",
    ),
    "remove user": (lambda c, h, s, w: c.delete(f"{A}/users/gone-{w}", headers=h), lambda w: "/"),
    "add key": (
        lambda c, h, s, w: c.post(f"{A}/users/alice/keys", json={}, headers=h),
        lambda w: "/",
    ),
    "remove key": (
        lambda c, h, s, w: c.delete(
            f"{A}/users/alice/keys", params={"access_key": "nope"}, headers=h
        ),
        lambda w: "/",
    ),
    "smb password": (
        lambda c, h, s, w: c.put(
            f"{A}/users/alice/smb-password", json={"nt_hash": "0" * 32}, headers=h
        ),
        lambda w: "/",
    ),
    "groups": (lambda c, h, s, w: c.get(f"{A}/groups", headers=h), lambda w: "/"),
    "add group": (
        lambda c, h, s, w: c.post(f"{A}/groups", json={"group": f"g-{w}"}, headers=h),
        lambda w: "/",
    ),
    "member": (
        lambda c, h, s, w: c.post(
            f"{A}/groups/gone-{w}/members", json={"user": "alice"}, headers=h
        ),
        lambda w: "/",
    ),
    "acl": (lambda c, h, s, w: c.get(f"{A}/acl", headers=h), lambda w: "/"),
    "grant at /x": (
        lambda c, h, s, w: c.post(f"{A}/acl/grant", json=_rule(f"/x/g-{w}"), headers=h),
        lambda w: f"/x/g-{w}",
    ),
    "grant at /z": (
        lambda c, h, s, w: c.post(f"{A}/acl/grant", json=_rule(f"/z/g-{w}"), headers=h),
        lambda w: f"/z/g-{w}",
    ),
    "revoke at /x": (
        lambda c, h, s, w: c.post(
            f"{A}/acl/revoke",
            json={"subject": f"user:gone-{w}", "permission": "read", "path": f"/x/r-{w}"},
            headers=h,
        ),
        lambda w: f"/x/r-{w}",
    ),
    "private at /x": (
        lambda c, h, s, w: c.post(f"{A}/acl/private", json={"path": f"/x/p-{w}"}, headers=h),
        lambda w: f"/x/p-{w}",
    ),
    "sites": (lambda c, h, s, w: c.get(f"{A}/sites", headers=h), lambda w: "/"),
    "add site": (
        lambda c, h, s, w: c.post(
            f"{A}/sites", json={"cert": s.certs[f"new-{w}"], "labels": ["a=b"]}, headers=h
        ),
        lambda w: "/",
    ),
    "revoke site": (
        lambda c, h, s, w: c.post(f"{A}/sites/gone-{w}/revoke", headers=h),
        lambda w: "/",
    ),
    "policies": (lambda c, h, s, w: c.get(f"{A}/policies", headers=h), lambda w: "/"),
    "policy at /x": (
        lambda c, h, s, w: c.post(
            f"{A}/policies",
            json={"policy": f"x-{w}", "paths": [f"/x/{w}/**"], "allow": ["region=eu"]},
            headers=h,
        ),
        lambda w: f"/x/{w}",
    ),
    "remove policy": (
        lambda c, h, s, w: c.delete(f"{A}/policies/gone-{w}", headers=h),
        lambda w: "/z",
    ),
    "audit": (lambda c, h, s, w: c.get(f"{A}/audit?user=alice", headers=h), lambda w: "/"),
    "exports": (lambda c, h, s, w: c.get(f"{A}/exports", headers=h), lambda w: "/"),
    "nfs export at /x": (
        lambda c, h, s, w: c.post(f"{A}/exports/nfs", json={"path": f"/x/e-{w}"}, headers=h),
        lambda w: f"/x/e-{w}",
    ),
    "remove nfs export at /x": (
        lambda c, h, s, w: c.delete(f"{A}/exports/nfs", params={"path": f"/x/e-{w}"}, headers=h),
        lambda w: f"/x/e-{w}",
    ),
    "smb share at /x": (
        lambda c, h, s, w: c.post(
            f"{A}/exports/smb", json={"share": f"s-{w}", "path": f"/x/s-{w}"}, headers=h
        ),
        lambda w: f"/x/s-{w}",
    ),
    "remove smb share at /x": (
        lambda c, h, s, w: c.delete(f"{A}/exports/smb", params={"name": f"s-{w}"}, headers=h),
        lambda w: f"/x/s-{w}",
    ),
}
ALLOWED = {"root": set(ROUTES), "xadmin": {n for n in ROUTES if n.endswith("at /x")}}
#: what a successful call answers: the key removal names no key of alice's
SUCCESS = {"remove key": 404}


async def _status(site: Site, who: str, name: str) -> int:
    call, _ = ROUTES[name]
    async with await call(site.http, _auth(site, who), site, who) as response:
        return response.status


async def test_every_admin_route_needs_the_admin_right(site: Site) -> None:
    """Anonymous 401, a user with write everywhere 403, group admin allowed, an admin
    grant on /x allowed for rules and policies below /x only; all of it audited."""
    for who in WHO:
        for name in ROUTES:
            got = await _status(site, who, name)
            if who == ANONYMOUS:
                assert got == 401, name
            elif name in ALLOWED.get(who, set()):
                assert got == SUCCESS.get(name, got) and (got < 300 or name in SUCCESS), name
            else:
                assert got == 403, (who, name)
    assert site.hub.audit is not None
    await asyncio.to_thread(site.hub.audit.flush, 30)
    seen = {
        (r.user, r.op, r.path, r.result) for r in AuditReader(site.hub.config.audit_dir).query()
    }
    assert ("alice", "add_user", "/", "denied") in seen
    assert (ANONYMOUS, "list_acl", "/", "denied") in seen
    assert ("xadmin", "acl_grant", "/z/g-xadmin", "denied") in seen
    assert ("xadmin", "acl_grant", "/x/g-xadmin", "ok") in seen
    assert ("root", "add_user", "/", "ok") in seen
    assert ("root", "remove_access_key", "/", "NotFound") in seen
    assert ("xadmin", "add_nfs_export", "/x/e-xadmin", "ok") in seen
    assert ("alice", "remove_nfs_export", "/x/e-alice", "denied") in seen
    assert ("xadmin", "remove_smb_share", "/x/s-xadmin", "ok") in seen
    assert ("alice", "add_smb_share", "/x/s-alice", "denied") in seen
    # a secret is in the answer that made it, nowhere in the audit log
    answer = await site.http.post(f"{A}/users/alice/keys", json={}, headers=_auth(site, "root"))
    secret = (await answer.json())["secret"]
    await asyncio.to_thread(site.hub.audit.flush, 30)
    assert all(secret not in repr(r) for r in AuditReader(site.hub.config.audit_dir).query())


async def test_administration_is_in_force_at_the_next_call(site: Site) -> None:
    """A user made an administrator over the admin API administers at once: the hub's
    rules follow its own changes now, not at their next periodic check."""
    root = _auth(site, "root")
    async with site.http.post(f"{A}/users", json={"user": "eve"}, headers=root) as r:
        made = await r.json()
    eve = {"Authorization": wire.basic_authorization(made["access_key"], made["secret"])}
    for member, status in ((None, 403), (True, 200)):
        if member:
            async with site.http.post(
                f"{A}/groups/{ADMIN_GROUP}/members", json={"user": "eve"}, headers=root
            ) as r:
                assert r.status < 300, await r.text()
        async with site.http.get(f"{A}/users", headers=eve) as r:
            assert r.status == status, await r.text()


async def test_bad_input_is_a_clear_400(site: Site) -> None:
    root = _auth(site, "root")
    for method, route, body, words in (
        ("POST", "/users", {"groups": ["a"]}, "'user'"),
        ("POST", "/users", {"user": "bob", "groups": "a"}, "list of strings"),
        ("POST", "/acl/grant", {"subject": "user:a", "permission": "read"}, "'path'"),
        ("POST", "/acl/grant", {**_rule("/x"), "permission": "own"}, "list, read"),
        ("POST", "/sites", {"cert": "not a pem"}, "PEM"),
        ("POST", "/policies", {"policy": "p", "paths": ["rel/**"], "allow": ["a=b"]}, "absolute"),
        ("POST", "/exports/nfs", {"path": "rel"}, "absolute"),
        ("POST", "/exports/nfs", {"path": "/a/../b"}, "'..'"),
        ("POST", "/exports/nfs", {"path": "/n", "clients": ["10.0.0.0/33"]}, "not an address"),
        ("POST", "/exports/nfs", {"path": "/n", "clients": "10.0.0.0/8"}, "clients"),
        ("POST", "/exports/nfs", {"path": "/n", "access": "rx"}, "access"),
        ("POST", "/exports/nfs", {"path": "/n", "squash": "some"}, "squash"),
        ("POST", "/exports/nfs", {"path": "/n", "mode": "rw"}, "mode"),
        ("DELETE", "/exports/nfs", None, "?path="),
        ("POST", "/exports/smb", {"path": "/s"}, "'share'"),
        ("POST", "/exports/smb", {"share": "a b", "path": "/s"}, "not a share name"),
        ("POST", "/exports/smb", {"share": "homes", "path": "/s"}, "not a share name"),
        ("POST", "/exports/smb", {"share": "s"}, "path"),
        ("POST", "/exports/smb", {"share": "s", "path": "rel"}, "absolute"),
        ("POST", "/exports/smb", {"share": "s", "path": "/s", "access": "rx"}, "access"),
        ("DELETE", "/exports/smb", None, "?name="),
    ):
        async with site.http.request(method, f"{A}{route}", json=body, headers=root) as r:
            assert r.status == 400, (route, body)
            assert words in (await r.json())["error"]["message"], (route, body)
    async with site.http.post(f"{A}/users", data=b"{", headers=root) as r:
        assert r.status == 400
    async with site.http.get(f"{A}/exports", headers=root) as r:
        listed = await r.json()
    assert [x["path"] for x in listed["nfs"]["exports"]] == ["/"]  # none added
    assert [(x["share"], x["source"]) for x in listed["smb"]["shares"]] == [("loomfs", "config")]
    # the config's share, in any case Samba compares names in: the config's to change
    made = {"share": "LoomFS", "path": "/elsewhere"}
    async with site.http.post(f"{A}/exports/smb", json=made, headers=root) as r:
        assert r.status == 409, await r.text()
    async with site.http.delete(f"{A}/exports/smb?name=loomfs", headers=root) as r:
        assert r.status == 400 and "[smb.shares]" in await r.text()


@pytest.fixture
def threaded(tmp_path: Path) -> Iterator[Callable[[Callable[[], Awaitable[Any]]], Any]]:
    """A hub on an event loop of its own thread, for Hypothesis's synchronous examples."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def run(make: Callable[[], Awaitable[Any]]) -> Any:
        async def wrapped() -> Any:
            return await make()

        return asyncio.run_coroutine_threadsafe(wrapped(), loop).result()

    holder: dict[str, Any] = {}

    async def up() -> None:
        hub = HubService(Config.model_validate({"site": {"data_dir": str(tmp_path / "hub")}}))
        await hub.start()
        http: Client = TestClient(TestServer(hub.rest_server().app()))
        await http.start_server()
        keys, certs = await _prepare(hub, tmp_path)
        holder["site"] = Site(hub, http, keys, certs)

    run(up)
    try:
        yield lambda make: run(lambda: make(holder["site"]))  # type: ignore[call-arg]
    finally:

        async def down() -> None:
            await holder["site"].http.close()
            await holder["site"].hub.stop()

        run(down)
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.sampled_from(WHO), st.sampled_from(sorted(ROUTES)))
def test_success_implies_the_admin_right(
    threaded: Callable[[Callable[[Site], Awaitable[Any]]], Any], who: str, name: str
) -> None:
    """Whatever the order of calls, a route that succeeds had the admin right on its path:
    group admin anywhere, xadmin below /x only, nobody else ever."""
    status = threaded(lambda site: _status(site, who, name))
    path = ROUTES[name][1](who)
    right = who == "root" or (who == "xadmin" and paths.is_within(path, "/x"))
    if status < 300:
        assert right, (who, name, status)
    if not right:
        assert status in (401, 403), (who, name, status)


def test_admin_commands_go_through_the_running_hub(tmp_path: Path) -> None:
    """The CLI of the hub's machine administers through the admin API (the local
    administrator's key); another data directory's CLI is refused; --offline is refused
    while the hub serves."""
    hub_dir = tmp_path / "site"
    made = run_cli(hub_dir, "user", "add", "early", "--offline")  # before the first serve
    assert made.returncode == 0 and b"secret access key" in made.stdout, made.stderr
    with HubProcess(hub_dir) as hub:
        at = ("--hub", hub.url)
        added = run_cli(hub_dir, *at, "user", "add", "bob", "--group", "ml")
        assert added.returncode == 0, added.stderr
        assert re.search(rb"access key id:\s+\S+", added.stdout)
        listed = run_cli(hub_dir, *at, "user", "list").stdout.decode()
        assert "bob" in listed and "early" in listed and "ml" in listed
        assert run_cli(hub_dir, *at, "group", "add", "research").returncode == 0
        assert run_cli(hub_dir, *at, "group", "member", "research", "bob").returncode == 0
        assert "bob" in run_cli(hub_dir, *at, "group", "list").stdout.decode()
        granted = run_cli(hub_dir, *at, "acl", "grant", "research", "read", "/d")
        assert b"group:research may read /d" in granted.stdout
        policy = ("policy", "add", "eu", "--paths", "/d/eu/**", "--allow-sites", "region=eu")
        assert b"in force" in run_cli(hub_dir, *at, *policy).stdout
        assert b"eu" in run_cli(hub_dir, *at, "policy", "list").stdout
        busy = run_cli(hub_dir, *at, "user", "remove", "bob", "--offline")
        assert busy.returncode == 1 and b"--offline is for a stopped hub" in busy.stderr
        other = run_cli(tmp_path / "elsewhere", *at, "user", "remove", "bob")
        assert other.returncode == 1 and b"AuthenticationFailed" in other.stderr
        assert run_cli(hub_dir, *at, "user", "remove", "bob").returncode == 0
        assert b"bob" not in run_cli(hub_dir, *at, "user", "list").stdout
    records = {(r.op, r.protocol, r.result) for r in AuditReader(hub_dir / "audit").query()}
    assert ("user add", "offline", "ok") in records
    assert ("add_user", "rest", "ok") in records and ("remove_user", "rest", "ok") in records
