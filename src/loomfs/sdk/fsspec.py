"""``loomfs://`` for fsspec (protocol layer, client side): pandas, pyarrow, dask, torch and
anything else that opens files through fsspec reach loomfs over its REST API.

A URL is ``loomfs://SITE/namespace/path``. SITE names a hub or spoke: a name from the
config's ``[client] sites`` table (``sites = {gpu-west = "https://10.0.0.7:7071"}``), a
``sites=`` storage option, or a literal ``host:port`` (plain HTTP). Like a bucket in s3fs,
SITE is part of every path this filesystem hands back, so one instance serves every site.

The caller is who the ``key`` and ``secret`` storage options say (an access key id and its
secret, named as in s3fs), else who the CLI is (``LOOMFS_ACCESS_KEY``/``LOOMFS_SECRET_KEY``,
``[client] access_key``/``secret_key``), else the anonymous caller; an https site's
certificate is checked against ``ca_cert`` (else ``LOOMFS_CA_CERT``, ``[client] ca_cert``,
the system's CAs). A refusal is a ``PermissionError``, also inside ``find`` and ``walk``,
never a directory that looks empty.

The filesystem is an fsspec ``AsyncFileSystem``: its coroutines run on fsspec's own I/O loop
thread, which is what its synchronous methods wait on, and async callers (zarr) can use the
coroutines directly. Files opened for reading are pinned to the version they were opened at
(a change at the hub mid-read is a ``Conflict``, never a mix); files opened for writing stream
their bytes to the server as they are written and commit on close.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import weakref
from collections.abc import AsyncIterable, AsyncIterator
from pathlib import Path
from typing import Any

import fsspec
from fsspec.asyn import AsyncFileSystem, sync
from fsspec.spec import AbstractBufferedFile

from .. import paths
from ..config import load_config
from ..core.streams import BUFFER_SIZE
from ..core.types import SYSTEM, Entry, EntryKind
from ..errors import AlreadyExists, InvalidPath, IsADirectory, LoomError, NotFound
from ..rest.client import RestNamespace
from .local import LocalReader

log = logging.getLogger(__name__)

PROTOCOL = "loomfs"
WHO = SYSTEM  # the REST server decides who the caller is, from the credentials sent
MKDIR_TRIES = 5
#: fsspec's ``type`` of each kind: a special file (fifo, device, socket: no bytes to read)
#: is "other", as fsspec's local file system reports it; so is a symlink, which a loomfs
#: stat does not follow (``islink`` tells it apart)
FSSPEC_TYPE: dict[EntryKind, str] = {
    EntryKind.FILE: "file",
    EntryKind.DIR: "directory",
    EntryKind.SYMLINK: "other",
    EntryKind.FIFO: "other",
    EntryKind.CHAR_DEVICE: "other",
    EntryKind.BLOCK_DEVICE: "other",
    EntryKind.SOCKET: "other",
}
WRITE_QUEUE = 4  # written blocks queued for the upload: bounds a writer's memory


def resolve_site(site: str, sites: dict[str, str]) -> str:
    """The base URL of ``site``: a configured name, or ``host:port`` (plain HTTP)."""
    if site in sites:
        return sites[site].rstrip("/")
    if ":" in site:
        return f"http://{site}"
    known = ", ".join(sorted(sites)) or "none configured"
    raise InvalidPath(
        f"unknown loomfs site {site!r}: name one of [client] sites ({known}) or give host:port"
    )


class LoomFileSystem(AsyncFileSystem):  # type: ignore[misc]  # fsspec is untyped
    protocol = (PROTOCOL,)
    root_marker = ""

    def __init__(
        self,
        sites: dict[str, str] | None = None,
        *,
        key: str | None = None,
        secret: str | None = None,
        ca_cert: str | os.PathLike[str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        settings = load_config().client
        self.sites = {**(settings.sites if sites is None else {}), **(sites or {})}
        self._credentials = settings.credentials(key=key, secret=secret)
        self._ca_cert = Path(ca_cert) if ca_cert is not None else settings.trusted_cert()
        self._clients: dict[str, RestNamespace] = {}
        self._dirs: set[tuple[str, str]] = set()  # (site, directory) known to exist
        # Sessions belong to the I/O loop: close them there when this instance goes away.
        weakref.finalize(self, _close_clients, self.loop, self._clients)

    # -- paths -----------------------------------------------------------------------------

    @classmethod
    def _strip_protocol(cls, path: str | list[str]) -> Any:
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        path = path.removeprefix(f"{PROTOCOL}://")
        return path.rstrip("/") or path

    def split(self, path: str) -> tuple[str, str, RestNamespace]:
        """(site, namespace path, the client for that site) of a URL or stripped path."""
        site, _, rest = self._strip_protocol(path).partition("/")
        if not site:
            raise InvalidPath(f"a loomfs URL names its site first: loomfs://SITE/path, not {path}")
        client = self._clients.get(site)
        if client is None:
            client = self._clients[site] = RestNamespace(
                resolve_site(site, self.sites), credentials=self._credentials, ca_cert=self._ca_cert
            )
        return site, "/" + rest, client

    def client(self, path: str) -> RestNamespace:
        return self.split(path)[2]

    def local_reader(self, path: str) -> LocalReader | None:
        """Reads of the site of ``path`` from its cache files (``sdk.local``) where it is
        a spoke on this machine that takes them; else None: read over HTTP. Asked of
        the site each time: a connection goes only to the socket it announces now."""
        client = self.client(path)
        try:
            announced = self.call(client.local_reads())
        except LoomError as exc:
            log.info("no local reads from %s: %s", client.base_url, exc)
            return None
        if announced is None:
            return None
        reader = LocalReader(announced, client.authorization)
        return reader if reader.connect() else None

    @staticmethod
    async def _details(site: str, client: RestNamespace, link: Entry) -> dict[str, Any]:
        """fsspec's info of an entry; a symlink to a file has its target's (size, type,
        version), as fsspec's local file system reports it, since reading it reads the
        target (a buffered file reads no further than that size). Any other link is
        itself: a listing does not go through links to directories."""
        entry = link
        if link.kind is EntryKind.SYMLINK:
            with contextlib.suppress(LoomError):
                target = await client.followed(WHO, link)
                entry = target if target.kind is EntryKind.FILE else link
        return {
            "name": site + link.path.rstrip("/") if link.path != "/" else site,
            "size": entry.size,
            "type": FSSPEC_TYPE[entry.kind],
            "kind": entry.kind.value,  # which "other" it is
            "islink": link.kind is EntryKind.SYMLINK,
            "nlink": entry.nlink,
            "version": entry.version,
            "mtime": entry.mtime_ns / 1e9,
            "mode": entry.mode,
            "etag": entry.etag,
        }

    # -- reading ---------------------------------------------------------------------------

    async def _info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        site, name, client = self.split(path)
        return await self._details(site, client, await client.stat(WHO, name))

    async def _walk(
        self, path: str, maxdepth: int | None = None, on_error: Any = "omit", **kwargs: Any
    ) -> AsyncIterator[Any]:
        """fsspec's walk, except that only a directory that vanished on the way is omitted:
        fsspec omits every OSError, which makes a refused listing, a timeout or a lost hub
        look like an empty directory."""
        if on_error == "omit":
            on_error = _raise_unless_vanished
        async for found in super()._walk(path, maxdepth, on_error=on_error, **kwargs):
            yield found

    async def _ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        site, name, client = self.split(path)
        entries = [await self._details(site, client, e) async for e in client.list(WHO, name)]
        if not entries:
            # an empty directory lists nothing; a file lists itself, as in fsspec's others
            info = await self._details(site, client, await client.stat(WHO, name))
            if info["type"] != "directory":
                entries = [info]
        return entries if detail else [e["name"] for e in entries]

    async def _cat_file(
        self,
        path: str,
        start: int | None = None,
        end: int | None = None,
        version: int | None = None,
        **kwargs: Any,
    ) -> bytes:
        """Bytes [start, end) (negative counts from the end), of ``version`` if given."""
        _, name, client = self.split(path)
        if (start is not None and start < 0) or (end is not None and end < 0):
            size = (await client.followed(WHO, await client.stat(WHO, name))).size
            start = None if start is None else max(0, size + start) if start < 0 else start
            end = None if end is None else max(0, size + end) if end < 0 else end
        offset = start or 0
        length = None if end is None else max(0, end - offset)
        async with await client.read(WHO, name, offset, length, if_version=version) as reader:
            return await reader.read_all()

    # -- writing ---------------------------------------------------------------------------

    async def _pipe_file(
        self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any
    ) -> None:
        async def body() -> AsyncIterator[bytes]:
            yield bytes(value)

        await self._write(path, body(), exclusive=mode == "create")

    async def _write(
        self, path: str, body: AsyncIterable[bytes], *, exclusive: bool = False
    ) -> Entry:
        """Write a file, creating its missing parents first (as object stores let fsspec
        users expect). A parent seen to exist is remembered by this instance."""
        await self._ensure_parent(path)
        _, name, client = self.split(path)
        return await client.write(WHO, name, body, exclusive=exclusive)

    async def _ensure_parent(self, path: str) -> None:
        site, name, client = self.split(path)
        parent = paths.split(paths.normalize(name))[0]
        if (site, parent) in self._dirs:
            return
        try:
            exists = (await client.stat(WHO, parent)).is_dir
        except NotFound:
            exists = False
        if not exists:
            await self._makedirs(f"{site}{parent}", exist_ok=True)
        self._dirs.add((site, parent))

    async def _rm_file(self, path: str, **kwargs: Any) -> None:
        _, name, client = self.split(path)
        await client.remove(WHO, name)

    async def _rm(
        self, path: str | list[str], recursive: bool = False, maxdepth: int | None = None,
        **kwargs: Any,
    ) -> None:  # fmt: skip
        # The namespace removes a tree in one call; globs are expanded, trees are not.
        targets = [path] if isinstance(path, str) else list(path)
        expanded: list[str] = []
        for target in targets:
            if any(c in target for c in "*?["):
                expanded += await self._expand_path(target, recursive=False)
            else:
                expanded.append(target)
        for target in expanded:
            site, name, client = self.split(target)
            await client.remove(WHO, name, recursive=recursive)
            self._dirs = {d for d in self._dirs if not paths.is_within(d[1], name) or d[0] != site}

    async def _mv(self, path1: str, path2: str, **kwargs: Any) -> None:
        site1, src, client = self.split(path1)
        site2, dst, _ = self.split(path2)
        if site1 != site2:
            # across sites it is a copy and a delete, with fsspec's generic code
            await self._copy(path1, path2, recursive=True)
            await self._rm(path1, recursive=True)
            return
        await client.rename(WHO, src, dst, overwrite=True)

    def mv(self, path1: str, path2: str, recursive: bool = False, maxdepth: int | None = None,
           **kwargs: Any) -> None:  # fmt: skip
        """A rename at the hub (atomic, any size), not fsspec's copy-and-delete."""
        sync(self.loop, self._mv, path1, path2)

    async def _cp_file(self, path1: str, path2: str, **kwargs: Any) -> None:
        _, src, source = self.split(path1)
        try:
            reader = await source.read(WHO, src)
        except IsADirectory:  # a recursive copy lists directories too
            await self._makedirs(path2, exist_ok=True)
            return
        async with reader:
            await self._write(path2, reader.chunks())

    async def _put_file(
        self, lpath: str, rpath: str, mode: str = "overwrite", **kwargs: Any
    ) -> None:
        """Upload a local file, streamed; a local directory becomes a directory."""
        if os.path.isdir(lpath):
            await self._makedirs(rpath, exist_ok=True)
            return

        async def body() -> AsyncIterator[bytes]:
            source = await asyncio.to_thread(open, lpath, "rb")
            try:
                while block := await asyncio.to_thread(source.read, BUFFER_SIZE):
                    yield block
            finally:
                source.close()

        await self._write(rpath, body(), exclusive=mode == "create")

    async def _get_file(self, rpath: str, lpath: str, **kwargs: Any) -> None:
        """Download a file, streamed (a directory becomes a local directory)."""
        _, name, client = self.split(rpath)
        try:
            reader = await client.read(WHO, name)
        except IsADirectory:
            await asyncio.to_thread(os.makedirs, lpath, exist_ok=True)
            return
        async with reader:
            target = await asyncio.to_thread(open, lpath, "wb")
            try:
                async for block in reader.chunks():
                    await asyncio.to_thread(target.write, block)
            finally:
                target.close()

    async def _mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        _, name, client = self.split(path)
        await client.mkdir(WHO, name, parents=create_parents)

    async def _makedirs(self, path: str, exist_ok: bool = False) -> None:
        _, name, client = self.split(path)
        for attempt in range(MKDIR_TRIES):
            try:
                await client.mkdir(WHO, name, parents=True, exist_ok=exist_ok)
                return
            except AlreadyExists:
                # Concurrent makedirs of one tree (fsspec's put does them at once) race for
                # the shared parents at the hub: whoever lost goes again. A file is an error.
                if not exist_ok or attempt == MKDIR_TRIES - 1:
                    raise
                with contextlib.suppress(NotFound):
                    if (await client.stat(WHO, name)).is_dir:
                        return

    def _open(
        self,
        path: str,
        mode: str = "rb",
        block_size: int | None = None,
        autocommit: bool = True,
        cache_options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> LoomFile:
        if mode not in ("rb", "wb", "xb"):
            raise NotImplementedError(f"loomfs files open as rb, wb or xb, not {mode!r}")
        if mode == "xb" and self.exists(path):  # early; the commit checks again, atomically
            raise AlreadyExists(f"file exists: {path}", path=path)
        return LoomFile(
            self, path, mode, block_size or "default", autocommit,
            cache_options=cache_options, **kwargs,
        )  # fmt: skip

    # -- spoke calls the SDK uses ---------------------------------------------------------

    def call(self, coro: Any) -> Any:
        """Run a coroutine of this filesystem's clients on its I/O loop and wait for it."""
        return sync(self.loop, lambda: coro)

    def submit_threadsafe(self, coro: Any) -> concurrent.futures.Future[Any]:
        """Start a coroutine on the I/O loop from any thread without waiting for it."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)


class LoomFile(AbstractBufferedFile):  # type: ignore[misc]  # fsspec is untyped
    """Reads: ranged requests of the version seen at open, through fsspec's readahead cache.
    Writes: each flushed block goes onto a bounded queue that one streaming PUT drains;
    closing ends the stream and waits for the commit (``xb`` fails if the file exists)."""

    fs: LoomFileSystem

    def __init__(self, fs: LoomFileSystem, path: str, mode: str, block_size: Any, autocommit: bool,
                 **kwargs: Any) -> None:  # fmt: skip
        self._queue: asyncio.Queue[bytes | None] | None = None
        self._upload: asyncio.Future[Any] | None = None
        super().__init__(fs, path, "wb" if mode == "xb" else mode, block_size, autocommit, **kwargs)
        self._exclusive = mode == "xb"

    def _fetch_range(self, start: int, end: int) -> bytes:
        # version 0 is a write a spoke journaled and the hub has yet to commit: nothing to pin
        version = self.details["version"] or None
        data: bytes = self.fs.cat_file(self.path, start, end, version=version)
        return data

    def _initiate_upload(self) -> None:
        fs, path, exclusive = self.fs, self.path, self._exclusive

        async def start() -> asyncio.Future[Any]:
            queue: asyncio.Queue[bytes | None] = asyncio.Queue(WRITE_QUEUE)
            self._queue = queue

            async def body() -> AsyncIterator[bytes]:
                while (block := await queue.get()) is not None:
                    yield block

            return asyncio.ensure_future(fs._write(path, body(), exclusive=exclusive))

        self._upload = sync(self.fs.loop, start)

    def _upload_chunk(self, final: bool = False) -> bool:
        block = self.buffer.getvalue()
        sync(self.fs.loop, self._feed, block)
        if final:
            sync(self.fs.loop, self._finish)
        return True

    async def _feed(self, block: bytes | None) -> None:
        """Queue a block for the upload, unless the upload failed (then say why)."""
        assert self._queue is not None and self._upload is not None
        if not block and block is not None:
            return
        put = asyncio.ensure_future(self._queue.put(block))
        await asyncio.wait({put, self._upload}, return_when=asyncio.FIRST_COMPLETED)
        if not put.done():
            put.cancel()
            self._upload.result()  # raises the server's error

    async def _finish(self) -> None:
        await self._feed(None)
        assert self._upload is not None
        await self._upload

    def discard(self) -> None:
        """Abandon a write: the stream is cut, so the server commits nothing."""
        if self._upload is not None:
            self.fs.loop.call_soon_threadsafe(self._upload.cancel)
        super().discard()


def _raise_unless_vanished(exc: BaseException) -> None:
    if not isinstance(exc, FileNotFoundError):
        raise exc


def _close_clients(loop: asyncio.AbstractEventLoop, clients: dict[str, RestNamespace]) -> None:
    async def close_all() -> None:
        for client in clients.values():
            await client.close()

    if clients and loop.is_running():
        # Not waited for: the collector may run this on the I/O loop's own thread, which a
        # wait would block (and every request with it). At interpreter exit the loop may
        # stop first: then the OS closes the sockets.
        with contextlib.suppress(RuntimeError):
            asyncio.run_coroutine_threadsafe(close_all(), loop)


def register() -> None:
    """Make ``loomfs://`` known to fsspec where the entry point is not installed."""
    fsspec.register_implementation(PROTOCOL, LoomFileSystem, clobber=True)


register()
