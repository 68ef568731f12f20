"""Administration is never open, and the fabric edge trusts certificates, not names.

Volumes (list, add, rescan, remove) and settling need an explicit admin right on every
edge (the hub's REST API and the fabric link), whatever the data rules leave open; posix
volumes come only from ``[hub] volume_roots``; a fresh hub makes a local administrator
whose key only its own CLI uses; a spoke is remote whatever it is called or says.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import given, settings
from hypothesis import strategies as st

from loomfs import paths
from loomfs.config import Config
from loomfs.core.acl import ADMIN_GROUP, ANONYMOUS, AclPolicy, Rule
from loomfs.core.admin import ADMIN_USER, LocalAdmin, check_volume_url
from loomfs.core.audit import AuditReader
from loomfs.core.placement import Policy
from loomfs.core.sites import SiteRegistry
from loomfs.core.types import Action, Principal
from loomfs.core.users import UserRegistry
from loomfs.errors import InvalidArgument, PermissionDenied
from loomfs.fabric.identity import SiteIdentity
from loomfs.rest import wire
from loomfs.rest.client import RestNamespace
from loomfs.service import HubService
from loomfs.testing.fabric import Fabric, fabric
from loomfs.testing.hubproc import HubProcess, cli_ok, run_cli

WHO = Principal("tester", protocol="test")
Client = TestClient[web.Request, web.Application]


@dataclass
class Site:
    hub: HubService
    http: Client
    roots: Path
    keys: dict[str, tuple[str, str]]  # user -> (access key id, secret)


async def _users(hub: HubService) -> dict[str, tuple[str, str]]:
    """alice: a plain user; root: group admin; xadmin: an admin grant on /x only."""
    users = UserRegistry(hub.catalog)
    keys = {}
    for name, groups in (("alice", set()), ("root", {ADMIN_GROUP}), ("xadmin", set())):
        await users.add_user(name, frozenset(groups))
        key = await users.add_access_key(name)
        keys[name] = (key.access_key, key.secret)
    await hub.authorizer.store.grant("user:xadmin", "admin", "/x")
    await hub.authorizer.store.grant("user:alice", "write", "/")  # data rights, not admin
    await hub.authorizer.reload()
    return keys


@pytest.fixture
async def site(tmp_path: Path) -> AsyncIterator[Site]:
    roots = tmp_path / "roots"
    for name in ("a", "b", "c"):
        (roots / name).mkdir(parents=True)
        (roots / name / "f.txt").write_text(name)
    config = Config.model_validate(
        {
            "site": {"data_dir": str(tmp_path / "hub")},
            "hub": {"rescan_interval": 0, "watch": False, "volume_roots": [str(roots)]},
        }
    )
    hub = HubService(config)
    await hub.start()
    http: Client = TestClient(TestServer(hub.rest_server().app()))
    await http.start_server()
    try:
        yield Site(hub, http, roots, await _users(hub))
    finally:
        await http.close()
        await hub.stop()


def _auth(keys: dict[str, tuple[str, str]], who: str) -> dict[str, str]:
    return {} if who == ANONYMOUS else {"Authorization": wire.basic_authorization(*keys[who])}


async def _status(response: aiohttp.ClientResponse) -> int:
    """The outcome of an admin call: its status, or for a streamed job (progress lines)
    the error status its last line carries."""
    async with response:
        if response.status != 200 or response.content_type != "application/x-ndjson":
            return response.status
        lines = [json.loads(line) for line in (await response.read()).splitlines() if line]
    error = lines[-1].get("error") if lines else None
    return 200 if error is None else wire.status_of(wire.error_from(500, {"error": error}))


Route = Callable[[Client, dict[str, str], Path, str], Awaitable[aiohttp.ClientResponse]]
#: each admin route, called by a user (who adds volumes of their own name)
ROUTES: dict[str, Route] = {
    "list": lambda c, h, r, who: c.get(f"{wire.API}/volumes", headers=h),
    "add at /x": lambda c, h, r, who: c.post(
        f"{wire.API}/volumes", json={"mount": f"/x/v-{who}", "url": f"posix://{r}/a"}, headers=h
    ),
    "add at /z": lambda c, h, r, who: c.post(
        f"{wire.API}/volumes", json={"mount": f"/z/v-{who}", "url": f"posix://{r}/b"}, headers=h
    ),
    "rescan": lambda c, h, r, who: c.post(
        f"{wire.API}/volumes/rescan", json={"mount": "/x/pre"}, headers=h
    ),
    "remove": lambda c, h, r, who: c.delete(
        f"{wire.API}/volumes", params={"mount": "/z/pre"}, headers=h
    ),
    "settle": lambda c, h, r, who: c.post(f"{wire.API}/settle", json={"seq": 0}, headers=h),
}


async def test_rest_admin_routes_need_an_explicit_admin_right(site: Site) -> None:
    """Every principal x every admin route of the hub's REST API, on paths no data rule
    keeps closed: anonymous 401, a user with write everywhere 403, group admin allowed,
    an admin grant on /x allowed below /x only; each denial in the audit log."""
    for mount, sub in (("/x/pre", "c"), ("/z/pre", "c")):
        await site.hub.add_volume(mount, f"posix://{site.roots / sub}", lambda _: None)
    expected = {
        ANONYMOUS: dict.fromkeys(ROUTES, 401),
        "alice": dict.fromkeys(ROUTES, 403),
        "xadmin": {**dict.fromkeys(ROUTES, 403), "add at /x": 200, "rescan": 200},
        "root": {**dict.fromkeys(ROUTES, 200), "remove": 204},
    }
    got = {
        who: {
            name: await _status(await route(site.http, _auth(site.keys, who), site.roots, who))
            for name, route in ROUTES.items()
        }
        for who in (ANONYMOUS, "alice", "xadmin", "root")  # root last: it removes /z/pre
    }
    for who, outcomes in expected.items():
        assert got[who] == outcomes, who
    assert site.hub.audit is not None
    await asyncio.to_thread(site.hub.audit.flush, 30)
    denied = {
        (r.user, r.op, r.path)
        for r in AuditReader(site.hub.config.audit_dir).query()
        if r.result == "denied"
    }
    assert (ANONYMOUS, "add_volume", f"/z/v-{ANONYMOUS}") in denied
    assert ("alice", "list_volumes", "/") in denied
    assert ("xadmin", "add_volume", "/z/v-xadmin") in denied
    assert ("xadmin", "settle", "/") in denied


async def test_volume_roots_hold_against_dot_dot_and_symlinks(site: Site, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("not to be assimilated")
    (site.roots / "a" / "out").symlink_to(outside)
    admin = site.hub

    async def add(mount: str, url: str) -> None:
        await admin.add_volume(mount, url, lambda _: None)

    for url in (
        f"posix://{outside}",
        f"posix://{site.roots}/a/../../outside",
        f"posix://{site.roots / 'a' / 'out'}",
        f"posix://{site.roots}-twin",  # a sibling sharing the root's name as a prefix
        "posix:///",
    ):
        with pytest.raises(PermissionDenied, match=r"\[hub\] volume_roots"):
            await add("/o", url)
    assert "/o" not in admin.namespace.mounts
    # within a root, by whatever path: recorded as the real directory
    await add("/in", f"posix://{site.roots}/b/../a")
    [volume] = [v for v in await admin.list_volumes() if v["mount"] == "/in"]
    assert volume["url"] == f"posix://{site.roots / 'a'}"
    # and over REST, as an administrator: the same refusal
    refused = await site.http.post(
        f"{wire.API}/volumes",
        json={"mount": "/o", "url": f"posix://{outside}"},
        headers=_auth(site.keys, "root"),
    )
    assert refused.status == 403 and "volume_roots" in (await refused.json())["error"]["message"]


def test_volume_roots_default_to_none_and_leave_s3_alone(tmp_path: Path) -> None:
    assert Config().hub.volume_roots == []
    with pytest.raises(PermissionDenied, match="none is set"):
        check_volume_url(f"posix://{tmp_path}", [])
    s3 = "s3://bucket/prefix?endpoint=http://127.0.0.1:9"
    assert check_volume_url(s3, []) == s3
    roots = Config.model_validate({"hub": {"volume_roots": f"{tmp_path}:/srv"}}).hub.volume_roots
    assert roots == [tmp_path, Path("/srv")]  # as LOOMFS_HUB__VOLUME_ROOTS spells it


# -- the fabric link -------------------------------------------------------------------------


def _as_site(env: Fabric, name: str, credentials: tuple[str, str] | None = None) -> RestNamespace:
    """A fabric client of spoke ``name`` straight to the hub (no link emulator)."""
    return RestNamespace(
        f"https://127.0.0.1:{env.port}",
        ssl_context=env.ids[name].client_context(env.hub_id.cert_pem),
        credentials=credentials,
    )


async def test_fabric_admin_needs_credentials_the_hub_checked(tmp_path: Path) -> None:
    """A pinned spoke, for itself or for any user it names (an administrator's name
    too), administers nothing; an administrator's own credentials over the link do."""
    (tmp_path / "more").mkdir()
    async with fabric(tmp_path, ("gpu-west",)) as env:
        users = UserRegistry(env.hub.catalog)
        await users.add_user("root", frozenset({ADMIN_GROUP}))
        root = await users.add_access_key("root")
        await users.add_user("alice")
        alice = await users.add_access_key("alice")
        await env.hub.authorizer.reload()
        url = f"posix://{tmp_path / 'more'}"
        spoke = _as_site(env, "gpu-west")
        try:
            for call in (
                spoke.volumes(),
                spoke.add_volume("/more", url),
                spoke.remove_volume("/vol"),
                spoke.settle(0),
            ):
                with pytest.raises(PermissionDenied, match="site:gpu-west may not administer"):
                    await call
            for user in ("root", ANONYMOUS):  # named by the spoke, not proven
                named = await spoke.session.get(
                    f"{spoke.base_url}{wire.API}/volumes", headers={wire.USER_HEADER: user}
                )
                assert named.status in (401, 403)
                named.release()
        finally:
            await spoke.close()
        plain = _as_site(env, "gpu-west", (alice.access_key, alice.secret))
        try:
            with pytest.raises(PermissionDenied, match="alice may not administer"):
                await plain.add_volume("/more", url)
        finally:
            await plain.close()
        assert "/more" not in env.hub.namespace.mounts and "/vol" in env.hub.namespace.mounts
        admin = _as_site(env, "gpu-west", (root.access_key, root.secret))
        try:
            assert [v["mount"] for v in await admin.volumes()] == ["/vol"]
            await admin.add_volume("/more", url)
            assert "/more" in env.hub.namespace.mounts
            await admin.remove_volume("/more")
        finally:
            await admin.close()


