"""A namespace over the REST API (protocol layer, client side): the CLI's way to a hub.

``RestNamespace`` is one more implementation of the namespace API, so the shared
conformance suite runs through HTTP exactly as it runs against the hub in-process.

A hub may be several gateways over one catalog (docs/SCALE.md): given their URLs
(``https://a:7070,https://b:7070``), the client sends to one and moves to the next when
it cannot be reached. A call that never reached the gateway is sent again at once to the
next; one whose connection broke after it was sent is sent again only if it reads
(a change may have been made: its caller decides, a spoke by its write's id).
"""

from __future__ import annotations

import asyncio
import base64
import builtins
import json
import ssl
import tempfile
import time
import zlib
from collections.abc import AsyncIterable, AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit

import aiohttp

from .. import paths
from ..chunks.chunkmap import ChunkMap
from ..chunks.records import read_answers
from ..core.streams import BytesSource, StreamSource, clamp_range
from ..core.types import Entry, Feed, Principal, WriteTags
from ..errors import (
    AuthenticationFailed,
    BackendUnavailable,
    ConfigError,
    Conflict,
    CorruptData,
    LoomError,
    NotSupported,
    RangeNotSatisfiable,
)
from ..namespace.base import FeedNamespace, Reader, WriteTagsArg
from ..namespace.chunklink import ChunkLink, Named, Opened, SmallAsk
from ..namespace.listing import ListingDelta
from . import wire

if TYPE_CHECKING:
    from ..core.placement import Policy


#: the methods sent again after a connection broke mid-call: they change nothing
_RESENDABLE = frozenset({"GET", "HEAD"})


def hub_urls(urls: str | Sequence[str]) -> list[str]:
    """The gateways of one hub, from a comma-separated list or a sequence of URLs."""
    listed = urls.split(",") if isinstance(urls, str) else list(urls)
    found = [url.strip().rstrip("/") for url in listed if url.strip()]
    if not found:
        raise ConfigError("no hub URL given")
    return found


def _quoted(path: str) -> str:
    return quote(paths.normalize(path), safe="/")


