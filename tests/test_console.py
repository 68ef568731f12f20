"""The web console (``protocols.console``): its governance over HTTP (a login with the
REST credentials, signed sessions, CSRF, admin pages refused through the admin API, a
user seeing only what ACL rules give her), and the pages in a real Chromium, driven by
Playwright: log in, browse, create a user and read the key, grant, add a residency
policy, revoke a site, find an audit record, a spoke's link and cache, each page
screenshotted, no console errors."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import re
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import given, settings
from hypothesis import strategies as st

from loomfs.config import Config
from loomfs.core.acl import ADMIN_GROUP
from loomfs.core.audit import AuditReader
from loomfs.core.sites import SiteRegistry
from loomfs.core.users import UserRegistry
from loomfs.fabric.identity import SiteIdentity
from loomfs.protocols.console import Console
from loomfs.protocols.console.sessions import COOKIE, Sessions
from loomfs.rest import wire
from loomfs.rest.auth import HubAuthenticator
from loomfs.rest.server import RestServer
from loomfs.service import HubService
from loomfs.testing.fabric import fabric

if TYPE_CHECKING:
    from playwright.async_api import Browser, ConsoleMessage, Page

Client = TestClient[web.Request, web.Application]
CHROMIUM = Path("/usr/bin/chromium")
INSTALL_CHROMIUM = (
    "apt-get install -y --no-install-recommends chromium (Debian's), and "
    "pip install playwright (no browser download: the test uses /usr/bin/chromium)"
)
#: every page behind the login, GET
PAGES = (
    "/ui/browse/", "/ui/browse/vol", "/ui/download/vol/alice/a.txt", "/ui/volumes",
    "/ui/users", "/ui/keys", "/ui/exports", "/ui/acl", "/ui/policies", "/ui/sites",
    "/ui/audit?user=alice",
)  # fmt: skip
ADMIN_PAGES = (
    "/ui/volumes", "/ui/users", "/ui/keys", "/ui/exports", "/ui/acl", "/ui/policies",
    "/ui/sites", "/ui/audit",
)  # fmt: skip
#: an SSH public key line (the registry checks its shape, not the key)
SSH_KEY = "ssh-ed25519 " + base64.b64encode(bytes(range(51))).decode() + " dave@laptop"


@dataclass
class Hub:
    service: HubService
    http: Client
    keys: dict[str, tuple[str, str]]
    tmp: Path

    async def flush_audit(self) -> list[Any]:
        assert self.service.audit is not None
        await asyncio.to_thread(self.service.audit.flush, 30)
        return list(AuditReader(self.service.config.audit_dir).query())


@pytest.fixture
async def hub(tmp_path: Path) -> AsyncIterator[Hub]:
    data = tmp_path / "data"
    for name, text in (("alice/a.txt", "alice's"), ("secret/s.txt", "secret"),
                       ("eu/e.txt", "eu data")):  # fmt: skip
        (data / name).parent.mkdir(parents=True, exist_ok=True)
        (data / name).write_text(text)
    for i in range(250):  # more than a page of the browser
        (data / "many" / f"f{i:03d}").parent.mkdir(exist_ok=True)
        (data / "many" / f"f{i:03d}").write_text(str(i))
    config = Config.model_validate(
        {"site": {"data_dir": str(tmp_path / "hub"), "name": "hub-eu"},
         "hub": {"rescan_interval": 0, "watch": False, "volume_roots": [str(tmp_path)]},
         "nfs": {"exports": {"/vol/eu": {"clients": ["10.1.0.0/16"], "access": "ro"}}},
         "smb": {"shares": {"eu": {"path": "/vol/eu"}}}}
    )  # fmt: skip
    service = HubService(config)
    await service.start()
    made: Hub | None = None
    try:
        await service.add_volume("/vol", f"posix://{data}", lambda _: None)
        users, acl = UserRegistry(service.catalog), service.authorizer.store
        keys = {}
        for name, groups in (("root", {ADMIN_GROUP}), ("alice", set())):
            await users.add_user(name, frozenset(groups))
            key = await users.add_access_key(name)
            keys[name] = (key.access_key, key.secret)
        await acl.set_private("/vol", True)  # only what a rule grants
        await acl.grant("user:alice", "read", "/vol/alice")
        await service.authorizer.reload()
        async with TestClient(TestServer(service.rest_server().app())) as http:
            made = Hub(service, http, keys, tmp_path)
            yield made
    finally:
        await (made.service if made is not None else service).stop()  # a restart's


def _token(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found is not None, html
    return found.group(1)


async def login(http: Client | aiohttp.ClientSession, key: str, secret: str) -> str:
    """Log in; the session's CSRF token (from the page logged in to)."""
    form = await http.get("/ui/login")
    answer = await http.post(
        "/ui/login",
        data={"csrf": _token(await form.text()), "access_key": key, "secret": secret},
        allow_redirects=False,
    )
    assert answer.status == 303, await answer.text()
    cookie = answer.cookies[COOKIE]
    assert cookie["httponly"] and cookie["samesite"] == "Strict" and cookie["path"] == "/ui"
    assert int(cookie["max-age"]) > 0
    return _token(await (await http.get("/ui/browse/")).text())