async def _serve_again(env: Fabric) -> None:
    """The fabric server anew, trusting ``env.ids`` as they are now (on the same port)."""
    assert env.runner is not None
    await env.runner.cleanup()
    env.runner = None
    await env.serve_hub()


async def test_a_spoke_named_like_the_hub_or_forwarding_rest_is_still_remote(
    tmp_path: Path,
) -> None:
    """Residency refuses a spoke the data whatever its certificate is called ("local",
    the hub's own name) and whatever protocol it says its user came in by."""
    async with fabric(tmp_path, ("gpu-us",), labels={"gpu-us": {"region": "us"}}) as env:
        hub_name = env.hub.config.site.name
        env.ids["local"] = SiteIdentity.create(tmp_path / "as-local", "local")
        env.ids[hub_name] = SiteIdentity.create(tmp_path / "as-hub", hub_name)
        await _serve_again(env)
        await env.hub.namespace.mkdir(WHO, "/vol/eu")
        await env.hub.namespace.write_bytes(WHO, "/vol/eu/a.bin", b"resident in the eu")
        seq = await env.hub.placement.store.put(Policy.build("eu", ["/vol/eu/**"], ["region=eu"]))
        await env.hub.settle(seq)
        bob = Principal("bob", site="anything", protocol="rest")  # what the spoke forwards
        for name in ("gpu-us", "local", hub_name):
            client = RestNamespace(
                f"https://127.0.0.1:{env.port}",
                ssl_context=env.ids[name].client_context(env.hub_id.cert_pem),
                forward=True,
            )
            try:
                with pytest.raises(PermissionDenied, match="placement policy eu"):
                    await client.read_bytes(bob, "/vol/eu/a.bin")
                seen = await client.whoami()
                assert seen["protocol"] == "fabric"
            finally:
                await client.close()
        # the audit log keeps what the spoke said: bob came in by rest, at a spoke
        assert env.hub.audit is not None
        await asyncio.to_thread(env.hub.audit.flush, 30)
        reads = [r for r in AuditReader(env.hub.config.audit_dir).query() if r.user == "bob"]
        assert reads and {(r.protocol, r.result) for r in reads} == {("rest", "denied")}
        assert {r.site for r in reads} == {"gpu-us", "local", hub_name}


