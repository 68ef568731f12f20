"""The REST API (protocol layer): HTTP in, namespace calls out.

It parses requests, calls the namespace, and encodes results; errors are mapped once,
through ``wire.STATUS``. File bodies that sit in a local file go out with sendfile. The
last byte of every body is held back until the read is verified, so a file changed in
place while it was sent ends in a broken connection, never in a complete-looking mix.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from email.utils import formatdate
from typing import Any, Protocol

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, Counter, Histogram

from ..core import metrics
from ..core.acl import ANONYMOUS
from ..core.types import Change, Feed, Principal, WriteTags
from ..errors import InvalidArgument, LoomError, PermissionDenied
from ..namespace import listing
from ..namespace.base import Namespace, Reader
from ..namespace.governed import GovernedNamespace
from ..protocols.http import parse_range, serve_reader
from . import wire
from .auth import CHALLENGE
from .openapi import spec

log = logging.getLogger(__name__)

REQUESTS = Counter("loomfs_http_requests_total", "REST requests", ["route", "method", "status"])
LATENCY = Histogram("loomfs_http_request_seconds", "REST request latency", ["route", "method"])
BYTES_OUT = Counter("loomfs_read_bytes_total", "File bytes sent by the REST API")
BYTES_IN = Counter("loomfs_write_bytes_total", "File bytes received by the REST API")

NDJSON = "application/x-ndjson"
MAX_WAIT = 30.0  # longest a change-feed long poll is held
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
WHO = web.RequestKey("who", Principal)  # the authenticated caller of a request


class Reportable(Protocol):
    """A long job's progress or result (an import's scan counts), streamed as JSON."""

    def as_dict(self) -> dict[str, Any]: ...


class VolumeAdmin(Protocol):
    """What the hub offers beyond the namespace: volumes and the change log."""

    async def add_volume(
        self, mount: str, url: str, progress: Callable[[Reportable], None]
    ) -> Reportable: ...

    async def rescan(self, mount: str, progress: Callable[[Reportable], None]) -> Reportable: ...

    async def remove_volume(self, mount: str) -> None: ...

    async def list_volumes(self) -> list[dict[str, Any]]: ...

    async def feed(
        self,
        site: str | None,
        since: int,
        limit: int,
        *,
        ack: int = 0,
        wait: float = 0.0,
        gone: Callable[[], bool] = ...,
    ) -> Feed: ...

    async def settle(self, seq: int) -> None: ...


class SpokeAdmin(Protocol):
    """What a spoke offers beyond the namespace: warm-up and waiting for uploads."""

    async def warm(
        self,
        who: Principal,
        top: str,
        *,
        pin: bool = False,
        progress: Callable[[Any], None] | None = None,
    ) -> Any: ...

    async def sync(self) -> None: ...


def _path(request: web.Request) -> str:
    return "/" + request.match_info.get("path", "")


def _flag(request: web.Request, name: str) -> bool:
    return request.query.get(name, "").lower() in ("1", "true", "yes")


def _int(value: str | None, name: str) -> int | None:
    if value is None or value == "":
        return None
    try:
        return int(value.strip().strip('"'))
    except ValueError:
        raise InvalidArgument(f"{name} must be an integer, not {value!r}") from None


def write_id_of(request: web.Request) -> str | None:
    """A write's idempotency key, if it has one (at most 128 printable characters)."""
    key = request.headers.get(wire.WRITE_ID_HEADER)
    if key is not None and not (0 < len(key) <= 128 and key.isprintable()):
        raise InvalidArgument(f"{wire.WRITE_ID_HEADER} must be 1-128 printable characters")
    return key


def tags_of(request: web.Request) -> WriteTags | None:
    """The tags a write sets with its content, if it sets any."""
    value = request.headers.get(wire.TAGS_HEADER)
    return None if value is None else wire.tags_from_header(value)


def _json(data: Any, status: int = 200) -> web.Response:
    return web.json_response(data, status=status)


async def _ndjson(request: web.Request, lines: AsyncIterator[dict[str, Any]]) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": NDJSON})
    # a listing is ~250 bytes of JSON per entry, mostly repeats: gzip (if the client
    # takes it) makes a tree's listings cost a tenth (bench/transfer.py, corpus 7)
    response.enable_compression()
    await response.prepare(request)
    batch: list[bytes] = []
    async for line in lines:
        batch.append(json.dumps(line).encode() + b"\n")
        if len(batch) >= 256:
            await response.write(b"".join(batch))
            batch.clear()
    if batch:
        await response.write(b"".join(batch))
    await response.write_eof()
    return response