class RestNamespace(FeedNamespace, ChunkLink):
    def __init__(
        self,
        base_url: str,
        *,
        timeout: float = 300.0,
        ssl_context: ssl.SSLContext | None = None,
        ca_cert: Path | None = None,
        credentials: tuple[str, str] | None = None,
        forward: bool = False,
    ) -> None:
        """``ca_cert``: the certificate an https site's is checked against (its self-signed
        one, or its CA; default: the system's CAs); ``ssl_context`` instead: the whole TLS
        setup (a spoke's mutual TLS). ``credentials``: the (access key id, secret) to
        authenticate with (HTTP Basic); none: the anonymous caller. ``forward``: send each
        call's user and protocol along, as a spoke does over its mutual-TLS link (the hub
        trusts a site's word on them)."""
        self.base_urls = hub_urls(base_url)
        for url in self.base_urls:
            if urlsplit(url).scheme not in ("http", "https"):
                raise ConfigError(f"a hub URL starts with http:// or https://, unlike {url!r}")
        self._current = 0  # the gateway calls go to until it cannot be reached
        self._session: aiohttp.ClientSession | None = None
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=timeout)
        if ssl_context is None and ca_cert is not None:
            # here, not at the top: a CLI starts without the site identity's crypto
            from ..fabric.identity import trusting  # noqa: PLC0415

            ssl_context = trusting(ca_cert)
        self._ssl = ssl_context
        self._headers = (
            {"Authorization": wire.basic_authorization(*credentials)} if credentials else {}
        )
        self._forward = forward

    @property
    def base_url(self) -> str:
        """The gateway calls go to now."""
        return self.base_urls[self._current]

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(ssl=self._ssl) if self._ssl is not None else None
            self._session = aiohttp.ClientSession(
                timeout=self._timeout,
                auto_decompress=False,
                connector=connector,
                headers=self._headers,
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _request(
        self, method: str, url: str, *, who: Principal | None = None, **kwargs: Any
    ) -> aiohttp.ClientResponse:
        if self._forward and who is not None and who.protocol != "internal":
            # a spoke's own calls (cache fills, its feed) go as the site itself
            kwargs["headers"] = {
                **kwargs.get("headers", {}),
                wire.USER_HEADER: who.user,
                wire.PROTOCOL_HEADER: who.protocol,
            }
        response = await self._send(method, url, **kwargs)
        if response.status >= 400:
            try:
                body = await response.json(content_type=None)
            except (json.JSONDecodeError, aiohttp.ClientError):
                body = None
            finally:
                response.release()
            raise wire.error_from(response.status, body)
        return response

    async def _send(self, method: str, url: str, **kwargs: Any) -> aiohttp.ClientResponse:
        """The response of the first gateway that answers, from the current one on."""
        failures: list[str] = []
        for _ in self.base_urls:
            base = self.base_url
            try:
                return await self.session.request(method, base + url, **kwargs)
            except aiohttp.ClientConnectorCertificateError as exc:
                # not retryable, and not the network's fault: say what to trust
                raise AuthenticationFailed(
                    f"the TLS certificate of {base} is not trusted "
                    f"({exc.certificate_error}): trust the site's certificate (its https.pem, "
                    "whose SHA-256 fingerprint the site logs at start, or its CA) with [client] "
                    "ca_cert, LOOMFS_CA_CERT or the SDK's ca_cert"
                ) from exc
            except aiohttp.ClientConnectionError as exc:
                failures.append(f"{base}: {exc}")
                # the next call goes to the next gateway, whatever this one's fate
                self._current = (self._current + 1) % len(self.base_urls)
                # not connected: nothing was sent (a body's stream is not yet read)
                if not isinstance(exc, aiohttp.ClientConnectorError) and (
                    method not in _RESENDABLE
                ):
                    break
        raise BackendUnavailable(f"cannot reach {'; '.join(failures)}")

    async def _json(
        self, method: str, url: str, *, who: Principal | None = None, **kwargs: Any
    ) -> Any:
        response = await self._request(method, url, who=who, **kwargs)
        async with response:
            return await response.json()

    async def _lines(self, response: aiohttp.ClientResponse) -> AsyncIterator[dict[str, Any]]:
        # the session leaves bodies as sent (file reads are bytes as they are); a listing
        # comes gzipped where the server compresses it
        encoding = response.headers.get("Content-Encoding", "identity")
        inflate = zlib.decompressobj(wbits=47) if encoding in ("gzip", "deflate") else None
        async with response:
            try:
                rest = b""
                async for data in response.content.iter_any():
                    *lines, rest = (rest + (inflate.decompress(data) if inflate else data)).split(
                        b"\n"
                    )
                    for line in lines:
                        if line.strip():
                            yield json.loads(line)
                if inflate is not None:
                    rest += inflate.flush()
                if rest.strip():
                    yield json.loads(rest)
            except zlib.error as exc:
                raise CorruptData(f"a compressed answer of {self.base_url} is damaged") from exc
            except aiohttp.ClientError as exc:  # say the hub was killed mid-job
                raise BackendUnavailable(
                    f"{self.base_url} ended its answer before the last line: did it stop? "
                    "(see its log)"
                ) from exc

    # -- the namespace API -----------------------------------------------------------------

    async def stat(self, who: Principal, path: str) -> Entry:
        return wire.entry_from(await self._json("GET", f"{wire.API}/stat{_quoted(path)}", who=who))

    async def stat_for_read(self, who: Principal, path: str) -> Entry:
        return wire.entry_from(
            await self._json(
                "GET", f"{wire.API}/stat{_quoted(path)}", params={"read": "1"}, who=who
            )
        )

    async def list(
        self, who: Principal, path: str, *, start_after: str | None = None, limit: int | None = None
    ) -> AsyncIterator[Entry]:
        params: dict[str, str] = {}
        if start_after is not None:
            params["start_after"] = start_after
        if limit is not None:
            params["limit"] = str(limit)
        response = await self._request(
            "GET", f"{wire.API}/list{_quoted(path)}", params=params, who=who
        )
        async for line in self._lines(response):
            yield wire.entry_from(line)

    async def list_changed(self, who: Principal, path: str, since: int, held: str) -> ListingDelta:
        response = await self._request(
            "GET",
            f"{wire.API}/listing{_quoted(path)}",
            params={"since": str(since), "digest": held},
            who=who,
        )
        return wire.delta_from([line async for line in self._lines(response)])

    async def list_tree(
        self, who: Principal, top: str, held: Mapping[str, tuple[int, str]]
    ) -> AsyncIterator[tuple[str, ListingDelta | LoomError]]:
        # ~70 bytes of JSON per directory held, mostly their common prefix: deflated
        # (the server inflates a request body by its Content-Encoding)
        response = await self._request(
            "POST",
            f"{wire.API}/tree{_quoted(top)}",
            json={"held": held},
            compress="deflate" if held else None,
            who=who,
        )
        for one in wire.tree_from([line async for line in self._lines(response)], held):
            yield one

    async def read(
        self,
        who: Principal,
        path: str,
        offset: int = 0,
        length: int | None = None,
        *,
        if_version: int | None = None,
    ) -> Reader:
        headers: dict[str, str] = {}
        if offset or length is not None:
            last = "" if length is None else str(offset + length - 1)
            if length == 0:
                # HTTP has no empty range; ask for the entry and hand back nothing
                entry = await self.stat(who, path)
                return Reader(entry, min(offset, entry.size), BytesSource(b""))
            headers["Range"] = f"bytes={offset}-{last}"
        if if_version is not None:
            headers["If-Match"] = f'"{if_version}"'
        try:
            response = await self._request(
                "GET", f"{wire.API}/files{_quoted(path)}", headers=headers, who=who
            )
        except RangeNotSatisfiable:
            entry = await self.stat(who, path)  # reading past the end is empty, as locally
            return Reader(entry, entry.size, BytesSource(b""))
        entry = wire.entry_header_from(response.headers[wire.ENTRY_HEADER])
        content_range = response.headers.get("Content-Range")
        start = int(content_range.split()[1].split("-")[0]) if content_range else 0
        length_ = int(response.headers["Content-Length"])

        async def body() -> AsyncIterator[bytes]:
            try:
                async for chunk in response.content.iter_chunked(1 << 20):
                    yield chunk
            except aiohttp.ClientPayloadError as exc:
                raise Conflict(f"{path} changed while it was read") from exc

        async def close() -> None:
            response.release()

        return Reader(entry, start, StreamSource(body(), length_, close))

    async def read_version(
        self, who: Principal, path: str, vid: str, offset: int = 0, length: int | None = None
    ) -> Reader:
        response = await self._request(
            "GET", f"{wire.API}/files{_quoted(path)}", params={"version": vid}, who=who
        )
        try:
            data = await response.read()
        finally:
            response.release()
        entry = wire.entry_header_from(response.headers[wire.ENTRY_HEADER])
        start, count = clamp_range(len(data), offset, length)
        return Reader(entry, start, BytesSource(data[start : start + count]))

    async def write(
        self,
        who: Principal,
        path: str,
        data: AsyncIterable[bytes],
        *,
        if_version: int | None = None,
        exclusive: bool = False,
        mode: int | None = None,
        write_id: str | None = None,
        tags: WriteTagsArg = None,
    ) -> Entry:
        if not callable(tags):
            return await self._put(who, path, data, if_version, exclusive, mode, write_id, tags)
        # known once the data has ended, and sent ahead of it: the data waits in a spool
        spool = await asyncio.to_thread(tempfile.TemporaryFile)
        try:
            async for chunk in data:
                await asyncio.to_thread(spool.write, chunk)
            made = tags()
            await asyncio.to_thread(spool.seek, 0)

            async def spooled() -> AsyncIterator[bytes]:
                while chunk := await asyncio.to_thread(spool.read, 1 << 20):
                    yield chunk

            return await self._put(
                who, path, spooled(), if_version, exclusive, mode, write_id, made
            )
        finally:
            spool.close()

    async def _put(
        self,
        who: Principal,
        path: str,
        data: AsyncIterable[bytes],
        if_version: int | None,
        exclusive: bool,
        mode: int | None,
        write_id: str | None,
        tags: WriteTags | None,
    ) -> Entry:
        headers = self._write_headers(if_version, exclusive, mode, write_id, tags)
        return wire.entry_from(
            await self._json(
                "PUT", f"{wire.API}/files{_quoted(path)}", data=data, headers=headers, who=who
            )
        )

    @staticmethod
    def _write_headers(
        if_version: int | None,
        exclusive: bool,
        mode: int | None,
        write_id: str | None,
        tags: WriteTags | None = None,
    ) -> dict[str, str]:
        """A write's preconditions, key and tags, the same for a streamed body and a
        chunked commit."""
        headers = {"Content-Type": "application/octet-stream"}
        if write_id is not None:
            headers[wire.WRITE_ID_HEADER] = write_id
        if tags is not None:
            headers[wire.TAGS_HEADER] = wire.tags_header(tags)
        if if_version is not None:
            headers["If-Match"] = f'"{if_version}"'
        if exclusive:
            headers["If-None-Match"] = "*"
        if mode is not None:
            headers["X-Loomfs-Mode"] = str(mode)
        return headers

    async def mkdir(
        self, who: Principal, path: str, *, parents: bool = False, exist_ok: bool = False
    ) -> Entry:
        params = {"parents": str(parents).lower(), "exist_ok": str(exist_ok).lower()}
        return wire.entry_from(
            await self._json("POST", f"{wire.API}/mkdir{_quoted(path)}", params=params, who=who)
        )

    async def rename(self, who: Principal, src: str, dst: str, *, overwrite: bool = False) -> Entry:
        body = {"src": src, "dst": dst, "overwrite": overwrite}
        return wire.entry_from(await self._json("POST", f"{wire.API}/rename", json=body, who=who))

    async def remove(
        self, who: Principal, path: str, *, recursive: bool = False, if_version: int | None = None
    ) -> None:
        headers = {"If-Match": f'"{if_version}"'} if if_version is not None else {}
        response = await self._request(
            "DELETE",
            f"{wire.API}/files{_quoted(path)}",
            params={"recursive": str(recursive).lower()},
            headers=headers,
            who=who,
        )
        response.release()

    async def symlink(self, who: Principal, path: str, target: str) -> Entry:
        return wire.entry_from(
            await self._json(
                "POST", f"{wire.API}/symlink{_quoted(path)}", json={"target": target}, who=who
            )
        )

    async def mknod(self, who: Principal, path: str, mode: int, rdev: int = 0) -> Entry:
        body = {"mode": mode, "rdev": rdev}
        return wire.entry_from(
            await self._json("POST", f"{wire.API}/mknod{_quoted(path)}", json=body, who=who)
        )

    async def link(self, who: Principal, src: str, dst: str) -> Entry:
        return wire.entry_from(
            await self._json("POST", f"{wire.API}/link{_quoted(dst)}", json={"src": src}, who=who)
        )

    async def lease_write(self, who: Principal, path: str) -> float:
        answer = await self._json("POST", f"{wire.API}/lease{_quoted(path)}", who=who)
        return float(answer["term"])

    async def release_write(self, who: Principal, path: str) -> None:
        await self._json(
            "POST", f"{wire.API}/lease{_quoted(path)}", params={"release": "true"}, who=who
        )

    async def set_attrs(
        self,
        who: Principal,
        path: str,
        *,
        mode: int | None = None,
        uid: int | None = None,
        gid: int | None = None,
        mtime_ns: int | None = None,
        atime_ns: int | None = None,
    ) -> Entry:
        body = {"mode": mode, "uid": uid, "gid": gid, "mtime_ns": mtime_ns, "atime_ns": atime_ns}
        return wire.entry_from(
            await self._json("PATCH", f"{wire.API}/attrs{_quoted(path)}", json=body, who=who)
        )

    async def get_tags(self, who: Principal, path: str) -> dict[str, str]:
        tags: dict[str, str] = await self._json("GET", f"{wire.API}/tags{_quoted(path)}", who=who)
        return tags

    async def set_tags(
        self,
        who: Principal,
        path: str,
        set_: Mapping[str, str],
        remove: Sequence[str] = (),
    ) -> dict[str, str]:
        body = {"set": dict(set_), "remove": list(remove)}
        tags: dict[str, str] = await self._json(
            "PATCH", f"{wire.API}/tags{_quoted(path)}", json=body, who=who
        )
        return tags

    # -- hub administration ----------------------------------------------------------------

    async def volumes(self) -> builtins.list[dict[str, Any]]:
        volumes: builtins.list[dict[str, Any]] = await self._json("GET", f"{wire.API}/volumes")
        return volumes

    async def add_volume(
        self, mount: str, url: str, progress: Callable[[dict[str, Any]], None] | None = None
    ) -> dict[str, Any]:
        response = await self._request(
            "POST", f"{wire.API}/volumes", json={"mount": mount, "url": url}
        )
        return await self._follow(response, progress)

    async def rescan(
        self, mount: str, progress: Callable[[dict[str, Any]], None] | None = None
    ) -> dict[str, Any]:
        response = await self._request("POST", f"{wire.API}/volumes/rescan", json={"mount": mount})
        return await self._follow(response, progress)

    async def _follow(
        self,
        response: aiohttp.ClientResponse,
        progress: Callable[[dict[str, Any]], None] | None,
    ) -> dict[str, Any]:
        last: dict[str, Any] = {}
        async for line in self._lines(response):
            if "error" in line:
                raise wire.error_from(500, line)
            last = line
            if progress is not None:
                progress(line)
        if not last.get("done"):
            raise LoomError("the hub ended the job without a result; see its log")
        return last

    async def warm(
        self,
        path: str,
        *,
        pin: bool = False,
        progress: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Ask a spoke to fetch ``path`` ahead of reads (streams progress)."""
        response = await self._request("POST", f"{wire.API}/warm", json={"path": path, "pin": pin})
        return await self._follow(response, progress)

    async def sync(self) -> None:
        """Wait until the spoke has committed every journaled write at its hub."""
        response = await self._request("POST", f"{wire.API}/sync")
        response.release()

    async def settle(self, seq: int) -> None:
        """Wait until every spoke leased by the hub applied change ``seq``."""
        await self._json("POST", f"{wire.API}/settle", json={"seq": seq})

    async def publish_plan(
        self, plan: bytes, files: Sequence[str], sizes: Sequence[int] | None = None
    ) -> dict[str, Any]:
        """Tell a spoke what a data loader reads next (``prefetch.plan.Plan.encode()`` over
        indexes into ``files``)."""
        body: dict[str, Any] = {
            "plan": base64.b64encode(plan).decode(),
            "files": base64.b64encode(zlib.compress("\n".join(files).encode(), 6)).decode(),
        }
        if sizes is not None:
            body["sizes"] = list(sizes)
        result: dict[str, Any] = await self._json("POST", f"{wire.API}/plans", json=body)
        return result

    async def heartbeat(self, job: str, position: int) -> None:
        """Tell a spoke that ``job`` has read ``position`` samples of its stream."""
        body = {"job": job, "position": position}
        (await self._request("POST", f"{wire.API}/plans/heartbeat", json=body)).release()

    async def end_plan(self, job: str) -> None:
        (await self._request("POST", f"{wire.API}/plans/end", json={"job": job})).release()

    @property
    def authorization(self) -> str | None:
        """The ``Authorization`` header this client sends (None: the anonymous caller)."""
        return self._headers.get("Authorization")

    async def local_reads(self) -> dict[str, Any] | None:
        """Where a spoke takes local reads (``rest.local``): its socket and token; None
        where the site serves none (a hub, a spoke with ``[spoke] local_reads`` off)."""
        try:
            found: dict[str, Any] = await self._json("GET", f"{wire.API}/local")
        except NotSupported:  # the route is missing: HTTP 404 without a loomfs error
            return None
        return found

    async def prefetch_report(self) -> dict[str, Any]:
        """The spoke prefetcher's metrics and active jobs."""
        report: dict[str, Any] = await self._json("GET", f"{wire.API}/plans")
        return report

    async def remove_volume(self, mount: str) -> None:
        response = await self._request("DELETE", f"{wire.API}/volumes", params={"mount": mount})
        response.release()

    async def changes(
        self, since: int = 0, limit: int = 1000, *, wait: float = 0.0, ack: int = 0
    ) -> Feed:
        """Changes after ``since``; with ``wait``, the hub holds the request up to that many
        seconds until there is one (a long poll: the change feed without polling). A spoke
        acknowledges with ``ack`` the changes it has applied, which renews its lease."""
        params = {"since": str(since), "limit": str(limit), "wait": str(wait), "ack": str(ack)}
        data = await self._json("GET", f"{wire.API}/changes", params=params)
        return Feed(
            [wire.change_from(c) for c in data["changes"]], int(data["head"]), data.get("lease")
        )

    async def round_trip(self) -> float:
        """Timed over a kept connection to ``/healthz``, which does no work: so mostly
        the network's round trip (a first call also times its TCP and TLS set-up)."""
        began = time.perf_counter()
        response = await self._request("GET", "/healthz")
        async with response:
            await response.read()
        return time.perf_counter() - began

    async def readiness(self) -> dict[str, Any]:
        """The site's ``/readyz`` answer (its name, ``ready`` or ``degraded``, and the
        reasons), also when it is degraded."""
        response = await self._send("GET", "/readyz")
        async with response:
            found: dict[str, Any] = await response.json(content_type=None)
        return found

    async def whoami(self, credentials: tuple[str, str] | None = None) -> dict[str, Any]:
        """Who the server takes this client for; with ``credentials``, for that pair (a
        spoke checks its users' credentials with its hub this way)."""
        kwargs: dict[str, Any] = {}
        if credentials is not None:
            kwargs["headers"] = {"Authorization": wire.basic_authorization(*credentials)}
        found: dict[str, Any] = await self._json("GET", f"{wire.API}/whoami", **kwargs)
        return found

    async def metrics(self) -> str:
        """The site's prometheus exposition (``loomfs status`` reads its counters)."""
        response = await self._request("GET", "/metrics")
        async with response:
            return await response.text()

    # -- chunks (the fabric link) ----------------------------------------------------------

    async def open_chunked(
        self, path: str, *, small: int = 0, who: Principal | None = None, have: bytes = b""
    ) -> Opened:
        params = {"small": str(small), **({"have": have.hex()} if have else {})}
        response = await self._request(
            "GET", f"{wire.API}/chunkmap{_quoted(path)}", params=params, who=who
        )
        async with response:
            entry = wire.entry_header_from(response.headers[wire.ENTRY_HEADER])
            body = await self._body(response)
        whole_id = response.headers.get("X-Loomfs-Whole")
        if whole_id is not None:  # one frame, verified like any chunk
            # the codec needs the chunks extra: only a chunked link (a spoke's) comes here
            from ..chunks.codec import decode_frame  # noqa: PLC0415

            try:
                digest = bytes.fromhex(whole_id)
            except ValueError:
                raise CorruptData("the hub named a malformed chunk id") from None
            if have and digest == have and not body:
                return Opened(entry, held=digest)
            return Opened(entry, whole=await asyncio.to_thread(decode_frame, body, digest))
        return Opened(entry, chunk_map=ChunkMap.deserialize(body))

    async def _body(self, response: aiohttp.ClientResponse) -> bytes:
        try:
            return await response.read()
        except aiohttp.ClientError as exc:
            raise BackendUnavailable(f"the link to {self.base_url} broke: {exc}") from exc

    async def fetch_small(
        self,
        asks: Sequence[SmallAsk],
        *,
        small: int,
        holds: bytes = b"",
        who: Principal | None = None,
    ) -> builtins.list[bytes | Named | None]:
        # the codec needs the chunks extra: only a chunked link (a spoke's) comes here
        from ..chunks import bundle  # noqa: PLC0415

        files = [[a.path, a.version, a.have.hex()] for a in asks]
        response = await self._request(
            "POST",
            f"{wire.API}/chunks/small",
            data=bundle.pack({"small": small, "files": files, "holds": holds.hex()}),
            headers={"Content-Type": "application/octet-stream"},
            who=who,
        )
        async with response:
            head, frame = bundle.split(await self._body(response))
        try:
            answers = [(int(how), int(n), bytes.fromhex(cid)) for how, n, cid in head["files"]]
            bases = [asks[int(i)].held or b"" for i in head["bases"]]
        except (KeyError, TypeError, ValueError, IndexError):
            raise CorruptData("a bundle's head is malformed") from None
        if len(answers) != len(asks):
            raise CorruptData(f"a bundle answers {len(answers)} files of {len(asks)}")
        sent = [(size, cid) for how, size, cid in answers if how == bundle.SENT]
        datas = iter(
            await asyncio.to_thread(
                bundle.decode, frame, [s for s, _ in sent], [c for _, c in sent], bases
            )
        )
        out: builtins.list[bytes | Named | None] = []
        for ask, (how, _, cid) in zip(asks, answers, strict=True):
            if how == bundle.SENT:
                out.append(next(datas))
            elif how == bundle.HELD and cid:  # held elsewhere: the asker finds and checks it
                out.append(Named(cid))
            else:  # held: the bytes named by ``have`` (checked by the asker against it)
                out.append(ask.held if how == bundle.HELD and ask.have else None)
        return out

    async def fetch_chunks(
        self,
        ids: Sequence[bytes],
        *,
        base: tuple[str, int] | None = None,
        at: Sequence[int | None] = (),
    ) -> AsyncIterator[bytes | None]:
        body: dict[str, Any] = {"ids": [i.hex() for i in ids]}
        if base is not None:
            body["base"] = {"path": base[0], "version": base[1]}
            body["at"] = list(at)
        response = await self._request("POST", f"{wire.API}/chunks", json=body)
        async with response:
            try:
                async for frame in read_answers(response.content.readexactly, len(ids)):
                    yield frame
            except (EOFError, aiohttp.ClientPayloadError) as exc:
                raise CorruptData("the chunk batch ended early") from exc
            except aiohttp.ClientConnectionError as exc:
                raise BackendUnavailable(f"the link to {self.base_url} broke: {exc}") from exc

    async def missing_chunks(self, ids: Sequence[bytes]) -> builtins.list[bytes]:
        data = await self._json(
            "POST", f"{wire.API}/chunks/missing", json={"ids": [i.hex() for i in ids]}
        )
        return [bytes.fromhex(i) for i in data["missing"]]

    async def upload_chunks(self, records: AsyncIterable[bytes]) -> int:
        data = await self._json(
            "POST",
            f"{wire.API}/chunks/upload",
            data=records,
            headers={"Content-Type": "application/octet-stream"},
        )
        return int(data["stored"])

    async def commit_chunks(
        self,
        path: str,
        chunk_map: ChunkMap,
        *,
        if_version: int | None = None,
        exclusive: bool = False,
        mode: int | None = None,
        write_id: str | None = None,
        who: Principal | None = None,
        tags: WriteTags | None = None,
    ) -> Entry:
        headers = self._write_headers(if_version, exclusive, mode, write_id, tags)
        return wire.entry_from(
            await self._json(
                "POST",
                f"{wire.API}/chunks/commit{_quoted(path)}",
                data=chunk_map.serialize(),
                headers=headers,
                who=who,
            )
        )


class RestDirectory:
    """The hub's admin API (``rest.admin``) through ``rest``'s session and credentials:
    the calls of ``core.directory.Directory``, with the same results, decided at the hub."""

    def __init__(self, rest: RestNamespace) -> None:
        self.rest = rest

    async def _call(self, method: str, route: str, **kwargs: Any) -> Any:
        return await self.rest._json(method, f"{wire.ADMIN}{route}", **kwargs)

    async def _done(self, method: str, route: str, **kwargs: Any) -> None:
        (await self.rest._request(method, f"{wire.ADMIN}{route}", **kwargs)).release()

    async def add_user(
        self, name: str, groups: Sequence[str] = (), ssh_key: str | None = None
    ) -> dict[str, Any]:
        body = {"user": name, "groups": list(groups), "ssh_key": ssh_key}
        made: dict[str, Any] = await self._call("POST", "/users", json=body)
        return made

    async def list_users(self) -> list[dict[str, Any]]:
        users: list[dict[str, Any]] = await self._call("GET", "/users")
        return users

    async def remove_user(self, name: str) -> None:
        await self._done("DELETE", f"/users/{quote(name, safe='')}")

    async def add_access_key(self, name: str) -> dict[str, Any]:
        route = f"/users/{quote(name, safe='')}/keys"
        key: dict[str, Any] = await self._call("POST", route, json={})
        return key

    async def remove_access_key(self, name: str, access_key: str) -> None:
        await self._done(
            "DELETE", f"/users/{quote(name, safe='')}/keys", params={"access_key": access_key}
        )

    async def add_ssh_key(self, name: str, line: str) -> dict[str, Any]:
        body = {"ssh_key": line}
        key: dict[str, Any] = await self._call(
            "POST", f"/users/{quote(name, safe='')}/keys", json=body
        )
        return key

    async def remove_ssh_key(self, name: str, line: str) -> None:
        await self._done("DELETE", f"/users/{quote(name, safe='')}/keys", params={"ssh_key": line})

    async def set_smb_password(self, name: str, nt_hash: str) -> dict[str, Any]:
        route = f"/users/{quote(name, safe='')}/smb-password"
        login: dict[str, Any] = await self._call("PUT", route, json={"nt_hash": nt_hash})
        return login

    async def add_group(self, name: str) -> None:
        await self._done("POST", "/groups", json={"group": name})

    async def list_groups(self) -> list[dict[str, Any]]:
        groups: list[dict[str, Any]] = await self._call("GET", "/groups")
        return groups

    async def remove_group(self, name: str) -> None:
        await self._done("DELETE", f"/groups/{quote(name, safe='')}")

    # exports: the hub's alone (``rest.admin.AdminApi.list_exports``), with no offline twin

    async def list_exports(self) -> dict[str, Any]:
        exports: dict[str, Any] = await self._call("GET", "/exports")
        return exports

    async def add_nfs_export(self, path: str, fields: dict[str, Any]) -> dict[str, Any]:
        made: dict[str, Any] = await self._call(
            "POST", "/exports/nfs", json={"path": path, **fields}
        )
        return made

    async def remove_nfs_export(self, path: str) -> None:
        await self._done("DELETE", "/exports/nfs", params={"path": path})

    async def add_smb_share(self, name: str, fields: dict[str, Any]) -> dict[str, Any]:
        made: dict[str, Any] = await self._call(
            "POST", "/exports/smb", json={"share": name, **fields}
        )
        return made

    async def remove_smb_share(self, name: str) -> None:
        await self._done("DELETE", "/exports/smb", params={"name": name})

    async def set_member(self, group: str, user: str, *, member: bool) -> None:
        body = {"user": user, "member": member}
        await self._done("POST", f"/groups/{quote(group, safe='')}/members", json=body)

    async def grant(self, subject: str, permission: str, path: str) -> dict[str, Any]:
        body = {"subject": subject, "permission": permission, "path": path}
        rule: dict[str, Any] = await self._call("POST", "/acl/grant", json=body)
        return rule

    async def revoke(self, subject: str, permission: str, path: str) -> None:
        body = {"subject": subject, "permission": permission, "path": path}
        await self._done("POST", "/acl/revoke", json=body)

    async def list_rules(self) -> dict[str, Any]:
        rules: dict[str, Any] = await self._call("GET", "/acl")
        return rules

    async def set_private(self, path: str, private: bool) -> None:
        await self._done("POST", "/acl/private", json={"path": path, "private": private})

    async def add_site(
        self, cert_pem: bytes, labels: dict[str, str], name: str | None = None
    ) -> dict[str, Any]:
        body = {
            "cert": cert_pem.decode(errors="replace"),
            "labels": [f"{k}={v}" for k, v in labels.items()],
            "site": name,
        }
        pinned: dict[str, Any] = await self._call("POST", "/sites", json=body)
        return pinned

    async def list_sites(self) -> list[dict[str, Any]]:
        sites: list[dict[str, Any]] = await self._call("GET", "/sites")
        return sites

    async def revoke_site(self, name: str) -> None:
        await self._done("POST", f"/sites/{quote(name, safe='')}/revoke")

    async def remove_site(self, name: str) -> None:
        await self._done("DELETE", f"/sites/{quote(name, safe='')}")

    async def put_policy(self, policy: Policy) -> int:
        from ..core.directory import policy_json  # noqa: PLC0415 (the catalog's: admin only)

        body = policy_json(policy)
        return int((await self._call("POST", "/policies", json=body))["seq"])

    async def list_policies(self) -> list[dict[str, Any]]:
        policies: list[dict[str, Any]] = await self._call("GET", "/policies")
        return policies

    async def remove_policy(self, name: str) -> None:
        await self._done("DELETE", f"/policies/{quote(name, safe='')}")