async def test_site_add_refuses_reserved_names_and_the_hubs_own(tmp_path: Path) -> None:
    hub_dir = tmp_path / "hub"
    cli_ok(hub_dir, "site", "init", "--name", "hub-eu")
    for name in ("local", "system", "anonymous", "LOCAL", "hub-eu", "hub"):  # hub: config's
        cert = SiteIdentity.create(tmp_path / f"id-{name}", name).cert_path
        refused = run_cli(hub_dir, "site", "add", name, "--cert", str(cert), "--offline")
        assert refused.returncode == 1 and b"can't be pinned" in refused.stderr, name
    fine = SiteIdentity.create(tmp_path / "id-ok", "gpu-west").cert_path
    assert "trusting gpu-west" in cli_ok(
        hub_dir, "site", "add", "gpu-west", "--cert", str(fine), "--offline"
    )
    # the registry itself refuses them, whoever calls it
    hub = HubService(Config.model_validate({"site": {"data_dir": str(hub_dir)}}))
    await hub.start()
    try:
        pem = (tmp_path / "id-local" / "site.pem").read_bytes()
        with pytest.raises(InvalidArgument):
            await SiteRegistry(hub.catalog).add(pem)
        assert [s.name for s in await SiteRegistry(hub.catalog).list()] == ["gpu-west"]
    finally:
        await hub.stop()