def browser(hub: Hub) -> aiohttp.ClientSession:
    """A second browser: a cookie jar of its own (cookies of 127.0.0.1 too)."""
    return aiohttp.ClientSession(
        base_url=hub.http.make_url("/"), cookie_jar=aiohttp.CookieJar(unsafe=True)
    )


async def as_user(hub: Hub, name: str) -> tuple[aiohttp.ClientSession, str]:
    """A second browser logged in as ``name``, and its CSRF token."""
    http = browser(hub)
    return http, await login(http, *hub.keys[name])


# -- governance over HTTP ------------------------------------------------------------------


async def test_every_page_needs_a_login(hub: Hub) -> None:
    for page in PAGES:
        answer = await hub.http.get(page, allow_redirects=False)
        assert answer.status == 303, page
        assert answer.headers["Location"].startswith("/ui/login?next="), page
    # a form sent without a session changes nothing either
    answer = await hub.http.post("/ui/users", data={"action": "add_user", "user": "mallory"},
                                 allow_redirects=False)  # fmt: skip
    assert answer.status == 303
    assert "mallory" not in {u.name for u in await UserRegistry(hub.service.catalog).list_users()}


async def test_a_wrong_secret_is_refused(hub: Hub) -> None:
    key, secret = hub.keys["root"]
    form = await (await hub.http.get("/ui/login")).text()
    for wrong in (secret[:-1] + ("x" if secret[-1] != "x" else "y"), ""):
        data = {"csrf": _token(form), "access_key": key, "secret": wrong}
        answer = await hub.http.post("/ui/login", data=data, allow_redirects=False)
        form = await answer.text()  # the form again, with a token of its own
        assert answer.status == 401 and COOKIE not in answer.cookies
        assert "wrong access key id or secret" in form
    answer = await hub.http.get("/ui/users", allow_redirects=False)
    assert answer.status == 303


async def test_the_login_form_needs_its_csrf_token(hub: Hub) -> None:
    key, secret = hub.keys["root"]
    answer = await hub.http.post("/ui/login", data={"access_key": key, "secret": secret},
                                 allow_redirects=False)  # fmt: skip
    assert answer.status == 403 and COOKIE not in answer.cookies


async def test_forms_need_the_sessions_csrf_token(hub: Hub) -> None:
    csrf = await login(hub.http, *hub.keys["root"])
    for token in (None, "", csrf[:-1] + "A" if csrf[-1] != "A" else csrf[:-1] + "B"):
        data = {"action": "add_user", "user": "mallory"}
        if token is not None:
            data["csrf"] = token
        answer = await hub.http.post("/ui/users", data=data)
        assert answer.status == 403 and "CSRF" in await answer.text()
    assert "mallory" not in {u.name for u in await UserRegistry(hub.service.catalog).list_users()}
    answer = await hub.http.post(
        "/ui/users", data={"action": "add_user", "user": "bob", "csrf": csrf}
    )
    assert answer.status == 200
    assert "bob" in {u.name for u in await UserRegistry(hub.service.catalog).list_users()}


async def test_a_non_admin_is_refused_admin_pages_by_the_admin_api(hub: Hub) -> None:
    http, csrf = await as_user(hub, "alice")
    async with http:
        for page in ADMIN_PAGES:
            answer = await http.get(page)
            assert answer.status == 403, page
            assert "admin" in await answer.text(), page
        answer = await http.post(
            "/ui/users", data={"action": "add_user", "user": "eve", "csrf": csrf}
        )
        assert answer.status == 403
        answer = await http.post("/ui/acl", data={"action": "grant", "subject": "user:alice",
                                                  "permission": "read", "path": "/vol/secret",
                                                  "csrf": csrf})  # fmt: skip
        assert answer.status == 403
    assert "eve" not in {u.name for u in await UserRegistry(hub.service.catalog).list_users()}
    # refused where the admin API decides, so the audit log has each refusal
    denied = {(r.user, r.op) for r in await hub.flush_audit() if r.result == "denied"}
    assert {("alice", "list_users"), ("alice", "add_user"), ("alice", "acl_grant"),
            ("alice", "list_volumes"), ("alice", "audit_query"),
            ("alice", "list_exports")} <= denied  # fmt: skip


