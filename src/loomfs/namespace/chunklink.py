"""What a spoke needs of its hub to move chunks instead of byte ranges (namespace layer).

The fabric client implements it over HTTP; the spoke's cache (downloads) and journal
uploader (uploads) call it. Frames are verified by the receiver, never trusted. At the
other end, ``ChunkService`` is what the fabric's chunk routes call (the hub's
``hub.chunks.HubChunks``), so the protocol edge imports no hub module.

Who: a file's first open and a commit name the user they are for (``who``), so the hub's
rules decide for that user; ``None`` is the spoke acting for itself (cache fills of a
version a user was already let read). Chunks by id (fetch, missing, upload) are the
site's own: an id is only learnt from a map or from the bytes themselves.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from ..chunks.chunkmap import ChunkMap
from ..core.types import Entry, Principal, WriteTags

if TYPE_CHECKING:  # the metrics' module is prometheus's: a REST client needs none of it
    from ..chunks.metrics import Transfer


@dataclass(frozen=True, slots=True)
class Wanted:
    """One chunk a receiver asks for, and where its bytes likely sit in the base file it
    holds (a delta estimate), if any."""

    id: bytes
    delta_from: int | None = None


class ChunkService(Protocol):
    """The hub's end of the chunk link, as its routes call it (``hub.chunks.HubChunks``
    says what each call does and decides)."""

    async def chunk_map(self, who: Principal, path: str) -> tuple[Entry, ChunkMap]: ...

    def frames(
        self,
        wanted: Sequence[Wanted],
        base: tuple[str, int] | None = None,
        transfer: Transfer | None = None,
        who: Principal | None = None,
    ) -> AsyncGenerator[list[bytes], None]: ...

    async def missing(self, ids: Sequence[bytes], who: Principal | None = None) -> list[bytes]: ...

    async def bundle(self, files: Sequence[tuple[bytes, bytes]]) -> tuple[list[int], bytes]: ...

    async def keep_whole(self, data: bytes, frame: bytes) -> None: ...

    async def receive(
        self, records: AsyncIterator[tuple[bytes, bytes]], transfer: Transfer | None = None
    ) -> int: ...

    async def commit(
        self,
        who: Principal,
        path: str,
        cmap: ChunkMap,
        *,
        if_version: int | None = None,
        exclusive: bool = False,
        mode: int | None = None,
        write_id: str | None = None,
        transfer: Transfer | None = None,
        tags: WriteTags | None = None,
    ) -> Entry: ...


@dataclass(frozen=True, slots=True)
class Opened:
    """A file as the hub answers a first request for it: its entry, and either its whole
    bytes (files up to the size the caller named small), ``held`` (their id, when it is
    one the caller said it holds: the bytes do not cross) or its chunk map."""

    entry: Entry
    whole: bytes | None = None
    chunk_map: ChunkMap | None = None
    held: bytes | None = None


@dataclass(frozen=True, slots=True)
class SmallAsk:
    """A small file a receiver asks for in a bundle: ``path`` at ``version``, and the bytes
    it holds of another version of that path (``held``, with their id ``have``), if any:
    the hub sends nothing for the file if they are its bytes, else maybe a delta."""

    path: str
    version: int
    held: bytes | None = None
    have: bytes = b""


@dataclass(frozen=True, slots=True)
class Named:
    """A file of a bundle sent as its BLAKE3 ``id`` alone: bytes the receiver's filter of
    the ids it holds (``chunks.bundle.holds``) may hold, under any path; the receiver
    finds them by that id and checks them against it."""

    id: bytes


class ChunkLink(ABC):
    @abstractmethod
    async def open_chunked(
        self, path: str, *, small: int = 0, who: Principal | None = None, have: bytes = b""
    ) -> Opened:
        """The current version of ``path``: whole if it is at most ``small`` bytes (only
        its id, as ``held``, if that is ``have``: content the caller holds), else its chunk
        map; opened for ``who`` (None: for the spoke itself)."""

    @abstractmethod
    async def fetch_small(
        self,
        asks: Sequence[SmallAsk],
        *,
        small: int,
        holds: bytes = b"",
        who: Principal | None = None,
    ) -> list[bytes | Named | None]:
        """The bytes of each file asked (of up to ``small`` bytes), in one request and one
        frame for them all (``chunks.bundle``), each verified by its id; ``Named`` for one
        whose id the filter ``holds`` (of the ids the caller holds) may hold; None for a
        file the hub sent none of (no longer at that version, not small, refused: the
        caller fetches it alone, which says why). Read for ``who`` (None: the spoke itself)."""

    @abstractmethod
    def fetch_chunks(
        self,
        ids: Sequence[bytes],
        *,
        base: tuple[str, int] | None = None,
        at: Sequence[int | None] = (),
    ) -> AsyncIterator[bytes | None]:
        """The frame of each chunk in ``ids``, in order as they arrive (None: the hub holds
        no verified copy). ``base``: a file version this side holds, and ``at`` where each
        chunk likely sits in it, for delta frames."""

    @abstractmethod
    async def missing_chunks(self, ids: Sequence[bytes]) -> list[bytes]:
        """Which of ``ids`` the hub holds in no file."""

    @abstractmethod
    async def upload_chunks(self, records: AsyncIterable[bytes]) -> int:
        """Send upload records (``chunks.records.record(frame, id)``); how many were kept."""

    @abstractmethod
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
        """Write ``path`` at the hub from chunks it holds or was sent, with the same
        preconditions, idempotency key and tags as a namespace write, as ``who`` (None: as
        the spoke itself)."""