# -- the local administrator -----------------------------------------------------------------


class Recorded(list[tuple[str, str, str]]):
    def record(self, who: Principal, op: str, path: str, result: str, **_: object) -> None:
        self.append((who.user, op, result))


async def test_bootstrap_makes_one_administrator_with_a_private_key(tmp_path: Path) -> None:
    hub = HubService(Config.model_validate({"site": {"data_dir": str(tmp_path / "hub")}}))
    await hub.start()
    try:
        users, local, audit = UserRegistry(hub.catalog), LocalAdmin(tmp_path / "hub"), Recorded()
        made = await local.bootstrap(users, audit, "hub")
        assert made is not None and audit == [("system", "bootstrap_admin", "ok")]
        assert stat.S_IMODE(os.stat(local.key_file).st_mode) == 0o600
        assert not list(local.key_file.parent.glob(".admin.key*"))  # no partial file left
        credentials = local.credentials()
        assert credentials is not None and credentials[0] == made
        found = await users.lookup_access_key(credentials[0])
        assert found is not None and found[1] == credentials[1]
        assert found[0].name == ADMIN_USER and ADMIN_GROUP in found[0].groups
        # once: not again, not even when the file is gone while an administrator exists
        assert await local.bootstrap(users, audit, "hub") is None
        local.key_file.unlink()
        assert await local.bootstrap(users, audit, "hub") is None
        assert not local.key_file.exists() and len(audit) == 1
        # the key goes only to the URL the hub of this data directory serves at
        local.key_file.write_text(json.dumps({"access_key": "K" * 20, "secret": "s" * 40}))
        assert local.credentials_for("http://127.0.0.1:7070") is None  # not serving
        local.record_serving({"url": "http://127.0.0.1:7070", "s3": "http://127.0.0.1:9000"})
        assert local.credentials_for("http://127.0.0.1:7070/") == ("K" * 20, "s" * 40)
        assert local.credentials_for("http://127.0.0.1:9000") is None
        assert local.credentials_for("http://127.0.0.1:7071") is None
        local.stopped()
        assert local.credentials_for("http://127.0.0.1:7070") is None
    finally:
        await hub.stop()