async def test_a_user_browses_only_what_the_rules_give_her(hub: Hub) -> None:
    http, _ = await as_user(hub, "alice")
    async with http:
        listing = await (await http.get("/ui/browse/vol")).text()
        assert "/ui/browse/vol/alice" in listing
        assert "secret" not in listing and "/ui/browse/vol/eu" not in listing
        assert (await http.get("/ui/browse/vol/secret")).status == 403
        assert (await http.get("/ui/download/vol/secret/s.txt")).status == 403
        page = await (await http.get("/ui/browse/vol/alice/a.txt")).text()
        assert "Download" in page and "/vol/alice/a.txt" in page
        crumbs = re.findall(r'<a href="/ui/browse/([^"]*)">([^<]+)</a>', page.split("</nav>")[1])
        assert crumbs == [("", "/"), ("vol", "vol"), ("vol/alice", "alice")], crumbs
        got = await http.get("/ui/download/vol/alice/a.txt")
        assert got.status == 200 and await got.read() == b"alice's"
        assert "attachment" in got.headers["Content-Disposition"]
    # an admin sees it all; the reads are the user's own, over the console
    await login(hub.http, *hub.keys["root"])
    listing = await (await hub.http.get("/ui/browse/vol")).text()
    assert "/ui/browse/vol/secret" in listing and "/ui/browse/vol/eu" in listing
    records = await hub.flush_audit()
    assert any(r.user == "alice" and r.protocol == "console" and r.op == "read"
               and r.path == "/vol/alice/a.txt" and r.result == "ok" for r in records)  # fmt: skip
    assert any(r.user == "alice" and r.protocol == "console" and r.path == "/vol/secret"
               and r.result == "denied" for r in records)  # fmt: skip


async def test_a_directory_is_listed_by_pages(hub: Hub) -> None:
    await login(hub.http, *hub.keys["root"])
    seen: list[str] = []
    url: str | None = "/ui/browse/vol/many"
    while url is not None:
        page = await (await hub.http.get(url)).text()
        seen += re.findall(r'href="/ui/browse/vol/many/(f\d+)"', page)
        found = re.search(r'href="(/ui/browse/vol/many\?after=[^"]+)" rel="next"', page)
        url = found.group(1) if found else None
    assert seen == [f"f{i:03d}" for i in range(250)]


async def test_logging_out_or_losing_the_key_ends_the_session(hub: Hub) -> None:
    csrf = await login(hub.http, *hub.keys["root"])
    cookie = hub.http.session.cookie_jar.filter_cookies(hub.http.make_url("/ui/"))[COOKIE].value
    answer = await hub.http.post("/ui/logout", data={"csrf": csrf}, allow_redirects=False)
    assert answer.status == 303
    replayed = await hub.http.get("/ui/browse/", cookies={COOKIE: cookie}, allow_redirects=False)
    assert replayed.status == 303  # closed at the server, not only forgotten by the browser
    http, _ = await as_user(hub, "alice")
    async with http:
        assert (await http.get("/ui/browse/vol", allow_redirects=False)).status == 200
        await UserRegistry(hub.service.catalog).remove_access_key(hub.keys["alice"][0])
        for _ in range(1000):  # the authenticator remembers a verified pair for 2 s
            if (await http.get("/ui/browse/vol", allow_redirects=False)).status == 303:
                break
            await asyncio.sleep(0.02)
        else:
            raise AssertionError("a removed key's session went on")


async def test_a_new_users_secret_is_shown_once_and_logs_in(hub: Hub) -> None:
    csrf = await login(hub.http, *hub.keys["root"])
    made = await (
        await hub.http.post(
            "/ui/users",
            data={"action": "add_user", "user": "carol", "groups": "ml, eu", "csrf": csrf},
        )
    ).text()
    key = re.search(r'id="new-access-key">([^<]+)<', made)
    secret = re.search(r'id="new-secret">([^<]+)<', made)
    assert key is not None and secret is not None, made
    again = await (await hub.http.get("/ui/users")).text()
    assert key.group(1) in again and secret.group(1) not in again
    async with browser(hub) as http:
        await login(http, key.group(1), secret.group(1))
        assert "carol" in await (await http.get("/ui/browse/")).text()


