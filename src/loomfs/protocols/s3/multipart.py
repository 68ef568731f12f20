"""Multipart uploads: records in the catalog, parts staged on disk (protocol layer).

S3 clients upload parts in any order and in parallel, then name the parts that make the
object. Each upload is a record in the catalog's database (``UploadRecords``) and its parts
wait in ``<staging>/<upload id>/`` (one file per part, written to a temporary name and
renamed once complete, so a part is there whole or not at all). Where several gateways
share one catalog and their staging directory is on storage they share (``[hub]
staging_dir``), an upload created through one takes parts through another and completes
through a third. Completion streams the parts in order into one namespace write, which
commits the object atomically, then removes the upload's directory and records the answer,
so that a client that repeats Complete (after a lost reply) gets the same one through any
gateway. The staging directory filling up is an error naming it (``InsufficientStorage``),
and a part or an upload that could not be stored whole leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...core.catalog.base import UploadRecords
from ...core.streams import BUFFER_SIZE
from ...errors import LoomError, from_oserror
from .errors import S3Error

log = logging.getLogger(__name__)

MIN_PART_SIZE = 5 << 20  # as AWS: every part but the last
DONE_TTL_S = 3600  # how long a completed upload answers a repeated Complete
MAX_PARTS = 10000
_UPLOAD_ID = re.compile(r"^[A-Za-z0-9_-]{32}$")


@dataclass(frozen=True, slots=True)
class Part:
    number: int
    size: int
    etag: str  # quoted hex MD5, as S3 answers
    mtime_ns: int
    checksum: str | None = None  # '<algorithm> <base64 value>' of an additional checksum


@dataclass(frozen=True, slots=True)
class Upload:
    upload_id: str
    bucket: str
    key: str
    owner: str
    initiated_ns: int
    meta: dict[str, str]  # the tags the object gets on completion (metadata, type)
    checksum: str | None = None  # '<algorithm> <FULL_OBJECT|COMPOSITE>' the object gets


class Staging:
    def __init__(self, root: Path, records: UploadRecords) -> None:
        self.root = root
        self.records = records

    def _failed(self, exc: OSError) -> LoomError:
        return from_oserror(exc, disk=f"the upload staging directory {self.root}")

    def _dir(self, upload_id: str) -> Path:
        # the id comes from the client: only our own shape may become a path
        if not _UPLOAD_ID.match(upload_id):
            raise S3Error("NoSuchUpload", "the specified upload does not exist")
        return self.root / upload_id

    async def create(
        self, bucket: str, key: str, owner: str, meta: dict[str, str], checksum: str | None = None
    ) -> Upload:
        upload = Upload(
            secrets.token_urlsafe(24), bucket, key, owner, time.time_ns(), meta, checksum
        )
        folder = self._dir(upload.upload_id)
        try:
            await asyncio.to_thread(folder.mkdir, parents=True)
        except OSError as exc:
            raise self._failed(exc) from exc
        try:  # its folder first: a part sent as soon as the record is seen has a place
            await self.records.add(upload.upload_id, bucket, json.dumps(_as_dict(upload)))
        except BaseException:
            await asyncio.to_thread(shutil.rmtree, folder, True)
            raise
        return upload

    async def get(self, upload_id: str, bucket: str, key: str) -> Upload:
        self._dir(upload_id)  # refuses ids that are not ours
        found = await self.records.get(upload_id)
        if found is None or found[1] is not None:
            raise S3Error("NoSuchUpload", "the specified upload does not exist")
        upload = Upload(**json.loads(found[0]))
        if (upload.bucket, upload.key) != (bucket, key):
            raise S3Error("NoSuchUpload", "the specified upload does not exist")
        return upload

    async def uploads(self, bucket: str) -> list[Upload]:
        found = [Upload(**json.loads(record)) for record in await self.records.of_bucket(bucket)]
        return sorted(found, key=lambda u: (u.key, u.initiated_ns))

    async def put_part(
        self,
        upload: Upload,
        number: int,
        data: AsyncIterable[bytes],
        max_size: int,
        checksum: Callable[[], str] | None = None,
    ) -> Part:
        """Stage part ``number``; ``checksum`` gives its additional checksum
        ('<algorithm> <value>') once ``data`` has ended."""
        if not 1 <= number <= MAX_PARTS:
            raise S3Error("InvalidArgument", f"part numbers are 1 to {MAX_PARTS}")
        folder = self._dir(upload.upload_id)
        final = folder / f"{number:05d}"
        temp = folder / f".{number:05d}.{secrets.token_hex(4)}"
        digest = hashlib.md5()
        size = 0
        try:
            fobj = await asyncio.to_thread(open, temp, "xb")
        except FileNotFoundError:
            # aborted meanwhile, or created by a gateway whose staging is not this one's
            raise S3Error("NoSuchUpload", "the upload's staging directory is gone") from None
        except OSError as exc:
            raise self._failed(exc) from exc
        try:
            async for chunk in data:
                size += len(chunk)
                if size > max_size:
                    raise S3Error("EntityTooLarge", f"a part may be at most {max_size} bytes")
                digest.update(chunk)
                await asyncio.to_thread(fobj.write, chunk)
            await asyncio.to_thread(fobj.flush)
            await asyncio.to_thread(os.fsync, fobj.fileno())
            fobj.close()
            etag = f'"{digest.hexdigest()}"'
            kept = checksum() if checksum is not None else None
            await asyncio.to_thread(_write_then_rename, temp, final, etag, kept)
        except BaseException as exc:
            with contextlib.suppress(OSError):  # its buffer may not fit either
                fobj.close()
            temp.unlink(missing_ok=True)
            if isinstance(exc, LoomError):
                raise
            if isinstance(exc, OSError):
                raise self._failed(exc) from exc
            raise
        return Part(number, size, etag, time.time_ns(), kept)

    async def parts(self, upload: Upload) -> list[Part]:
        folder = self._dir(upload.upload_id)

        def scan() -> list[Part]:
            found = []
            for path in sorted(folder.glob("[0-9]" * 5)):
                try:
                    st = path.stat()
                    etag = (folder / f"{path.name}.etag").read_text()
                except FileNotFoundError:
                    continue
                try:
                    kept: str | None = (folder / f"{path.name}.checksum").read_text()
                except FileNotFoundError:
                    kept = None
                found.append(Part(int(path.name), st.st_size, etag, st.st_mtime_ns, kept))
            return found

        return await asyncio.to_thread(scan)

    async def assemble(
        self, upload: Upload, chosen: list[tuple[int, str]]
    ) -> tuple[AsyncIterator[bytes], str, list[Part]]:
        """The object's bytes from the ``chosen`` (number, etag) parts, its ETag (MD5 of
        the parts' MD5s, '-N') and those parts; refuses missing, mismatched or small
        parts."""
        if not chosen:
            raise S3Error("MalformedXML", "a multipart upload needs at least one part")
        numbers = [n for n, _ in chosen]
        if numbers != sorted(numbers):
            raise S3Error("InvalidPartOrder", "the parts must be listed in ascending order")
        # a number listed twice (a part re-sent while its first send still ran, both
        # listed): the last entry is the one that counts, as on S3
        chosen = list(dict(chosen).items())
        numbers = [n for n, _ in chosen]
        have = {p.number: p for p in await self.parts(upload)}
        combined = hashlib.md5()
        for i, (number, etag) in enumerate(chosen):
            part = have.get(number)
            if part is None or part.etag.strip('"') != etag.strip().strip('"'):
                raise S3Error("InvalidPart", f"part {number} was not uploaded or its ETag differs")
            if part.size < MIN_PART_SIZE and i < len(chosen) - 1:
                raise S3Error("EntityTooSmall", f"part {number} is smaller than 5 MiB")
            combined.update(bytes.fromhex(part.etag.strip('"')))
        folder = self._dir(upload.upload_id)

        async def stream() -> AsyncIterator[bytes]:
            for number in numbers:
                with open(folder / f"{number:05d}", "rb") as fobj:  # noqa: ASYNC230 - reads go to a thread
                    while chunk := await asyncio.to_thread(fobj.read, BUFFER_SIZE):
                        yield chunk

        return stream(), f'"{combined.hexdigest()}-{len(chosen)}"', [have[n] for n in numbers]

    async def remove(self, upload: Upload) -> None:
        await self.records.drop(upload.upload_id)
        await asyncio.to_thread(shutil.rmtree, self._dir(upload.upload_id), True)

    async def finish(self, upload: Upload, etag: str, checksum: str | None = None) -> None:
        """Remove a completed upload's parts, remembering its ETag (and the object's
        checksum, as the gateway writes it) for a while."""
        done = json.dumps({"etag": etag, "checksum": checksum})
        try:
            await self.records.finish(upload.upload_id, done, time.time_ns() - DONE_TTL_S * 10**9)
        except LoomError:
            # the object is committed whatever happens here: a catalog that failed now
            # must not turn that into an error; a repeated Complete then finds no upload
            log.warning("upload %s completed without its record", upload.upload_id, exc_info=True)
        await asyncio.to_thread(shutil.rmtree, self._dir(upload.upload_id), True)

    async def completed(
        self, upload_id: str, bucket: str, key: str
    ) -> tuple[str, str | None] | None:
        """The ETag and checksum of an upload completed lately as ``bucket``/``key``,
        else None."""
        self._dir(upload_id)  # refuses ids that are not ours
        found = await self.records.get(upload_id)
        if found is None or found[1] is None:
            return None
        upload, done = json.loads(found[0]), json.loads(found[1])
        if (upload["bucket"], upload["key"]) != (bucket, key):
            return None
        return str(done["etag"]), done.get("checksum")


def _as_dict(upload: Upload) -> dict[str, Any]:
    return {
        "upload_id": upload.upload_id,
        "bucket": upload.bucket,
        "key": upload.key,
        "owner": upload.owner,
        "initiated_ns": upload.initiated_ns,
        "meta": upload.meta,
        "checksum": upload.checksum,
    }


def _write_then_rename(temp: Path, final: Path, etag: str, checksum: str | None) -> None:
    # the ETag and checksum files first: a part file without its ETag is skipped, never
    # misreported; one re-sent without a checksum loses the first send's
    checksum_file = final.with_name(final.name + ".checksum")
    if checksum is None:
        checksum_file.unlink(missing_ok=True)
    else:
        checksum_file.write_text(checksum)
    final.with_name(final.name + ".etag").write_text(etag)
    os.replace(temp, final)