def test_hub_serve_bootstraps_and_only_its_own_cli_administers(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    with HubProcess(tmp_path / "hub") as hub:
        key = tmp_path / "hub" / "admin.key"
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
        elsewhere = tmp_path / "elsewhere"  # a CLI of another data directory: anonymous
        refused = run_cli(elsewhere, "--hub", hub.url, "volume", "add", "/d", f"posix://{data}")
        assert refused.returncode == 1 and b"AuthenticationFailed" in refused.stderr
        cli_ok(tmp_path / "hub", "--hub", hub.url, "volume", "add", "/d", f"posix://{data}")
        assert "/d" in cli_ok(tmp_path / "hub", "--hub", hub.url, "volume", "list")
        # ordinary commands stay the caller's own (anonymous here), not the administrator's
        assert "anonymous" in cli_ok(tmp_path / "hub", "--hub", hub.url, "whoami")
    assert not (tmp_path / "hub" / "serving.json").exists()


# -- the decision, over random rules and callers ---------------------------------------------

PATHS = ["/", "/x", "/x/y", "/z", "/x/y/z"]
SUBJECTS = ["user:alice", "user:bob", "group:research", "group:everyone", "group:authenticated"]
rules = st.lists(
    st.tuples(st.sampled_from(PATHS), st.sampled_from(SUBJECTS), st.sampled_from(list(Action))),
    max_size=8,
)
callers = st.one_of(
    st.just(Principal(ANONYMOUS, protocol="rest")),
    st.builds(
        Principal,
        st.sampled_from(["alice", "bob", "carol"]),
        st.frozensets(st.sampled_from(["research", ADMIN_GROUP])),
        protocol=st.sampled_from(["rest", "s3", "sftp"]),
    ),
    st.builds(  # a user a spoke names: its groups come from the hub's registry
        Principal,
        st.sampled_from(["alice", "bob"]),
        st.frozensets(st.sampled_from(["research", ADMIN_GROUP])),
        site=st.just("gpu"),
        protocol=st.just("fabric"),
        asserted=st.just(True),
    ),
    st.just(Principal("site:gpu", site="gpu", protocol="fabric")),
)


@settings(max_examples=300, deadline=None)
@given(
    rules,
    st.lists(st.sampled_from(PATHS), max_size=2),
    st.sampled_from(["alice", "bob"]),
    callers,
    st.sampled_from(PATHS),
)
def test_admin_is_only_ever_an_explicit_right(
    granted: list[tuple[str, str, Action]],
    private: list[str],
    member: str,
    who: Principal,
    path: str,
) -> None:
    """Success implies the right: group admin, or an admin rule for one of the caller's
    subjects on the path or above; never the anonymous caller, a site, or a user a site
    merely names; the open default never counts."""
    members = {member: frozenset({"research"})}
    policy = AclPolicy([Rule(p, s, a, 0) for p, s, a in granted], private, members, 1)
    groups = who.groups | members.get(who.user, frozenset()) | {"everyone", "authenticated"}
    subjects = {f"user:{who.user}", *(f"group:{g}" for g in groups)}
    explicit = ADMIN_GROUP in groups or any(
        a is Action.ADMIN and s in subjects and paths.is_within(path, p) for p, s, a in granted
    )
    trusted = who.user != ANONYMOUS and not who.user.startswith("site:") and not who.asserted
    assert policy.admits(who, path) == (trusted and explicit)