async def test_volumes_are_added_and_removed_by_an_admin_only(hub: Hub) -> None:
    more = hub.tmp / "more"
    (more / "sub").mkdir(parents=True)
    (more / "sub" / "m.txt").write_text("more")
    form = {"action": "add", "mount": "/more", "url": f"posix://{more}"}
    http, alices = await as_user(hub, "alice")
    async with http:
        assert (await http.post("/ui/volumes", data={**form, "csrf": alices})).status == 403
    assert "/more" not in hub.service.namespace.mounts
    csrf = await login(hub.http, *hub.keys["root"])
    page = await (await hub.http.post("/ui/volumes", data={**form, "csrf": csrf})).text()
    assert "added volume /more: 2 entries imported" in page, page
    assert 'href="/ui/browse/more"' in page
    listing = await (await hub.http.get("/ui/browse/more/sub")).text()
    assert "/ui/browse/more/sub/m.txt" in listing
    data = {"action": "remove", "mount": "/more", "csrf": csrf}
    page = await (await hub.http.post("/ui/volumes", data=data)).text()
    assert "removed volume /more" in page and 'href="/ui/browse/more"' not in page
    assert (more / "sub" / "m.txt").read_text() == "more"  # the storage is left as it was
    seen = {(r.user, r.op, r.path, r.result) for r in await hub.flush_audit()}
    assert {("alice", "add_volume", "/more", "denied"), ("root", "add_volume", "/more", "ok"),
            ("root", "remove_volume", "/more", "ok")} <= seen  # fmt: skip


async def test_ssh_keys_are_added_and_removed_by_an_admin_only(hub: Hub) -> None:
    users = UserRegistry(hub.service.catalog)
    form = {"action": "add", "user": "alice", "line": SSH_KEY}
    http, alices = await as_user(hub, "alice")
    async with http:
        assert (await http.post("/ui/keys", data={**form, "csrf": alices})).status == 403
    assert (await users.get_user("alice")).ssh_keys == ()
    csrf = await login(hub.http, *hub.keys["root"])
    page = await (await hub.http.post("/ui/keys", data={**form, "csrf": csrf})).text()
    (key,) = (await users.get_user("alice")).ssh_keys
    assert key.line == SSH_KEY and f"added SSH key {key.fingerprint} for alice" in page, page
    assert key.fingerprint.startswith("SHA256:") and "dave@laptop" in page
    data = {"action": "remove", "user": "alice", "line": SSH_KEY, "csrf": csrf}
    page = await (await hub.http.post("/ui/keys", data=data)).text()
    assert "removed an SSH key of alice" in page and key.fingerprint not in page
    assert (await users.get_user("alice")).ssh_keys == ()
    bad = await hub.http.post("/ui/keys", data={**data, "action": "add", "line": "not a key"})
    assert bad.status == 400 and "OpenSSH public key" in await bad.text()
    seen = {(r.user, r.op, r.result) for r in await hub.flush_audit()}
    assert {("alice", "add_ssh_key", "denied"), ("root", "add_ssh_key", "ok"),
            ("root", "remove_ssh_key", "ok")} <= seen  # fmt: skip


async def test_the_exports_page_shows_the_exports_and_adds_an_nfs_one(hub: Hub) -> None:
    csrf = await login(hub.http, *hub.keys["root"])
    page = await (await hub.http.get("/ui/exports")).text()
    nfs = page.split('id="nfs-title"')[1].split("</table>")[0]
    assert "<code>/vol/eu</code>" in nfs and "10.1.0.0/16" in nfs and "<td>ro</td>" in nfs
    assert "Remove NFS export" not in nfs  # the config file's: removed there
    form = {"action": "add", "path": "/vol/alice", "clients": "10.2.0.0/16, ::1", "csrf": csrf}
    for bad, words in (({"clients": "10.2.0.0/99"}, "not an address"),
                       ({"path": "vol"}, "absolute"), ({"csrf": "x"}, "CSRF")):  # fmt: skip
        refused = await hub.http.post("/ui/exports", data={**form, **bad})
        assert refused.status in (400, 403) and words in await refused.text(), bad
    assert [x["path"] for x in await hub.service.nfs_exports.listed()] == ["/vol/eu"]
    page = await (await hub.http.post("/ui/exports", data={**form, "squash": "all"})).text()
    assert "exported /vol/alice over NFS" in page and "Remove NFS export /vol/alice" in page
    (added,) = await hub.service.nfs_exports.added()
    assert (await hub.service.nfs_exports.table())[added].squash == "all"
    data = {"action": "remove", "path": "/vol/alice", "csrf": csrf}
    page = await (await hub.http.post("/ui/exports", data=data)).text()
    assert "removed NFS export /vol/alice" in page and "/vol/alice</code>" not in page
    assert await hub.service.nfs_exports.added() == {}
    smb = page.split('id="smb-title"')[1].split("</table>")[0]
    assert "<td>eu</td>" in smb and "<code>/vol/eu</code>" in smb
    assert "Remove SMB share" not in smb  # the config file's
    share = {"protocol": "smb", "action": "add", "share": "team", "path": "/vol/alice"}
    for bad, words in (({"share": "a b"}, "not a share name"), ({"share": "EU"}, "config file"),
                       ({"path": "vol"}, "absolute")):  # fmt: skip
        refused = await hub.http.post("/ui/exports", data={**share, **bad, "csrf": csrf})
        assert refused.status in (400, 409) and words in await refused.text(), bad
    page = await (await hub.http.post("/ui/exports", data={**share, "csrf": csrf})).text()
    assert "shared /vol/alice over SMB as team" in page and "Remove SMB share team" in page
    assert list(await hub.service.smb_shares.added()) == ["team"]
    data = {"protocol": "smb", "action": "remove", "share": "team", "csrf": csrf}
    page = await (await hub.http.post("/ui/exports", data=data)).text()
    assert "removed SMB share team" in page and "Remove SMB share team" not in page
    assert await hub.service.smb_shares.added() == {}
    # the same call over REST: what the page shows, and refused to a non-admin
    for who, status in (("alice", 403), ("root", 200)):
        auth = {"Authorization": wire.basic_authorization(*hub.keys[who])}
        answer = await hub.http.get("/v1/admin/exports", headers=auth)
        assert answer.status == status, who
    assert (await answer.json())["nfs"]["exports"][0]["clients"] == ["10.1.0.0/16"]


