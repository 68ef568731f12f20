"""The web console (protocol layer): server-rendered pages at ``/ui`` on every hub and
spoke, for people with a browser.

A user logs in with an access key and its secret (the same pair as REST and S3;
``sessions``), then browses the namespace as themselves through the same governed
namespace as every edge, and, at a hub, administers through the admin API's calls
(``rest.admin.AdminApi``): volumes, users and groups, ACL rules, residency policies,
sites, exports, the audit log. Who may do what is decided there, never here: a page only
shows what a call answered, or the refusal. At a spoke a status page shows the link, the
cache, the write-back journal and prefetching; at both, charts of the last ten minutes of
the site's own metrics (``core.metrics.History``, sampled here). Pages are Jinja2
templates with plain HTML forms (a CSRF token in each), one stylesheet of our own (light
and dark by the browser's preference) and charts as SVG drawn here (``charts``): no
script, nothing from elsewhere.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import jinja2
from aiohttp import web

from ... import paths
from ...core.acl import ANONYMOUS
from ...core.audit import AuditSink
from ...core.metrics import MEASURES, History, Role, exposition, size, totals
from ...core.placement import Policy
from ...core.types import Entry, EntryKind, Principal
from ...errors import AuthenticationFailed, InvalidArgument, LoomError, NotSupported
from ...namespace.base import Namespace
from ...rest import wire
from ...rest.admin import AdminApi
from ...rest.auth import Identity
from ..http import serve_reader
from .charts import charts
from .history import SPANS, HistoryStore, span_of
from .sessions import COOKIE, LOGIN_COOKIE, Session, Sessions, same

UI = "/ui"
SAMPLE_EVERY = 5.0  # seconds between the charts' samples
PAGE = 100  # directory entries per page
PROTOCOL = "console"  # what the audit log says a console user's calls came by
HERE = Path(__file__).parent
HEADERS = {
    "Cache-Control": "no-store",  # pages may hold a secret shown once
    "Content-Security-Policy": "default-src 'none'; style-src 'self'; img-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}


class SpokeStatus(Protocol):
    """What a spoke says of itself (``spoke.namespace.SpokeNamespace.status``)."""

    def status(self) -> dict[str, Any]: ...


Page = Callable[[web.Request, Principal, Session], Awaitable[web.StreamResponse]]


def _time(ns: int | None) -> str:
    if not ns:
        return "-"
    moment = datetime.datetime.fromtimestamp(ns / 1e9, datetime.UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def _ui_path(path: str) -> str:
    """The URL part of a namespace path, each segment quoted."""
    return urllib.parse.quote(path.lstrip("/"))


def _instant(text: str, what: str) -> int | None:
    """ns since the epoch of a form's ``datetime-local`` value, read as UTC."""
    if not text:
        return None
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise InvalidArgument(f"{what} is a date and time, like 2026-12-01T18:30") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return int(moment.timestamp() * 1e9)


def _words(text: str) -> list[str]:
    """A form's list field: separated by commas, spaces or lines."""
    return [w for w in text.replace(",", " ").split() if w]