async def _aiter(items: Sequence[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
    for item in items:
        yield item


async def _body(request: web.Request) -> dict[str, Any]:
    try:
        data = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidArgument(f"request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidArgument("request body must be a JSON object")
    return data


def _file_headers(reader: Reader) -> dict[str, str]:
    entry = reader.entry
    return {
        "ETag": f'"{entry.version}"',
        "X-Loomfs-Version": str(entry.version),
        wire.ENTRY_HEADER: wire.entry_header(entry),
        "Last-Modified": formatdate(entry.mtime_ns / 1e9, usegmt=True),
        "Accept-Ranges": "bytes",
        "Content-Type": "application/octet-stream",
    }


class RestServer:
    def __init__(
        self,
        namespace: Namespace,
        admin: VolumeAdmin | None = None,
        *,
        spoke: SpokeAdmin | None = None,
        site: str = "hub",
        authenticate: Callable[[web.Request], Awaitable[Principal]] | None = None,
        governance: GovernedNamespace | None = None,
        routes: Sequence[web.RouteDef] = (),
        health: Callable[[], Awaitable[Mapping[str, Mapping[str, Any]]]] | None = None,
        running: Sequence[Callable[[web.Application], AsyncIterator[None]]] = (),
    ) -> None:
        """``authenticate`` says who a request comes from (``rest.auth``); without it
        every caller is anonymous. ``governance`` decides the administration routes
        (an explicit admin right on the volume's mount, on "/" to list volumes or
        settle; without it they refuse everyone) and what of the change feed a caller
        sees. ``health`` checks the parts of the site for ``/readyz`` (each with ``ok``,
        and ``error`` where not). ``running``: what runs as long as the app does
        (``aiohttp`` cleanup contexts: the console's sampler)."""
        self.namespace = namespace
        self.admin = admin
        self.spoke = spoke
        self.site = site
        self._authenticate = authenticate
        self.governance = governance
        self.routes = routes  # more routes behind the same middleware (a spoke's prefetcher)
        self._health = health
        self.running = running
        self.background: set[asyncio.Task[Any]] = set()
        self.stopping = False

    async def authenticate(self, request: web.Request) -> Principal:
        if self._authenticate is None:
            return Principal(user=ANONYMOUS, site=self.site, protocol="rest")
        return await self._authenticate(request)

    def principal(self, request: web.Request) -> Principal:
        """The caller, authenticated by the middleware; what it may do is the namespace's
        decision (``namespace.governed``), not this module's."""
        return request[WHO]

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._middleware], client_max_size=1 << 20)
        p = "/" + wire.PATH
        app.router.add_get(f"{wire.API}/stat{p}", self.stat)
        app.router.add_get(f"{wire.API}/list{p}", self.list)
        app.router.add_get(f"{wire.API}/files{p}", self.get_file, allow_head=True)
        app.router.add_put(f"{wire.API}/files{p}", self.put_file)
        app.router.add_delete(f"{wire.API}/files{p}", self.delete)
        app.router.add_post(f"{wire.API}/mkdir{p}", self.mkdir)
        app.router.add_post(f"{wire.API}/rename", self.rename)
        app.router.add_post(f"{wire.API}/symlink{p}", self.symlink)
        app.router.add_post(f"{wire.API}/mknod{p}", self.mknod)
        app.router.add_post(f"{wire.API}/link{p}", self.link)
        app.router.add_post(f"{wire.API}/lease{p}", self.lease)
        app.router.add_patch(f"{wire.API}/attrs{p}", self.set_attrs)
        app.router.add_get(f"{wire.API}/tags{p}", self.get_tags)
        app.router.add_get(f"{wire.API}/whoami", self.whoami)
        app.router.add_patch(f"{wire.API}/tags{p}", self.set_tags)
        if self.admin is not None:
            app.router.add_get(f"{wire.API}/changes", self.changes)
            app.router.add_get(f"{wire.API}/listing{p}", self.listing)
            app.router.add_post(f"{wire.API}/tree{p}", self.tree)
            app.router.add_get(f"{wire.API}/volumes", self.volumes)
            app.router.add_post(f"{wire.API}/volumes", self.add_volume)
            app.router.add_post(f"{wire.API}/volumes/rescan", self.rescan)
            app.router.add_delete(f"{wire.API}/volumes", self.remove_volume)
            app.router.add_post(f"{wire.API}/settle", self.settle)
        if self.spoke is not None:
            app.router.add_post(f"{wire.API}/warm", self.warm)
            app.router.add_post(f"{wire.API}/sync", self.sync)
        app.router.add_routes(self.routes)
        app.router.add_get("/openapi.json", self.openapi)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        app.on_shutdown.append(self._cancel_background)
        app.cleanup_ctx.extend(self.running)
        return app

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        route = (
            request.match_info.route.resource.canonical
            if request.match_info.route.resource
            else "-"
        )
        start = time.perf_counter()
        status = 500
        try:
            if request.path.startswith(wire.API + "/"):  # health and metrics stay open
                request[WHO] = await self.authenticate(request)
            response = await handler(request)
            status = response.status
            return response
        except LoomError as exc:
            status = wire.status_of(exc)
            if status >= 500:
                log.error("request failed", extra={"path": request.path, "error": repr(exc)})
            failed = _json(wire.error_body(exc), status)
            if status == 401:
                failed.headers["WWW-Authenticate"] = CHALLENGE
            return failed
        except web.HTTPException as exc:
            status = exc.status
            raise
        except (ConnectionResetError, asyncio.CancelledError):
            status = 499
            raise
        except Exception:
            log.exception("unexpected error", extra={"path": request.path})
            return _json(wire.error_body(LoomError("internal error, see the server log")), 500)
        finally:
            REQUESTS.labels(route, request.method, str(status)).inc()
            LATENCY.labels(route, request.method).observe(time.perf_counter() - start)

    # -- namespace -------------------------------------------------------------------------

    async def stat(self, request: web.Request) -> web.Response:
        who, path = self.principal(request), _path(request)
        if _flag(request, "read"):  # a cache about to serve bytes it holds to this caller
            entry = await self.namespace.stat_for_read(who, path)
        else:
            entry = await self.namespace.stat(who, path)
        return _json(wire.entry_json(entry))

    async def list(self, request: web.Request) -> web.StreamResponse:
        who, path = self.principal(request), _path(request)
        limit = _int(request.query.get("limit"), "limit")
        entries = self.namespace.list(
            who, path, start_after=request.query.get("start_after"), limit=limit
        )
        # the first entry is awaited before the status goes out, so a missing directory
        # is a clean 404 rather than a broken stream
        first = await anext(entries, None)

        async def lines() -> AsyncIterator[dict[str, Any]]:
            if first is not None:
                yield wire.entry_json(first)
            async for entry in entries:
                yield wire.entry_json(entry)

        return await _ndjson(request, lines())

    async def get_file(self, request: web.Request) -> web.StreamResponse:
        who, path = self.principal(request), _path(request)
        if (vid := request.query.get("version")) is not None:  # a kept old version, whole
            async with await self.namespace.read_version(who, path, vid) as reader:
                return await serve_reader(
                    request, reader, _file_headers(reader), ranged=False, sent=BYTES_OUT.inc
                )
        if_version = _int(request.headers.get("If-Match"), "If-Match")
        range_header = request.headers.get("Range")
        offset, length, status = 0, None, 200
        if range_header:  # the range is of what the read reads (a symlink's target)
            entry = await self.namespace.stat_for_read(who, path)
            window = parse_range(range_header, entry.size)
            if window is not None:
                (offset, length), status = window, 206
                # the range was resolved against it (0: a write journaled at a spoke,
                # which pins nothing: the hub's version of it has the same bytes)
                if_version = if_version or entry.version or None
        async with await self.namespace.read(
            who, path, offset, length, if_version=if_version
        ) as reader:
            return await serve_reader(
                request, reader, _file_headers(reader), ranged=status == 206, sent=BYTES_OUT.inc
            )

    async def put_file(self, request: web.Request) -> web.Response:
        who, path = self.principal(request), _path(request)
        if_version = _int(request.headers.get("If-Match"), "If-Match")
        exclusive = request.headers.get("If-None-Match", "").strip() == "*"
        mode = _int(request.headers.get("X-Loomfs-Mode"), "X-Loomfs-Mode")

        async def body() -> AsyncIterator[bytes]:
            async for chunk in request.content.iter_chunked(1 << 20):
                BYTES_IN.inc(len(chunk))
                yield chunk

        entry = await self.namespace.write(
            who, path, body(), if_version=if_version, exclusive=exclusive, mode=mode,
            write_id=write_id_of(request), tags=tags_of(request),
        )  # fmt: skip
        return _json(wire.entry_json(entry), 201)

    async def delete(self, request: web.Request) -> web.Response:
        await self.namespace.remove(
            self.principal(request),
            _path(request),
            recursive=_flag(request, "recursive"),
            if_version=_int(request.headers.get("If-Match"), "If-Match"),
        )
        return web.Response(status=204)

    async def mkdir(self, request: web.Request) -> web.Response:
        entry = await self.namespace.mkdir(
            self.principal(request),
            _path(request),
            parents=_flag(request, "parents"),
            exist_ok=_flag(request, "exist_ok"),
        )
        return _json(wire.entry_json(entry), 201)

    async def rename(self, request: web.Request) -> web.Response:
        body = await _body(request)
        src, dst = body.get("src"), body.get("dst")
        if not isinstance(src, str) or not isinstance(dst, str):
            raise InvalidArgument("rename needs 'src' and 'dst' paths")
        entry = await self.namespace.rename(
            self.principal(request), src, dst, overwrite=bool(body.get("overwrite"))
        )
        return _json(wire.entry_json(entry))

    async def symlink(self, request: web.Request) -> web.Response:
        target = (await _body(request)).get("target")
        if not isinstance(target, str):
            raise InvalidArgument("symlink needs a 'target' string")
        entry = await self.namespace.symlink(self.principal(request), _path(request), target)
        return _json(wire.entry_json(entry), 201)

    async def mknod(self, request: web.Request) -> web.Response:
        body = await _body(request)
        mode, rdev = body.get("mode"), body.get("rdev", 0)
        if type(mode) is not int or type(rdev) is not int or mode < 0 or rdev < 0:
            raise InvalidArgument("mknod needs a non-negative integer 'mode' (and 'rdev')")
        entry = await self.namespace.mknod(self.principal(request), _path(request), mode, rdev)
        return _json(wire.entry_json(entry), 201)

    async def link(self, request: web.Request) -> web.Response:
        src = (await _body(request)).get("src")
        if not isinstance(src, str):
            raise InvalidArgument("link needs a 'src' path")
        entry = await self.namespace.link(self.principal(request), src, _path(request))
        return _json(wire.entry_json(entry), 201)

    async def lease(self, request: web.Request) -> web.Response:
        who, path = self.principal(request), _path(request)
        if _flag(request, "release"):
            await self.namespace.release_write(who, path)
            return _json({"term": 0.0})
        return _json({"term": await self.namespace.lease_write(who, path)})

    async def set_attrs(self, request: web.Request) -> web.Response:
        body = await _body(request)
        attrs: dict[str, int | None] = {}
        for name in ("mode", "uid", "gid", "mtime_ns", "atime_ns"):
            value = body.get(name)
            signed = name.endswith("time_ns")  # times before 1970 are times too
            if value is not None and (type(value) is not int or (value < 0 and not signed)):
                raise InvalidArgument(f"'{name}' must be a non-negative integer")
            attrs[name] = value
        entry = await self.namespace.set_attrs(self.principal(request), _path(request), **attrs)
        return _json(wire.entry_json(entry))

    async def get_tags(self, request: web.Request) -> web.Response:
        return _json(await self.namespace.get_tags(self.principal(request), _path(request)))

    async def set_tags(self, request: web.Request) -> web.Response:
        body = await _body(request)
        set_, remove = body.get("set", {}), body.get("remove", [])
        if not isinstance(set_, dict) or not all(isinstance(v, str) for v in set_.values()):
            raise InvalidArgument("'set' must map tag names to string values")
        if not isinstance(remove, list) or not all(isinstance(k, str) for k in remove):
            raise InvalidArgument("'remove' must be a list of tag names")
        tags = await self.namespace.set_tags(self.principal(request), _path(request), set_, remove)
        return _json(tags)

    async def _admit(self, request: web.Request, op: str, path: str) -> None:
        """Administration needs an explicit admin right (``core.acl``), on every server:
        one built without governance lets nobody administer."""
        if self.governance is None:
            raise PermissionDenied(f"this server has no governance: {op} is refused", path=path)
        await self.governance.authorize_admin(self.principal(request), op, path)

    async def whoami(self, request: web.Request) -> web.Response:
        who = self.principal(request)
        return _json(
            {"user": who.user, "groups": sorted(who.groups), "site": who.site,
             "protocol": who.protocol}
        )  # fmt: skip

    # -- hub administration ----------------------------------------------------------------

    async def listing(self, request: web.Request) -> web.StreamResponse:
        """What changed in a listing its caller holds (``namespace.listing``): ``since``
        the feed position the copy was listed at, ``digest`` the copy's. The listing comes
        first (as the caller, audited), the log after it, so every change it shows is read."""
        assert self.admin is not None
        who, path = self.principal(request), _path(request)
        since = _int(request.query.get("since"), "since") or 0
        entries = [entry async for entry in self.namespace.list(who, path)]
        changes = await self._log_since(who, since)
        answer = listing.delta(path, entries, changes, request.query.get("digest"))
        return await _ndjson(request, _aiter(wire.delta_lines(answer)))

    async def tree(self, request: web.Request) -> web.StreamResponse:
        """The listings of a directory and those below it in one answer, each listed as
        the caller (as ``listing`` lists one), and for those the caller holds (``held``:
        directory -> [feed position, digest]) only what changed
        (``namespace.listing.tree_deltas``). The listings come first, the log after."""
        who, path = self.principal(request), _path(request)
        held = wire.held_from((await _body(request)).get("held", {}))
        listed = [
            one
            async for one in listing.listed_tree(
                lambda d: self.namespace.list(who, d), path, listing.TREE_MAX
            )
        ]
        # nothing held: every listing goes whole, no log to read
        changes = await self._log_since(who, min(s for s, _ in held.values())) if held else None
        lines = wire.tree_lines(listing.tree_deltas(listed, changes, held), held)
        return await _ndjson(request, _aiter(lines))

    async def _log_since(self, who: Principal, since: int) -> builtins.list[Change] | None:
        """The change log after ``since`` as ``who`` may see it; None past ``LOG_MAX``."""
        assert self.admin is not None
        changes: builtins.list[Change] = []
        while len(changes) < listing.LOG_MAX:
            page = (await self.admin.feed(None, since, 10_000)).changes
            changes += page
            if len(page) < 10_000:
                if self.governance is not None:
                    return await self.governance.visible_changes(who, changes)
                return changes
            since = page[-1].seq
        return None

    async def changes(self, request: web.Request) -> web.Response:
        assert self.admin is not None
        who = self.principal(request)
        since = _int(request.query.get("since"), "since") or 0
        limit = _int(request.query.get("limit"), "limit") or 1000
        ack = _int(request.query.get("ack"), "ack") or 0
        try:
            wait = min(float(request.query.get("wait") or 0), MAX_WAIT)
        except ValueError:
            raise InvalidArgument("wait must be a number of seconds") from None
        feed = await self.admin.feed(
            who.site if who.protocol == "fabric" else None,
            since,
            min(limit, 10000),
            ack=ack,
            wait=wait,
            gone=lambda: self._gone(request),
        )
        changes = feed.changes
        if self.governance is not None:  # a user sees the changes of what they may see
            changes = await self.governance.visible_changes(who, changes)
        return _json(
            {
                "changes": [wire.change_json(c) for c in changes],
                "head": feed.head,
                "lease": feed.lease,
            }
        )

    def _gone(self, request: web.Request) -> bool:
        """The client hung up, or the server is shutting down: end a long poll early."""
        return self.stopping or request.transport is None or request.transport.is_closing()

    async def volumes(self, request: web.Request) -> web.Response:
        assert self.admin is not None
        await self._admit(request, "list_volumes", "/")
        return _json(await self.admin.list_volumes())

    async def add_volume(self, request: web.Request) -> web.StreamResponse:
        assert self.admin is not None
        admin = self.admin
        body = await _body(request)
        mount, url = body.get("mount"), body.get("url")
        if not isinstance(mount, str) or not isinstance(url, str):
            raise InvalidArgument("adding a volume needs 'mount' and 'url'")
        await self._admit(request, "add_volume", mount)
        return await self._progress(request, lambda cb: admin.add_volume(mount, url, cb))

    async def rescan(self, request: web.Request) -> web.StreamResponse:
        assert self.admin is not None
        admin = self.admin
        mount = (await _body(request)).get("mount")
        if not isinstance(mount, str):
            raise InvalidArgument("a rescan needs 'mount'")
        await self._admit(request, "rescan", mount)
        return await self._progress(request, lambda cb: admin.rescan(mount, cb))

    async def remove_volume(self, request: web.Request) -> web.Response:
        assert self.admin is not None
        mount = request.query.get("mount")
        if not mount:
            raise InvalidArgument("removing a volume needs ?mount=")
        await self._admit(request, "remove_volume", mount)
        await self.admin.remove_volume(mount)
        return web.Response(status=204)

    async def settle(self, request: web.Request) -> web.Response:
        """Wait until leased spokes applied a change (``loomfs policy`` waits here)."""
        assert self.admin is not None
        seq = (await _body(request)).get("seq")
        if type(seq) is not int or seq < 0:
            raise InvalidArgument("settling needs 'seq', a change-log sequence number")
        await self._admit(request, "settle", "/")
        await self.admin.settle(seq)
        return _json({"settled": seq})

    async def warm(self, request: web.Request) -> web.StreamResponse:
        assert self.spoke is not None
        spoke, who = self.spoke, self.principal(request)
        body = await _body(request)
        top = body.get("path")
        if not isinstance(top, str):
            raise InvalidArgument("a warm-up needs 'path'")
        pin = bool(body.get("pin"))
        return await self._progress(request, lambda cb: spoke.warm(who, top, pin=pin, progress=cb))

    async def sync(self, request: web.Request) -> web.Response:
        assert self.spoke is not None
        await self.spoke.sync()
        return web.Response(status=204)

    async def _progress(
        self,
        request: web.Request,
        job: Callable[[Callable[[Any], None]], Coroutine[Any, Any, Reportable]],
    ) -> web.StreamResponse:
        """Run a long job in the background (it survives the client going away) and stream
        its progress as JSON lines; the last line is the result or the error."""
        updates: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        task = asyncio.create_task(job(lambda stats: updates.put_nowait(stats.as_dict())))
        self.background.add(task)
        task.add_done_callback(self.background.discard)
        task.add_done_callback(lambda _: updates.put_nowait({}))
        response: web.StreamResponse | None = None
        while True:
            update = await updates.get()
            if not update:
                break
            if response is None:
                response = web.StreamResponse(headers={"Content-Type": NDJSON})
                await response.prepare(request)
            with contextlib.suppress(ConnectionResetError):
                await response.write(json.dumps(update).encode() + b"\n")
        exc = task.exception()
        if response is None:  # failed before the first progress report: a plain error
            if exc is not None:
                raise exc
            response = web.StreamResponse(headers={"Content-Type": NDJSON})
            await response.prepare(request)
        if isinstance(exc, LoomError):
            await response.write(json.dumps(wire.error_body(exc)).encode() + b"\n")
        elif exc is not None:
            log.error("background job failed", exc_info=exc)
            await response.write(json.dumps(wire.error_body(LoomError(repr(exc)))).encode() + b"\n")
        await response.write_eof()
        return response

    async def _cancel_background(self, app: web.Application) -> None:
        self.stopping = True
        for task in list(self.background):
            task.cancel()
        await asyncio.gather(*self.background, return_exceptions=True)

    # -- service ---------------------------------------------------------------------------

    async def openapi(self, request: web.Request) -> web.Response:
        return _json(spec())

    async def metrics(self, request: web.Request) -> web.Response:
        """This site's role's metrics (``core.metrics``): a spoke's or a hub's."""
        body = metrics.exposition("spoke" if self.spoke is not None else "hub")
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(self, request: web.Request) -> web.Response:
        """Liveness, open to every caller: the process answers (``/readyz`` says whether
        it can serve)."""
        return _json({"status": "ok", "site": self.site})

    async def readyz(self, request: web.Request) -> web.Response:
        """Readiness, open to every caller (a probe has no credentials): 503 with the
        reasons while any part is down."""
        checks = dict(await self._health()) if self._health is not None else {}
        failed = [
            f"{name}: {c.get('error', 'failed')}" for name, c in checks.items() if not c.get("ok")
        ]
        body = {
            "status": "degraded" if failed else "ready",
            "site": self.site,
            "reasons": failed,
            "checks": checks,
        }
        return _json(body, 503 if failed else 200)