async def test_a_hubs_metrics_show_no_spoke_gauges_and_its_charts_sample_them(hub: Hub) -> None:
    scraped = await (await hub.http.get("/metrics")).text()
    assert (
        "loomfs_volumes 1.0" in scraped and 'loomfs_catalog_seconds_count{call="read"}' in scraped
    )
    assert "loomfs_cache_" not in scraped and "loomfs_spoke_" not in scraped
    # the console's sampler runs with the app: its first sample, taken off the loop at the
    # start, gives the gauge its first value
    await login(hub.http, *hub.keys["root"])
    for _ in range(1000):
        page = await (await hub.http.get("/ui/charts")).text()
        if "<circle" in page:
            break
        await asyncio.sleep(0.02)
    else:
        raise AssertionError(f"the charts were never sampled: {page}")
    titles = re.findall(r'<span class="title">([^<]+)</span>', page)
    assert titles == ["Requests", "Link bytes", "Catalog calls", "Audit records", "Read leases"]
    day = await (await hub.http.get("/ui/charts?span=24h")).text()
    assert re.findall(r'<span class="title">([^<]+)</span>', day) == titles and "<circle" in day
    wrong = await hub.http.get("/ui/charts?span=1y")
    assert wrong.status == 400 and "span must be one of" in await wrong.text()


async def test_loomfs_top_once_prints_a_frame_of_the_sites_rates(hub: Hub) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "loomfs.cli", "--hub", str(hub.http.make_url("")).rstrip("/"),
        "top", "--once", "--interval", "0.2",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "COLUMNS": "120"},
    )  # fmt: skip
    out, _ = await proc.communicate()
    text = out.decode()
    assert proc.returncode == 0, text
    assert "loomfs top: hub http://127.0.0.1:" in text, text
    rows = {c[0]: c[1:] for line in text.splitlines()
            if len(c := [x.strip() for x in line.split("│")[1:-1]]) == 3}  # fmt: skip
    assert list(rows) == ["Requests", "Link bytes", "Catalog calls", "Audit records",
                          "Read leases"], text  # fmt: skip
    # its own first scrape is counted by the second: a rate above 0, the largest so far
    rate = re.fullmatch(r"([\d,.]+)/s", rows["Requests"][0])
    assert rate is not None and float(rate.group(1).replace(",", "")) > 0, text
    assert rows["Requests"][1] == "█", text


async def test_logins_and_logouts_are_audited(hub: Hub) -> None:
    key, secret = hub.keys["root"]
    form = await (await hub.http.get("/ui/login")).text()
    data = {"csrf": _token(form), "access_key": key, "secret": secret + "x"}
    assert (await hub.http.post("/ui/login", data=data)).status == 401
    csrf = await login(hub.http, key, secret)
    await hub.http.post("/ui/logout", data={"csrf": csrf}, allow_redirects=False)
    seen = [(r.user, r.op, r.result) for r in await hub.flush_audit()
            if r.protocol == "console" and r.op in ("login", "logout")]  # fmt: skip
    assert seen == [("anonymous", "login", "AuthenticationFailed"), ("root", "login", "ok"),
                    ("root", "logout", "ok")], seen  # fmt: skip
    records = await hub.flush_audit()
    failed = next(r for r in records if r.op == "login" and r.result != "ok")
    assert key in failed.detail and secret not in failed.detail