class Console:
    def __init__(
        self,
        namespace: Namespace,
        identify: Callable[[str], Awaitable[Identity]],
        *,
        site: str,
        admin: AdminApi | None = None,
        spoke: SpokeStatus | None = None,
        prefetch: Callable[[], Mapping[str, Any]] | None = None,
        sessions: Sessions | None = None,
        audit: AuditSink | None = None,
        history: Path | None = None,
    ) -> None:
        """``identify``: the site's REST authenticator's check of Basic credentials
        (``rest.auth``); ``admin``: a hub's admin API; ``spoke`` and ``prefetch``: a
        spoke's status and its prefetcher's report; ``audit``: where logins and logouts
        are recorded (the site's audit log); ``history``: the file that keeps the charts'
        samples (``history.HistoryStore``; none: in memory)."""
        self.namespace = namespace
        self.identify = identify
        self.site = site
        self.admin = admin
        self.spoke = spoke
        self.prefetch = prefetch
        self.sessions = sessions or Sessions()
        self.audit_log = audit
        self.templates = jinja2.Environment(
            loader=jinja2.FileSystemLoader(HERE / "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
        )
        self.templates.filters.update(size=size, time=_time, ui_path=_ui_path)
        self.role: Role = "spoke" if spoke is not None else "hub"
        # the last sample only, for the next one's rates; the store keeps them all
        self.history = History(MEASURES[self.role], keep=1)
        self.store = HistoryStore(history, every=SAMPLE_EVERY)

    def routes(self) -> list[web.RouteDef]:
        routes = [
            web.get(UI, self.home),
            web.get(f"{UI}/", self.home),
            web.get(f"{UI}/console.css", self.static("console.css", "text/css")),
            web.get(f"{UI}/favicon.svg", self.static("favicon.svg", "image/svg+xml")),
            web.get(f"{UI}/login", self.login_form),
            web.post(f"{UI}/login", self.login),
            web.post(f"{UI}/logout", self._page(self.logout)),
            web.get(f"{UI}/browse/{{path:.*}}", self._page(self.browse)),
            web.get(f"{UI}/download/{{path:.*}}", self._page(self.download)),
        ]
        if self.admin is not None:
            routes += [
                web.get(f"{UI}/volumes", self._page(self.volumes)),
                web.post(f"{UI}/volumes", self._page(self.volumes)),
                web.get(f"{UI}/users", self._page(self.users)),
                web.post(f"{UI}/users", self._page(self.users)),
                web.get(f"{UI}/keys", self._page(self.ssh_keys)),
                web.post(f"{UI}/keys", self._page(self.ssh_keys)),
                web.get(f"{UI}/exports", self._page(self.exports)),
                web.post(f"{UI}/exports", self._page(self.exports)),
                web.get(f"{UI}/acl", self._page(self.acl)),
                web.post(f"{UI}/acl", self._page(self.acl)),
                web.get(f"{UI}/policies", self._page(self.policies)),
                web.post(f"{UI}/policies", self._page(self.policies)),
                web.get(f"{UI}/sites", self._page(self.sites)),
                web.post(f"{UI}/sites", self._page(self.sites)),
                web.get(f"{UI}/audit", self._page(self.audit)),
            ]
        if self.spoke is not None:
            routes.append(web.get(f"{UI}/spoke", self._page(self.spoke_page)))
        routes.append(web.get(f"{UI}/charts", self._page(self.charts)))
        return routes

    # -- the charts' history ---------------------------------------------------------------

    def sample(self) -> None:
        """One sample of this site's metrics into the charts' history."""
        self.history.sample(totals(exposition(self.role).decode()), time.monotonic())
        self.store.add(time.time(), {m.title: p[-1][1] for m, p in self.history.series.items()})

    async def sampling(self, app: web.Application) -> AsyncIterator[None]:
        """The history's sampler, every ``SAMPLE_EVERY`` seconds for as long as ``app``
        runs (an ``aiohttp`` cleanup context); off the loop, since it reads every metric."""

        async def run() -> None:
            while True:
                await asyncio.to_thread(self.sample)
                await asyncio.sleep(SAMPLE_EVERY)

        task = asyncio.create_task(run())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        self.store.close()

    async def charts(self, request: web.Request, who: Principal, session: Session) -> web.Response:
        """The history's charts over ``?span=`` (``history.SPANS``): this site's own
        figures, open to every user logged in, as ``/metrics`` is open to every caller."""
        name = request.query.get("span")
        span = span_of(name)
        measures = MEASURES[self.role]
        found = await asyncio.to_thread(
            self.store.series, [m.title for m in measures], span, time.time()
        )
        drawn = charts(((m, found[m.title]) for m in measures), span)
        return self.render("charts.html", session, who, charts=drawn, every=SAMPLE_EVERY,
                           spans=list(SPANS), span=name or "10m", notice="")  # fmt: skip

    # -- rendering and sessions ------------------------------------------------------------

    def render(
        self,
        name: str,
        session: Session | None,
        who: Principal | None,
        code: int = 200,
        **context: Any,
    ) -> web.Response:
        html = self.templates.get_template(name).render(
            site=self.site,
            who=who,
            csrf=session.csrf if session is not None else "",
            hub=self.admin is not None,
            spoke=self.spoke is not None,
            **context,
        )
        return web.Response(
            text=html, status=code, content_type="text/html", charset="utf-8", headers=HEADERS
        )

    def _page(self, page: Page) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        """A page behind the login: its session (else the login form), its user as the
        site's authenticator says now, the CSRF token of a form it was sent, and what the
        calls it makes refuse shown as an error page with the REST API's status."""

        async def handler(request: web.Request) -> web.StreamResponse:
            session = self.sessions.get(request.cookies.get(COOKIE))
            if session is None:
                back = urllib.parse.quote(request.path_qs if request.method == "GET" else UI)
                raise web.HTTPSeeOther(f"{UI}/login?next={back}")
            try:
                identity = await self.identify(session.credentials)
            except AuthenticationFailed:  # the key was removed since the login
                self.sessions.close(session)
                raise web.HTTPSeeOther(f"{UI}/login") from None
            except LoomError as exc:  # a spoke that can't ask its hub who this is
                return self.render("error.html", session, None, wire.status_of(exc), error=str(exc))
            who = Principal(identity.user, identity.groups, site=self.site, protocol=PROTOCOL)
            if request.method == "POST":
                form = await request.post()
                token = form.get("csrf")
                if not same(token if isinstance(token, str) else None, session.csrf):
                    return self.render(
                        "error.html", session, who, 403,
                        error="this form has no valid CSRF token: reload the page and try again",
                    )  # fmt: skip
            try:
                return await page(request, who, session)
            except LoomError as exc:
                return self.render("error.html", session, who, wire.status_of(exc), error=str(exc))

        return handler

    async def _form(self, request: web.Request) -> dict[str, str]:
        form = await request.post()
        return {k: v.strip() for k, v in form.items() if isinstance(v, str)}

    def static(self, name: str, kind: str) -> Callable[[web.Request], Awaitable[web.Response]]:
        """A file of ``static/``, open to all (the login page needs them)."""
        body = (HERE / "static" / name).read_bytes()

        async def serve(request: web.Request) -> web.Response:
            return web.Response(
                body=body, content_type=kind, headers={"Cache-Control": "max-age=300"}
            )

        return serve

    async def home(self, request: web.Request) -> web.Response:
        raise web.HTTPSeeOther(f"{UI}/browse/")

    # -- logging in and out ----------------------------------------------------------------

    def _login_page(self, nxt: str, status: int = 200, error: str = "") -> web.Response:
        cookie, token = self.sessions.login_token()
        page = self.render("login.html", None, None, status, next=nxt, token=token, error=error)
        page.set_cookie(
            LOGIN_COOKIE, cookie, path=f"{UI}/login", httponly=True, samesite="Strict",
            max_age=3600,
        )  # fmt: skip
        return page

    async def login_form(self, request: web.Request) -> web.Response:
        return self._login_page(request.query.get("next", ""))

    async def login(self, request: web.Request) -> web.Response:
        form = await self._form(request)
        nxt = form.get("next", "")
        if not self.sessions.login_ok(request.cookies.get(LOGIN_COOKIE), form.get("csrf")):
            return self._login_page(nxt, 403, "the login form expired: try again")
        key, secret = form.get("access_key", ""), form.get("secret", "")
        credentials = "Basic " + base64.b64encode(f"{key}:{secret}".encode()).decode()
        try:
            if not key:
                raise AuthenticationFailed("give an access key id and its secret")
            identity = await self.identify(credentials)
        except AuthenticationFailed as exc:
            self._record(ANONYMOUS, "login", exc.code, f"access key {key[:64]}: {exc}")
            return self._login_page(nxt, 401, str(exc))
        self._record(identity.user, "login", "ok", f"access key {key}")
        cookie, _ = self.sessions.open(credentials)
        # only a page of the console: a link elsewhere must not send a user off-site
        target = nxt if nxt.startswith(f"{UI}/") else f"{UI}/"
        answer = web.HTTPSeeOther(target)
        answer.set_cookie(
            COOKIE, cookie, path=UI, httponly=True, samesite="Strict",
            secure=request.secure, max_age=int(self.sessions.ttl),
        )  # fmt: skip
        answer.del_cookie(LOGIN_COOKIE, path=f"{UI}/login")
        raise answer

    def _record(self, user: str, op: str, result: str, detail: str) -> None:
        if self.audit_log is not None:
            who = Principal(user, site=self.site, protocol=PROTOCOL)
            self.audit_log.record(who, op, "/", result, detail=detail)

    async def logout(self, request: web.Request, who: Principal, session: Session) -> web.Response:
        self.sessions.close(session)
        self._record(who.user, "logout", "ok", "")
        answer = web.HTTPSeeOther(f"{UI}/login")
        answer.del_cookie(COOKIE, path=UI)
        raise answer

    # -- the namespace ---------------------------------------------------------------------

    async def browse(
        self, request: web.Request, who: Principal, session: Session
    ) -> web.StreamResponse:
        path = paths.normalize("/" + request.match_info["path"])
        entry = await self.namespace.stat(who, path)
        crumbs = [("/", "/"), *((p, p.rsplit("/", 1)[-1]) for p in paths.ancestors(path)[1:])]
        if path != "/":
            crumbs.append((path, entry.name))
        if entry.kind is not EntryKind.DIR:
            tags = await self.namespace.get_tags(who, path)
            return self.render("file.html", session, who, entry=entry, tags=tags, crumbs=crumbs)
        after = request.query.get("after") or None
        listed: list[Entry] = []
        async for child in self.namespace.list(who, path, start_after=after, limit=PAGE + 1):
            listed.append(child)
        more = len(listed) > PAGE
        return self.render(
            "browse.html", session, who, path=path, entries=listed[:PAGE], crumbs=crumbs,
            after=after, next_after=listed[PAGE - 1].name if more else None,
        )  # fmt: skip

    async def download(
        self, request: web.Request, who: Principal, session: Session
    ) -> web.StreamResponse:
        path = paths.normalize("/" + request.match_info["path"])
        async with await self.namespace.read(who, path, 0, None) as reader:
            name = urllib.parse.quote(reader.entry.name)
            headers = {
                "Content-Type": "application/octet-stream",
                "Content-Disposition": f"attachment; filename*=UTF-8''{name}",
                "ETag": f'"{reader.entry.version}"',
                "Cache-Control": "no-store",
            }
            return await serve_reader(request, reader, headers, ranged=False)

    # -- administration (a hub) ------------------------------------------------------------

    @property
    def _admin(self) -> AdminApi:
        assert self.admin is not None  # the routes exist only with it
        return self.admin

    async def volumes(self, request: web.Request, who: Principal, session: Session) -> web.Response:
        api, notice = self._admin, ""
        if request.method == "POST":
            form = await self._form(request)
            mount = form.get("mount", "")
            if not mount:
                raise InvalidArgument("a volume needs a mount path")
            if form.get("action") == "remove":
                await api.remove_volume(who, mount)
                notice = f"removed volume {mount} (its storage is left as it is)"
            else:
                if not form.get("url"):
                    raise InvalidArgument("a volume needs its storage's URL")
                stats = await api.add_volume(who, mount, form["url"])
                notice = f"added volume {mount}: {stats['scanned']} entries imported"
        listed = await api.list_volumes(who)
        return self.render("volumes.html", session, who, volumes=listed, notice=notice)

    async def users(self, request: web.Request, who: Principal, session: Session) -> web.Response:
        api, made, notice = self._admin, None, ""
        if request.method == "POST":
            form = await self._form(request)
            action, name = form.get("action"), form.get("user", "")
            if action == "add_user":
                if not name:
                    raise InvalidArgument("a new user needs a name")
                made = await api.add_user(who, name, _words(form.get("groups", "")))
            elif action == "add_key":
                made = await api.add_access_key(who, name)
            elif action == "remove_user":
                await api.remove_user(who, name)
                notice = f"removed user {name}"
            elif action == "add_group":
                await api.add_group(who, form.get("group", ""))
                notice = f"made group {form.get('group')}"
            elif action in ("join", "leave"):
                group = form.get("group", "")
                await api.set_member(who, group, name, member=action == "join")
                notice = f"{name} {'joined' if action == 'join' else 'left'} {group}"
            else:
                raise InvalidArgument(f"unknown action {action!r}")
        return self.render(
            "users.html", session, who, users=await api.list_users(who),
            groups=await api.list_groups(who), made=made, notice=notice,
        )  # fmt: skip

    async def ssh_keys(
        self, request: web.Request, who: Principal, session: Session
    ) -> web.Response:
        """Each user's SSH public keys (their SFTP logins): add one, remove one."""
        api, notice = self._admin, ""
        if request.method == "POST":
            form = await self._form(request)
            name, line = form.get("user", ""), form.get("line", "")
            if not name or not line:
                raise InvalidArgument("an SSH key needs its user and its public key line")
            if form.get("action") == "remove":
                await api.remove_ssh_key(who, name, line)
                notice = f"removed an SSH key of {name}"
            else:
                key = await api.add_ssh_key(who, name, line)
                notice = f"added SSH key {key['fingerprint']} for {name}"
        return self.render("keys.html", session, who, users=await api.list_users(who),
                           notice=notice)  # fmt: skip

    async def exports(self, request: web.Request, who: Principal, session: Session) -> web.Response:
        """Each protocol's exports; add an NFS export or an SMB share, remove one added so."""
        api, notice = self._admin, ""
        if request.method == "POST":
            form = await self._form(request)
            if form.get("protocol") == "smb":
                notice = await self._smb_share(who, form)
            else:
                notice = await self._nfs_export(who, form)
        listed = await api.list_exports(who)
        return self.render("exports.html", session, who, exports=listed, notice=notice)

    async def _nfs_export(self, who: Principal, form: Mapping[str, str]) -> str:
        api, path = self._admin, form.get("path", "")
        if not path:
            raise InvalidArgument("an NFS export needs its directory")
        if form.get("action") == "remove":
            await api.remove_nfs_export(who, path)
            return f"removed NFS export {path}: its clients' handles are stale"
        # a field left out is the export's default, as in the config file
        fields: dict[str, Any] = {k: form[k] for k in ("access", "squash") if form.get(k)}
        if form.get("clients"):
            fields["clients"] = _words(form["clients"])
        fields["anonymous"] = form.get("anonymous") == "on"
        made = await api.add_nfs_export(who, path, fields)
        return f"exported {made['path']} over NFS: served from the next mount"

    async def _smb_share(self, who: Principal, form: Mapping[str, str]) -> str:
        api, name = self._admin, form.get("share", "")
        if not name:
            raise InvalidArgument("an SMB share needs its name")
        if form.get("action") == "remove":
            await api.remove_smb_share(who, name)
            return f"removed SMB share {name}: it takes no new connection"
        fields = {k: form[k] for k in ("path", "access") if form.get(k)}
        made = await api.add_smb_share(who, name, fields)
        return f"shared {made['path']} over SMB as {made['share']}: served within seconds"

    async def acl(self, request: web.Request, who: Principal, session: Session) -> web.Response:
        api, notice = self._admin, ""
        if request.method == "POST":
            form = await self._form(request)
            rule = (form.get("subject", ""), form.get("permission", ""), form.get("path", ""))
            if not all(rule):
                raise InvalidArgument("a rule needs a subject, a permission and a path")
            if form.get("action") == "revoke":
                await api.revoke(who, *rule)
                notice = f"revoked {rule[1]} on {rule[2]} from {rule[0]}"
            else:
                await api.grant(who, *rule)
                notice = f"granted {rule[1]} on {rule[2]} to {rule[0]}"
        listed = await api.list_rules(who)
        return self.render(
            "acl.html", session, who, rules=listed["rules"], private=listed["private"],
            notice=notice,
        )  # fmt: skip

    async def policies(
        self, request: web.Request, who: Principal, session: Session
    ) -> web.Response:
        api, notice = self._admin, ""
        if request.method == "POST":
            form = await self._form(request)
            name = form.get("policy", "")
            if form.get("action") == "remove":
                await api.remove_policy(who, name)
                notice = f"removed policy {name}"
            else:
                policy = Policy.build(
                    name, _words(form.get("paths", "")), _words(form.get("allow", "")),
                    form.get("tag") or None, form.get("metadata") or "visible",
                )  # fmt: skip
                seq = await api.put_policy(who, policy)
                notice = f"stored policy {name} (change {seq})"
        listed = await api.list_policies(who)
        return self.render("policies.html", session, who, policies=listed, notice=notice)

    async def sites(self, request: web.Request, who: Principal, session: Session) -> web.Response:
        api, notice = self._admin, ""
        if request.method == "POST":
            name = (await self._form(request)).get("site", "")
            await api.revoke_site(who, name)
            notice = f"revoked site {name}: its next request is refused"
        listed = await api.list_sites(who)
        return self.render("sites.html", session, who, sites=listed, notice=notice)

    async def audit(self, request: web.Request, who: Principal, session: Session) -> web.Response:
        query = {k: request.query.get(k, "").strip() for k in AUDIT_FILTERS}
        records = await self._admin.audit_query(
            who,
            user=query["user"] or None,
            path=paths.normalize(query["path"]) if query["path"] else None,
            protocol=query["protocol"] or None,
            since=_instant(query["since"], "since"),
            until=_instant(query["until"], "until"),
        )
        return self.render("audit.html", session, who, records=list(reversed(records)), query=query)

    # -- a spoke ---------------------------------------------------------------------------

    async def spoke_page(
        self, request: web.Request, who: Principal, session: Session
    ) -> web.Response:
        if self.spoke is None:
            raise NotSupported("this site is not a spoke")
        report = dict(self.prefetch()) if self.prefetch is not None else None
        return self.render("spoke.html", session, who, status=self.spoke.status(), prefetch=report)


AUDIT_FILTERS = ("user", "path", "protocol", "since", "until")
