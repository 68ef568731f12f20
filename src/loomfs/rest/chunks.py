"""The fabric link's chunk routes (protocol layer): chunk maps, batched frames, upload dedup.

Registered on the hub's REST and fabric apps when the hub has a chunk service. The wire
forms are ``ChunkMap.serialize()`` for maps and ``chunks.records`` for batches of frames;
ids travel as hex in JSON. Errors go through the REST server's middleware like any other.

Governance: ``HubChunks`` works on the hub's inner namespace, so the routes that name a
path decide here, through the server's governed namespace: a chunk map (or a small file
whole, or each file of a bundle) is served only to a caller allowed to read the path, and
a chunked commit is a write of the path (both authorized and audited like the namespace's
own calls). A bundle's bases are named by id, as bytes the asker holds: only a dictionary
its own copy decodes against. Chunks by id (frames, missing, upload) name no path: they
are served only to a site acting for itself (``site:NAME``, which the ACL already lets do
everything), never to a request that carries a user. A spoke learns chunk ids only from a
map it was served or from its own bytes, and its cache serves a user only what the hub
admitted for that user (``spoke.namespace``); so a user can't reach content by id that a
rule keeps from them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import Any

from aiohttp import web

from ..chunks import bundle
from ..chunks.chunkmap import ID_SIZE, ChunkMap
from ..chunks.codec import chunk_id, encode_chunk, numeric
from ..chunks.metrics import Transfer
from ..chunks.records import read_uploads
from ..core.acl import is_site
from ..core.audit import AuditSink
from ..core.types import SPECIAL_KINDS, Action, Entry, EntryKind, Principal
from ..errors import (
    Conflict,
    CorruptData,
    InvalidArgument,
    IsADirectory,
    NotFound,
    NotSupported,
    PermissionDenied,
)
from ..namespace import sse
from ..namespace.chunklink import ChunkService, Wanted
from ..namespace.governed import GovernedNamespace
from . import wire
from .server import RestServer, _body, _int, tags_of, write_id_of

WHOLE_HEADER = "X-Loomfs-Whole"
MAX_MAP = 256 << 20  # a serialized map of a ~700 GB file
READS_AT_ONCE = 16  # files of one bundle read at once (descriptors, not bytes, bound it)
# What a file of a bundle may fail with: it is then skipped, and the spoke's read of it
# alone meets the error and reports it.
_SKIPPED = (Conflict, NotFound, IsADirectory, NotSupported, PermissionDenied)


def _ids(value: Any) -> list[bytes]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidArgument("'ids' must be a list of hex chunk ids")
    try:
        ids = [bytes.fromhex(v) for v in value]
    except ValueError:
        raise InvalidArgument("a chunk id is not hex") from None
    if any(len(i) != ID_SIZE for i in ids):
        raise InvalidArgument(f"chunk ids are {ID_SIZE} bytes")
    return ids


class ChunkRoutes:
    """Added to a server's app by the server that has chunks to offer (the fabric's)."""

    def __init__(
        self, server: RestServer, chunks: ChunkService, *, audit: AuditSink | None = None
    ) -> None:
        self.server = server
        self.chunks = chunks
        self.audit = audit
        namespace = server.namespace
        #: where the paths' rules are decided (None: an ungoverned hub, tests)
        self.governance = namespace if isinstance(namespace, GovernedNamespace) else None

    def _site(self, request: web.Request, op: str) -> Principal:
        """The caller of a chunk-by-id route: only a site acting for itself."""
        who = self.server.principal(request)
        if not is_site(who):
            if self.audit is not None:
                self.audit.record(who, op, "", "denied", detail="chunks by id are for sites")
            raise PermissionDenied(f"chunks by id are served to sites only, not to {who.user}")
        return who

    def register(self, app: web.Application) -> None:
        api = wire.API
        app.router.add_get(f"{api}/chunkmap/{wire.PATH}", self.chunk_map)
        app.router.add_post(f"{api}/chunks", self.frames)
        app.router.add_post(f"{api}/chunks/small", self.small)
        app.router.add_post(f"{api}/chunks/missing", self.missing)
        app.router.add_post(f"{api}/chunks/upload", self.upload)
        app.router.add_post(f"{api}/chunks/commit/{wire.PATH}", self.commit)

    async def chunk_map(self, request: web.Request) -> web.Response:
        who, path = self.server.principal(request), "/" + request.match_info["path"]
        small = _int(request.query.get("small"), "small") or 0
        try:
            have = bytes.fromhex(request.query.get("have", ""))
        except ValueError:
            raise InvalidArgument("'have' must be a hex chunk id") from None
        namespace = self.server.namespace
        # a symlink is what it leads to, as any read of it: the target's size and version,
        # and its bytes read by the target's own path (so that what guards the target
        # decides)
        entry = await namespace.stat_for_read(who, path)  # decided as a read
        if entry.kind in SPECIAL_KINDS:
            raise NotSupported(f"{path} is a special file: it has no content", path=path)
        # encrypted content is cut as its volume holds it, ciphertext: it goes whole,
        # read (and decrypted, or refused without a customer's key) as any read is
        sealed = self.governance is not None and await self.governance.encrypted(who, entry)
        if entry.kind is not EntryKind.FILE or entry.size <= small or sealed:
            # small files come whole: a map would cost a round trip for one or two chunks
            # as one frame (zstd where it pays) named by its BLAKE3 id, which the spoke checks
            async with await namespace.read(who, entry.path, if_version=entry.version) as reader:
                data = await reader.read_all()
            digest = chunk_id(data)
            # content the spoke holds (a version with only a new mtime, a copy): its id only
            body = b"" if digest == have else await asyncio.to_thread(encode_chunk, data)
            if body:
                await self.chunks.keep_whole(data, body)
            Transfer("hub", "down", path, logical=len(data), wire=len(body)).done()
            headers = {
                wire.ENTRY_HEADER: wire.entry_header(reader.entry),
                WHOLE_HEADER: digest.hex(),
            }
        else:
            if self.governance is None:
                entry, cmap = await self.chunks.chunk_map(who, path)
            else:  # the map hands out the file's content by id: a read of it
                entry, cmap = await self.governance.audited(
                    who, "chunkmap", Action.READ, path, lambda: self.chunks.chunk_map(who, path)
                )
            body = cmap.serialize()
            Transfer("hub", "down", path, wire=len(body)).done()
            headers = {wire.ENTRY_HEADER: wire.entry_header(entry)}
        return web.Response(body=body, headers=headers, content_type="application/octet-stream")

    async def small(self, request: web.Request) -> web.Response:
        """Many small files in one answer (``chunks.bundle``): each read as the caller, as
        the whole-file map route reads one, and skipped where that read fails or the file
        is not at the version asked or above ``small`` bytes."""
        who = self.server.principal(request)
        if (request.content_length or 0) > bundle.MAX_HEAD:
            raise InvalidArgument(f"a bundle's ask is at most {bundle.MAX_HEAD} bytes")
        try:
            ask = bundle.unpack(await request.read())
        except CorruptData as exc:  # the caller's bytes, not this hub's data
            raise InvalidArgument(str(exc)) from None
        if not isinstance(ask, dict):
            raise InvalidArgument("a bundle's ask is an object of files, small and holds")
        files, small = ask.get("files"), ask.get("small")
        if not isinstance(files, list) or len(files) > bundle.MAX_FILES or type(small) is not int:
            raise InvalidArgument(f"a bundle asks for up to {bundle.MAX_FILES} files, small")
        try:
            asks = [(str(p), int(v), bytes.fromhex(h)) for p, v, h in files]
        except (TypeError, ValueError):
            raise InvalidArgument("a bundle's files are [path, version, held id hex]") from None
        try:  # ids of the small files the asker holds anywhere (``bundle.holds``)
            holds = bytes.fromhex(ask.get("holds") or "")
        except (TypeError, ValueError):
            raise InvalidArgument("a bundle's 'holds' is a hex filter") from None
        if len(holds) > bundle.MAX_HOLDS * bundle.HOLD_BITS // 8:
            raise InvalidArgument(f"a bundle's 'holds' names at most {bundle.MAX_HOLDS} ids")
        namespace = self.server.namespace
        limit = asyncio.Semaphore(READS_AT_ONCE)
        room = [bundle.MAX_BYTES]  # what the answer may still hold: files past it are skipped

        async def one(path: str, version: int) -> bytes | None:
            async with limit:
                try:
                    async with await namespace.read(who, path, if_version=version) as reader:
                        size = reader.entry.size
                        if reader.entry.kind is not EntryKind.FILE or size > min(small, room[0]):
                            return None
                        room[0] -= size
                        return await reader.read_all()
                except _SKIPPED:
                    return None

        datas = await asyncio.gather(*(one(path, version) for path, version, _ in asks))
        head: list[list[Any]] = []
        sending: list[tuple[bytes, bytes]] = []
        sent_at: list[int] = []  # the ask of each file sent
        total = 0
        for index, ((_, _, have), data) in enumerate(zip(asks, datas, strict=True)):
            if data is None:
                head.append([bundle.SKIP, 0, ""])
                continue
            digest = chunk_id(data)
            if digest == have:  # content the spoke holds (a new mtime, a copy): its id only
                head.append([bundle.HELD, len(data), ""])
                continue
            if bundle.may_hold(holds, digest):  # held under another path: the asker checks
                head.append([bundle.HELD, len(data), digest.hex()])
                continue
            if not have and await asyncio.to_thread(numeric, data):
                # token shards and tensors: alone, their frame is shuffled into byte planes
                # (3% smaller on bench/transfer.py's corpus 3 than in a shared stream)
                head.append([bundle.SKIP, 0, ""])
                continue
            total += len(data)
            head.append([bundle.SENT, len(data), digest.hex()])
            sending.append((data, have))
            sent_at.append(index)
        bases, frame = await self.chunks.bundle(sending) if sending else ([], b"")
        body = bundle.answer({"files": head, "bases": [sent_at[i] for i in bases]}, frame)
        Transfer("hub", "down", "(bundle)", logical=total, wire=len(body)).done()
        return web.Response(body=body, content_type="application/octet-stream")

    async def frames(self, request: web.Request) -> web.StreamResponse:
        who = self._site(request, "chunks")
        body = await _body(request)
        ids = _ids(body.get("ids"))
        at = body.get("at") or [None] * len(ids)
        if not isinstance(at, list) or len(at) != len(ids):
            raise InvalidArgument("'at' must give one estimate (or null) per id")
        if any(a is not None and (type(a) is not int or a < 0) for a in at):
            raise InvalidArgument("'at' estimates are non-negative integers or null")
        base = body.get("base")
        held: tuple[str, int] | None = None
        if base is not None:
            if not isinstance(base, dict) or not isinstance(base.get("path"), str):
                raise InvalidArgument("'base' is {path, version}")
            if type(base.get("version")) is not int:
                raise InvalidArgument("'base.version' must be an integer")
            held = (base["path"], base["version"])
        wanted = [Wanted(i, a) for i, a in zip(ids, at, strict=True)]
        transfer = Transfer("hub", "down", "(batch)")
        records = self.chunks.frames(wanted, held, transfer, who=who)
        first = await anext(records, None)  # errors before the status goes out stay clean
        response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        await response.prepare(request)
        try:
            if first is not None:
                await response.write(b"".join(first))
            async for batch in records:
                await response.write(b"".join(batch))
            await response.write_eof()
        finally:
            with contextlib.suppress(Exception):
                await records.aclose()
            transfer.done()
        return response

    async def missing(self, request: web.Request) -> web.Response:
        who = self._site(request, "chunks_missing")
        ids = _ids((await _body(request)).get("ids"))
        lacking = await self.chunks.missing(ids, who)
        return web.json_response({"missing": [i.hex() for i in lacking]})

    async def upload(self, request: web.Request) -> web.Response:
        self._site(request, "chunks_upload")
        content = request.content
        transfer = Transfer("hub", "up", "(upload)")
        try:
            stored = await self.chunks.receive(read_uploads(content.readexactly), transfer)
        except EOFError as exc:  # asyncio.IncompleteReadError: the body ended mid-record
            raise CorruptData("upload body truncated") from exc
        finally:
            transfer.done()
        return web.json_response({"stored": stored})

    async def commit(self, request: web.Request) -> web.Response:
        who, path = self.server.principal(request), "/" + request.match_info["path"]
        length = request.content_length
        if length is None or length > MAX_MAP:
            raise InvalidArgument(f"a commit carries a chunk map of at most {MAX_MAP} bytes")
        if_version = _int(request.headers.get("If-Match"), "If-Match")
        mode = _int(request.headers.get("X-Loomfs-Mode"), "X-Loomfs-Mode")
        cmap = ChunkMap.deserialize(await request.content.readexactly(length))
        transfer = Transfer("hub", "up", path, wire=length)
        exclusive = request.headers.get("If-None-Match", "").strip() == "*"
        write_id, tags = write_id_of(request), tags_of(request)
        if self.governance is not None:
            if await self.governance.sealing_for(who, path) is not None:
                # assembled from chunks as they came; the spoke sends it whole instead
                raise CorruptData(f"{path} is encrypted at rest: send its bytes whole")
            tags = sse.write_tags(tags, {})  # stored as sent: an old content's keys go

        def commit() -> Awaitable[Entry]:
            return self.chunks.commit(
                who,
                path,
                cmap,
                if_version=if_version,
                exclusive=exclusive,
                mode=mode,
                write_id=write_id,
                transfer=transfer,
                tags=tags,
            )

        try:
            if self.governance is None:
                entry = await commit()
            else:  # a write of the path, as its writer
                entry = await self.governance.audited(
                    who, "write", Action.WRITE, path, commit,
                    detail="chunked", nbytes=lambda e: e.size,
                )  # fmt: skip
        finally:
            transfer.done()
        return web.json_response(wire.entry_json(entry), status=201)