async def test_a_session_outlives_a_restart_but_not_its_key(hub: Hub) -> None:
    await login(hub.http, *hub.keys["alice"])
    jar = hub.http.session.cookie_jar.filter_cookies(hub.http.make_url("/ui/"))
    cookie = {COOKIE: jar[COOKIE].value}
    await hub.service.stop()
    hub.service = HubService(hub.service.config)
    await hub.service.start()
    async with TestClient(TestServer(hub.service.rest_server().app())) as http:
        answer = await http.get("/ui/browse/vol", cookies=cookie, allow_redirects=False)
        assert answer.status == 200 and "/ui/browse/vol/alice" in await answer.text()
        store = hub.service.config.site.data_dir / "console-sessions.db"
        assert store.stat().st_mode & 0o077 == 0
        assert hub.keys["alice"][1].encode() not in store.read_bytes()  # sealed
        await UserRegistry(hub.service.catalog).remove_access_key(hub.keys["alice"][0])
        for _ in range(1000):  # the authenticator remembers a verified pair for 2 s
            if (await http.get("/ui/browse/vol", cookies=cookie,
                               allow_redirects=False)).status == 303:  # fmt: skip
                break
            await asyncio.sleep(0.02)
        else:
            raise AssertionError("a removed key's session went on")
    # closed for good: it is not in the store for the next process either
    assert Sessions(store=store).get(cookie[COOKIE]) is None


@settings(max_examples=30, deadline=None)
@given(secret=st.text(alphabet=st.characters(codec="ascii", categories=["L", "N"]),
                      min_size=8, max_size=40))  # fmt: skip
def test_a_stored_session_holds_no_secret_and_no_cookie(tmp_path_factory: Any, secret: str) -> None:
    store = tmp_path_factory.mktemp("sessions") / "s.db"
    credentials = f"Basic key:{secret}"
    cookie, session = Sessions(store=store).open(credentials)
    stored = store.read_bytes()
    assert credentials.encode() not in stored and secret.encode() not in stored
    assert session.id.encode() not in stored and cookie.encode() not in stored
    later = Sessions(store=store)  # the next process
    assert later.get(cookie) == session
    later.close(session)
    assert Sessions(store=store).get(cookie) is None


@settings(max_examples=200, deadline=None)
@given(
    cookie=st.text(alphabet=st.characters(codec="ascii"), max_size=120), flip=st.integers(0, 200)
)
def test_a_forged_or_altered_cookie_opens_no_session(cookie: str, flip: int) -> None:
    sessions = Sessions()
    real, session = sessions.open("Basic eDp5")
    assert sessions.get(real) == session
    assert sessions.get(cookie) is None
    altered = list(real)
    altered[flip % len(real)] = "x" if real[flip % len(real)] != "x" else "y"
    assert sessions.get("".join(altered)) is None
    other = Sessions()  # another process's key
    assert other.get(real) is None


# -- in a real browser ---------------------------------------------------------------------


@dataclass
class Chromium:
    """Debian's chromium driven by Playwright: pages whose console errors are kept, and
    screenshots of them under ``shots``."""

    browser: Browser
    base: str
    shots: Path
    errors: list[str]

    async def page(self) -> Page:
        """A page in a browser context of its own (its own cookies)."""
        context = await self.browser.new_context(viewport={"width": 1280, "height": 800})
        page = await context.new_page()

        def noted(message: ConsoleMessage) -> None:
            if message.type == "error":
                self.errors.append(f"{page.url}: {message.text}")

        page.on("console", noted)
        page.on("pageerror", lambda exc: self.errors.append(f"{page.url}: {exc}"))
        return page

    async def shot(self, page: Page, name: str) -> None:
        await page.screenshot(path=str(self.shots / f"{name}.png"), full_page=True)

    async def login(self, page: Page, key: str, secret: str, to: str = "/ui/browse/vol") -> None:
        """Log in with the keyboard alone, from the redirect a page behind the login gives."""
        await page.goto(self.base + to)
        assert "/ui/login" in page.url
        await page.get_by_label("Access key id").focus()
        await page.keyboard.type(key)
        await page.keyboard.press("Tab")
        await page.keyboard.type(secret)
        await page.keyboard.press("Enter")  # the form's own submit: no script anywhere
        await page.wait_for_url(self.base + to)


@contextlib.asynccontextmanager
async def chromium(base: str, tmp_path: Path) -> AsyncIterator[Chromium]:
    """A browser on ``base``; on leaving, no page may have logged an error."""
    try:
        from playwright.async_api import async_playwright  # noqa: PLC0415
    except ImportError:
        pytest.fail(f"Playwright for Python is missing: {INSTALL_CHROMIUM}")
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: {INSTALL_CHROMIUM}")
    shots = tmp_path / "screenshots"
    shots.mkdir()
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=["--no-sandbox"]
        )
        made = Chromium(browser, base.rstrip("/"), shots, [])
        try:
            yield made
        finally:
            await browser.close()
    assert not made.errors, made.errors


async def test_the_console_in_chromium(hub: Hub, tmp_path: Path) -> None:
    pin = SiteIdentity.create(tmp_path / "gpu-west-id", "gpu-west", labels={"region": "eu"})
    await SiteRegistry(hub.service.catalog).add(pin.cert_pem)
    async with chromium(str(hub.http.make_url("")), tmp_path) as web_ui:
        page = await web_ui.page()
        await page.goto(f"{web_ui.base}/ui/login")
        await web_ui.shot(page, "login")
        await web_ui.login(page, *hub.keys["root"])
        await web_ui.shot(page, "browse")
        await page.get_by_role("link", name="alice/").click()
        await page.get_by_role("link", name="a.txt").click()
        assert await page.locator("dd code").first.inner_text() == "/vol/alice/a.txt"
        await web_ui.shot(page, "file")
        async with page.expect_download() as download:
            await page.get_by_role("link", name="Download").click()
        assert Path(await (await download.value).path()).read_bytes() == b"alice's"

        await page.get_by_role("link", name="Volumes").click()
        assert await page.get_by_role("cell", name="ready", exact=True).count() == 1
        await web_ui.shot(page, "volumes")

        await page.get_by_role("link", name="Users").click()
        await page.get_by_label("Name").fill("dave")
        await page.get_by_label("Groups").fill("ml")
        await page.get_by_role("button", name="Add user").click()
        key = await page.locator("#new-access-key").inner_text()
        secret = await page.locator("#new-secret").inner_text()
        await web_ui.shot(page, "users")

        await page.get_by_role("link", name="SSH keys").click()
        await page.get_by_label("User").select_option("dave")
        await page.get_by_label("Public key").fill(SSH_KEY)
        await page.get_by_role("button", name="Add key").click()
        assert "added SSH key SHA256:" in await page.get_by_role("status").inner_text()
        assert await page.locator("table.keys").get_by_role("cell", name="dave@laptop").count() == 1
        await web_ui.shot(page, "keys")
        await page.get_by_role("button", name="Remove SSH key SHA256:").click()
        assert await page.get_by_role("cell", name="No SSH keys.").count() == 1

        await page.get_by_role("link", name="Exports").click()
        nfs = page.get_by_role("table", name="NFS exports")
        assert await nfs.get_by_role("cell", name="10.1.0.0/16").count() == 1
        adding = page.get_by_role("form", name="Add an NFS export")
        await adding.get_by_label("Directory").fill("/vol/alice")
        await adding.get_by_label("Clients").fill("10.3.0.0/16")
        await adding.get_by_label("Access").select_option("ro")
        await adding.get_by_role("button", name="Add export").click()
        assert "exported /vol/alice over NFS" in await page.get_by_role("status").inner_text()
        assert await nfs.get_by_role("cell", name="10.3.0.0/16").count() == 1
        assert "/vol/alice" in await hub.service.nfs_exports.added()
        assert (
            await page.get_by_role("table", name="SMB shares")
            .get_by_role("cell", name="eu", exact=True)
            .count()
            == 1
        )
        await web_ui.shot(page, "exports")

        await page.get_by_role("link", name="Access rules").click()
        await page.get_by_label("Subject").fill("user:dave")
        await page.get_by_label("Right").select_option("read")
        await page.get_by_label("Path").fill("/vol/eu")
        await page.get_by_role("button", name="Grant").click()
        notice = await page.get_by_role("status").inner_text()
        assert "granted read on /vol/eu to user:dave" in notice
        await web_ui.shot(page, "acl")

        await page.get_by_role("link", name="Residency").click()
        await page.get_by_label("Name").fill("eu-only")
        await page.get_by_label("Paths").fill("/vol/eu/**")
        await page.get_by_label("Allowed site labels").fill("region=eu")
        await page.get_by_role("button", name="Store policy").click()
        assert await page.get_by_role("cell", name="eu-only", exact=True).count() == 1
        await web_ui.shot(page, "policies")

        await page.get_by_role("link", name="Sites").click()
        await page.get_by_role("button", name="Revoke site gpu-west").click()
        assert await page.get_by_text("revoked", exact=True).count() == 1
        await web_ui.shot(page, "sites")

        # the new user, in a browser of their own, reads what the grant gave
        dave = await web_ui.page()
        await web_ui.login(dave, key, secret)
        assert await dave.get_by_role("link", name="eu/").count() == 1
        assert await dave.get_by_role("link", name="secret/").count() == 0
        await dave.get_by_role("link", name="eu/").click()
        await dave.get_by_role("link", name="e.txt").click()

        await hub.flush_audit()
        await page.get_by_role("link", name="Audit").click()
        await page.get_by_label("User").fill("dave")
        await page.get_by_label("Path").fill("/vol/eu")
        await page.get_by_label("Protocol").fill("console")
        await page.get_by_role("button", name="Search").click()
        texts = await page.locator("table.audit tbody tr").all_inner_texts()
        assert any("/vol/eu/e.txt" in t and "dave" in t and "console" in t for t in texts), texts
        await web_ui.shot(page, "audit")

        await page.emulate_media(color_scheme="dark")
        await page.get_by_role("link", name="Browse").click()
        await web_ui.shot(page, "browse-dark")
        await page.get_by_role("button", name="Log out").click()
        await page.goto(f"{web_ui.base}/ui/users")
        assert "/ui/login" in page.url
    shots = {p.stem for p in (tmp_path / "screenshots").iterdir()}
    assert shots >= {"login", "browse", "file", "users", "keys", "exports", "acl", "policies",
                     "sites", "audit"}  # fmt: skip


async def test_a_spokes_console_shows_its_link_and_cache(tmp_path: Path) -> None:
    async with fabric(tmp_path, capacity=64 << 20) as made:
        (made.volume / "shard").write_bytes(b"x" * 300_000)
        await made.hub.rescan("/vol", lambda _: None)
        users = UserRegistry(made.hub.catalog)
        await users.add_user("ops")
        key = await users.add_access_key("ops")
        spoke = made.spoke
        identify = HubAuthenticator(made.client(made.first), site=made.first, anonymous=False)
        console = Console(spoke, identify.identify, site=made.first, spoke=spoke)
        server = RestServer(spoke, spoke=spoke, site=made.first, routes=console.routes())
        async with TestClient(TestServer(server.app())) as http:
            await login(http, key.access_key, key.secret)
            console.sample()  # the charts' samples, taken here rather than every 5 s
            for _ in range(2):  # a miss, then a hit
                got = await http.get("/ui/download/vol/shard")
                assert got.status == 200 and len(await got.read()) == 300_000
            console.sample()
            html = await (await http.get("/ui/spoke")).text()
            ratio = re.search(r"Hit ratio: ([\d.]+)% of (\d+) reads", html)
            assert ratio is not None and ">up<" in html, html
            assert 0 < float(ratio.group(1)) < 100 and int(ratio.group(2)) >= 2  # a miss, a hit
            assert "Prefetching is off" in html and "Writes not yet at the hub</dt><dd>0" in html
            assert (await http.get("/ui/users")).status == 404  # administration is the hub's
            # the spoke's metrics: its own (the reads just made), none of a hub's
            scraped = await (await http.get("/metrics")).text()
            hits = re.search(r'^loomfs_cache_reads_total\{hit="true"\} (\S+)$', scraped, re.M)
            assert hits is not None and float(hits.group(1)) >= 1, scraped
            assert "loomfs_spoke_journal_writes 0.0" in scraped
            assert "loomfs_hub_read_leases" not in scraped and "loomfs_volumes" not in scraped
            async with chromium(str(http.make_url("")), tmp_path) as web_ui:
                page = await web_ui.page()
                await web_ui.login(page, key.access_key, key.secret, "/ui/spoke")
                assert await page.get_by_role("img", name="cache used").count() == 1
                await web_ui.shot(page, "spoke")
                # the charts moved with the reads: bytes fetched over the link, a miss and a hit
                await page.get_by_role("link", name="Charts").click()
                for title, now in (("Link bytes", r"[1-9][\d.]* (B|KiB|MiB)/s"),
                                   ("Cache hit ratio", r"50%"), ("Link up", r"up")):  # fmt: skip
                    caption = page.locator("figure.chart figcaption", has_text=title)
                    assert re.fullmatch(now, await caption.locator(".last").inner_text()), title
                    chart = page.get_by_role("img", name=re.compile(f"^{title}: "))
                    assert await chart.locator("polyline").count() == 1, title
                await web_ui.shot(page, "charts")
                await page.get_by_role("link", name="Link & cache").click()
                made.link.cut()
                for _ in range(1500):
                    if not spoke.online:
                        break
                    await asyncio.sleep(0.02)
                await page.reload()
                assert await page.locator("#link-title + p .state").inner_text() == "down"
                await page.emulate_media(color_scheme="dark")
                await web_ui.shot(page, "spoke-down-dark")
                made.link.restore()
