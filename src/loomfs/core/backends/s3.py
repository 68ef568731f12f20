"""A volume on an S3 bucket or a prefix of one (core layer).

``s3://bucket/optional/prefix?endpoint=http://host:port&region=us-east-1&profile=name``.
Credentials come only from boto3's standard chain (environment, shared credentials file,
the named profile, instance roles), never from the URL, so that no secret is ever stored in
the catalog or printed in a log. Objects stay plain objects; a directory is a common
prefix, or a zero-byte 'name/' marker object where loomfs created an empty one.

boto3 is synchronous: every call runs in this backend's own thread pool. Timeouts are
short and retries few, so that an unreachable endpoint is reported within seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import parse_qsl, unquote, urlsplit

import boto3
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    HTTPClientError,
    NoCredentialsError,
    PartialCredentialsError,
    ProfileNotFound,
)
from botocore.exceptions import (
    ConnectionError as BotoConnectionError,
)

from ...errors import (
    AlreadyExists,
    AuthenticationFailed,
    BackendUnavailable,
    ConfigError,
    Conflict,
    DirectoryNotEmpty,
    InsufficientStorage,
    InvalidArgument,
    InvalidPath,
    IsADirectory,
    LoomError,
    NotADirectory,
    NotFound,
    PermissionDenied,
)
from ..streams import BUFFER_SIZE, ByteSource, BytesSource, StreamSource
from ..types import EntryKind, ObjectInfo
from .base import Backend, Gate, Skipped, ungated
from .common import (
    PrefetchingLister,
    batches_from_thread,
    check_key,
    child_key,
    ordered_walk,
    parent_key,
)

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import ObjectTypeDef

T = TypeVar("T")

#: objects up to this size are sent in one PUT; larger ones as multipart uploads of it
PART_SIZE = 8 << 20
#: the largest object one CopyObject may copy (an S3 limit); larger ones are copied in parts
COPY_LIMIT = 5 << 30
COPY_PART_SIZE = 512 << 20
MAX_PARTS = 10_000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_URL_OPTIONS = frozenset({"endpoint", "region", "profile"})
_UNAVAILABLE_CODES = frozenset(
    {"SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout", "500", "503"}
)
_AUTH_CODES = frozenset({"InvalidAccessKeyId", "SignatureDoesNotMatch", "403"})


def _mtime_ns(when: datetime) -> int:
    return (when - _EPOCH) // timedelta(microseconds=1) * 1000


def _etag(raw: str) -> str:
    return raw.strip('"')


def translate(exc: Exception, *, endpoint: str, bucket: str, key: str | None) -> LoomError:
    """The one mapping of a botocore error onto the loomfs hierarchy (cause kept)."""
    where = f"s3://{bucket}/{key}" if key else f"bucket {bucket}"
    err: LoomError
    if isinstance(exc, BotoConnectionError | HTTPClientError):
        err = BackendUnavailable(f"S3 endpoint {endpoint} is unreachable: {exc}", path=key)
    elif isinstance(exc, NoCredentialsError | PartialCredentialsError):
        err = AuthenticationFailed(
            "no S3 credentials: set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, "
            "AWS_SHARED_CREDENTIALS_FILE or a profile= in the volume URL"
        )
    elif isinstance(exc, ProfileNotFound):
        err = ConfigError(str(exc))
    elif isinstance(exc, ClientError):
        code = str(exc.response.get("Error", {}).get("Code", ""))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        if code == "NoSuchBucket":
            err = NotFound(f"bucket {bucket} does not exist at {endpoint}", path=key)
        elif code in ("NoSuchKey", "NotFound", "404") or status == 404:
            err = NotFound(f"no such object: {where}", path=key)
        elif code in ("PreconditionFailed", "412"):
            err = Conflict(f"{where} changed since it was listed", path=key)
        elif code in _AUTH_CODES:
            err = AuthenticationFailed(f"S3 at {endpoint} refused the credentials ({code})")
        elif code == "AccessDenied":
            err = PermissionDenied(f"access denied to {where}", path=key)
        elif code in _UNAVAILABLE_CODES or status >= 500:
            err = BackendUnavailable(f"S3 at {endpoint} failed: {code}", path=key)
        elif code == "QuotaExceeded":
            err = InsufficientStorage(f"S3 refused {where}: {code}", path=key)
        else:
            err = LoomError(f"S3 request on {where} failed: {code or exc}", path=key)
    else:
        err = LoomError(f"S3 request on {where} failed: {exc}", path=key)
    err.__cause__ = exc
    return err


class S3Backend(Backend):
    """Objects below ``prefix`` in one bucket."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint: str | None = None,
        region: str | None = None,
        profile: str | None = None,
        url: str | None = None,
        max_workers: int = 16,
    ) -> None:
        self.bucket = bucket
        self.url = url or f"s3://{bucket}/{prefix}"
        # Object key of volume key k is root + k; root is '' or ends with '/'.
        self._root = check_key(prefix.strip("/")) + "/" if prefix.strip("/") else ""
        self.endpoint = endpoint or "AWS"
        try:
            session = boto3.session.Session(profile_name=profile)
        except ProfileNotFound as exc:
            raise translate(exc, endpoint=self.endpoint, bucket=bucket, key=None) from exc
        self._client: S3Client = session.client(
            "s3",
            endpoint_url=endpoint,
            region_name=region,
            config=Config(
                connect_timeout=3,
                read_timeout=20,
                retries={"max_attempts": 2, "mode": "standard"},
                max_pool_connections=max_workers,
                s3={"addressing_style": "path" if endpoint else "auto"},
            ),
        )
        self._workers = max_workers
        self._pool = ThreadPoolExecutor(max_workers, thread_name_prefix="loomfs-s3")

    @classmethod
    def from_url(cls, url: str) -> S3Backend:
        parts = urlsplit(url)
        if "@" in parts.netloc:
            # Don't echo the URL: what precedes '@' may be a secret.
            raise InvalidArgument(
                "credentials don't belong in an S3 volume URL; use the environment, "
                "a shared credentials file or profile="
            )
        if parts.scheme != "s3" or not _BUCKET.fullmatch(parts.netloc):
            raise InvalidArgument(
                f"an S3 volume URL is s3://bucket[/prefix][?options], with a valid bucket name: "
                f"{url!r}"
            )
        options = dict(parse_qsl(parts.query, strict_parsing=False))
        unknown = set(options) - _URL_OPTIONS
        if unknown:
            raise InvalidArgument(
                f"unknown S3 volume option(s) {sorted(unknown)}; known: {sorted(_URL_OPTIONS)}"
            )
        return cls(
            parts.netloc,
            unquote(parts.path),
            endpoint=options.get("endpoint"),
            region=options.get("region"),
            profile=options.get("profile"),
            url=url,
        )

    # -- plumbing ----------------------------------------------------------------

    def _obj(self, key: str) -> str:
        return self._root + check_key(key)

    def _dir_prefix(self, key: str) -> str:
        return self._root + (check_key(key) + "/" if key else "")

    def _sync(self, key: str | None, fn: Callable[..., T], **kwargs: Any) -> T:
        try:
            return fn(**kwargs)
        except (BotoCoreError, ClientError) as exc:
            raise translate(exc, endpoint=self.endpoint, bucket=self.bucket, key=key) from exc

    async def _call(self, key: str | None, fn: Callable[..., T], **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._pool, functools.partial(self._sync, key, fn, **kwargs)
        )

    def _file_info(self, key: str, obj: ObjectTypeDef) -> ObjectInfo:
        return ObjectInfo(
            key,
            EntryKind.FILE,
            obj["Size"],
            _mtime_ns(obj["LastModified"]),
            _etag(obj["ETag"]),
        )

    def _list_children(self, dir_key: str) -> list[ObjectInfo]:
        """One directory's children, sorted (blocking; for the walk thread)."""
        prefix = self._dir_prefix(dir_key)
        items: list[ObjectInfo] = []
        token: dict[str, str] = {}
        while True:
            page = self._sync(
                dir_key,
                self._client.list_objects_v2,
                Bucket=self.bucket,
                Prefix=prefix,
                Delimiter="/",
                **token,
            )
            for common in page.get("CommonPrefixes", []):
                name = common["Prefix"][len(prefix) : -1]
                if _is_name(name):
                    items.append(ObjectInfo(child_key(dir_key, name), EntryKind.DIR))
            for obj in page.get("Contents", []):
                name = obj["Key"][len(prefix) :]
                # The directory's own marker lists as its first 'child', with an empty name.
                if _is_name(name):
                    items.append(self._file_info(child_key(dir_key, name), obj))
            if not page.get("IsTruncated"):
                break
            token = {"ContinuationToken": page["NextContinuationToken"]}
        items.sort(key=lambda info: info.sort_key)
        return items

    async def _dir_exists(self, key: str) -> bool:
        if not key:
            return True
        page = await self._call(
            key,
            self._client.list_objects_v2,
            Bucket=self.bucket,
            Prefix=self._dir_prefix(key),
            MaxKeys=1,
        )
        return bool(page.get("KeyCount"))

    async def _need_parent(self, key: str) -> None:
        parent = parent_key(key)
        if not await self._dir_exists(parent):
            raise NotFound(f"parent directory {parent!r} of {key} does not exist", path=key)

    # -- Backend -----------------------------------------------------------------

    async def check(self) -> None:
        try:
            await self._call(None, self._client.head_bucket, Bucket=self.bucket)
        except NotFound as exc:
            # HEAD has no body, so the 404 can't say NoSuchBucket itself.
            raise NotFound(
                f"bucket {self.bucket} does not exist at {self.endpoint}", path=self.bucket
            ) from exc.__cause__

    async def _head(self, key: str) -> ObjectInfo | None:
        try:
            head = await self._call(
                key, self._client.head_object, Bucket=self.bucket, Key=self._obj(key)
            )
        except NotFound:
            return None
        return ObjectInfo(
            key,
            EntryKind.FILE,
            head["ContentLength"],
            _mtime_ns(head["LastModified"]),
            _etag(head["ETag"]),
        )

    async def stat(self, key: str) -> ObjectInfo:
        check_key(key)
        if key:
            info = await self._head(key)
            if info is not None:
                return info
        if await self._dir_exists(key):
            return ObjectInfo(key, EntryKind.DIR)
        raise NotFound(f"no such object: s3://{self.bucket}/{self._obj(key)}", path=key)

    def scan(
        self, prefix: str = "", start_after: str | None = None, *, skipped: Skipped | None = None
    ) -> AsyncGenerator[list[ObjectInfo], None]:
        # a listing refused is the whole bucket's (no per-prefix rights here): it ends the scan
        check_key(prefix)
        return batches_from_thread(
            lambda: ordered_walk(
                # Half the pool, so that reads and writes still get threads during a scan.
                PrefetchingLister(
                    self._list_children, self._pool, start_after, window=self._workers // 2
                ),
                prefix,
                start_after,
            ),
            name=f"loomfs-scan s3://{self.bucket}/{self._root}",
        )

    async def list_dir(self, key: str) -> AsyncGenerator[list[ObjectInfo], None]:
        items = await asyncio.get_running_loop().run_in_executor(
            self._pool, self._list_children, key
        )
        if not items and (await self.stat(key)).kind is not EntryKind.DIR:
            raise NotADirectory(f"not a directory: {key}", path=key)
        for pos in range(0, len(items), 1000):
            yield items[pos : pos + 1000]

    async def open_read(
        self, key: str, offset: int, length: int, expect: ObjectInfo | None = None
    ) -> ByteSource:
        if offset < 0 or length < 0:
            raise InvalidArgument(f"invalid range: offset={offset} length={length}", path=key)
        condition = {"IfMatch": f'"{expect.etag}"'} if expect and expect.etag else {}
        if length == 0:
            await self._call(
                key, self._client.head_object, Bucket=self.bucket, Key=self._obj(key), **condition
            )
            return BytesSource(b"")
        try:
            response = await self._call(
                key,
                self._client.get_object,
                Bucket=self.bucket,
                Key=self._obj(key),
                Range=f"bytes={offset}-{offset + length - 1}",
                **condition,
            )
        except LoomError as exc:
            if _code(exc) in ("InvalidRange", "416"):
                return BytesSource(b"")  # the range starts at or past the end
            raise
        body = response["Body"]

        async def pieces() -> AsyncIterator[bytes]:
            while piece := await self._call(key, body.read, amt=BUFFER_SIZE):
                yield piece

        async def close() -> None:
            await asyncio.get_running_loop().run_in_executor(self._pool, body.close)

        return StreamSource(pieces(), response["ContentLength"], close)

    async def write(
        self,
        key: str,
        data: AsyncIterable[bytes],
        *,
        mode: int | None = None,
        gate: Gate = ungated,
    ) -> ObjectInfo:
        if not check_key(key) or await self._dir_exists(key):
            raise IsADirectory(f"is a directory: {key or '/'}", path=key)
        await self._need_parent(key)
        obj = self._obj(key)
        stream = aiter(data)
        buffer = bytearray()
        async for chunk in stream:
            buffer += chunk
            if len(buffer) > PART_SIZE:
                break
        else:

            async def put(
                first: Callable[[], None] | None = None, body: bytes = bytes(buffer)
            ) -> ObjectInfo:
                if first is not None:
                    await asyncio.to_thread(first)
                await self._call(
                    key, self._client.put_object, Bucket=self.bucket, Key=obj, Body=body
                )
                return await self.stat(key)

            return await gate(put)
        # Larger than one part: never more than a part and a chunk in memory.
        async with self._multipart(key, obj) as upload_id:
            parts: list[dict[str, Any]] = []
            while True:
                while len(buffer) > PART_SIZE:
                    part, buffer = bytes(buffer[:PART_SIZE]), buffer[PART_SIZE:]
                    parts.append(await self._part(key, obj, upload_id, len(parts) + 1, Body=part))
                next_chunk = await anext(stream, None)
                if next_chunk is None:
                    break
                buffer += next_chunk
            parts.append(await self._part(key, obj, upload_id, len(parts) + 1, Body=bytes(buffer)))

            async def complete(first: Callable[[], None] | None = None) -> ObjectInfo:
                if first is not None:
                    await asyncio.to_thread(first)
                await self._complete(key, obj, upload_id, parts)
                return await self.stat(key)

            return await gate(complete)

    @contextlib.asynccontextmanager
    async def _multipart(self, key: str, obj: str) -> AsyncIterator[str]:
        """A multipart upload of ``obj`` (its id), aborted if the block fails."""
        target = {"Bucket": self.bucket, "Key": obj}
        created = await self._call(key, self._client.create_multipart_upload, **target)
        try:
            yield created["UploadId"]
        except BaseException:
            # The original error is the one worth reporting; a failed abort leaves parts
            # that the bucket's lifecycle rules (or a later abort) clean up.
            with contextlib.suppress(LoomError):
                await self._call(
                    key,
                    self._client.abort_multipart_upload,
                    UploadId=created["UploadId"],
                    **target,
                )
            raise

    async def _part(
        self, key: str, obj: str, upload_id: str, number: int, **source: Any
    ) -> dict[str, Any]:
        """Upload part ``number`` from ``Body=`` bytes, or from ``CopySource=`` and
        ``CopySourceRange=`` (a range of another object, copied by the server)."""
        target = {"Bucket": self.bucket, "Key": obj, "UploadId": upload_id, "PartNumber": number}
        if "Body" in source:
            uploaded = await self._call(key, self._client.upload_part, **target, **source)
            return {"PartNumber": number, "ETag": uploaded["ETag"]}
        copied = await self._call(key, self._client.upload_part_copy, **target, **source)
        return {"PartNumber": number, "ETag": copied["CopyPartResult"]["ETag"]}

    async def _complete(
        self, key: str, obj: str, upload_id: str, parts: list[dict[str, Any]]
    ) -> None:
        await self._call(
            key,
            self._client.complete_multipart_upload,
            Bucket=self.bucket,
            Key=obj,
            UploadId=upload_id,
            MultipartUpload={"Parts": parts},
        )

    async def mkdir(self, key: str) -> ObjectInfo:
        if not check_key(key) or await self._head(key) or await self._dir_exists(key):
            raise AlreadyExists(f"already exists: {key or '/'}", path=key)
        await self._need_parent(key)
        await self._call(
            key, self._client.put_object, Bucket=self.bucket, Key=self._dir_prefix(key), Body=b""
        )
        return ObjectInfo(key, EntryKind.DIR)

    async def delete(self, key: str) -> None:
        if not check_key(key):
            raise InvalidPath("the volume root can't be deleted", path=key)
        if await self._head(key):
            await self._call(
                key, self._client.delete_object, Bucket=self.bucket, Key=self._obj(key)
            )
            return
        marker = self._dir_prefix(key)
        page = await self._call(
            key, self._client.list_objects_v2, Bucket=self.bucket, Prefix=marker, MaxKeys=2
        )
        keys = [obj["Key"] for obj in page.get("Contents", [])]
        if not keys:
            raise NotFound(f"no such object: s3://{self.bucket}/{self._obj(key)}", path=key)
        if keys != [marker]:
            raise DirectoryNotEmpty(f"directory not empty: {key}", path=key)
        await self._call(key, self._client.delete_object, Bucket=self.bucket, Key=marker)

    async def rename(self, src: str, dst: str) -> None:
        if not check_key(src) or not check_key(dst):
            raise InvalidPath("the volume root can't be renamed or replaced", path=src or dst)
        if dst.startswith(src + "/"):
            raise InvalidArgument(f"can't move {src} into itself ({dst})", path=dst)
        info = await self.stat(src)
        if await self._head(dst) or await self._dir_exists(dst):
            raise AlreadyExists(f"already exists: {dst}", path=dst)
        await self._need_parent(dst)
        if info.kind is EntryKind.FILE:
            await self._copy(src, self._obj(src), self._obj(dst), info.size)
            await self._call(
                src, self._client.delete_object, Bucket=self.bucket, Key=self._obj(src)
            )
            return
        old, new = self._dir_prefix(src), self._dir_prefix(dst)
        markers: list[str] = []
        token: dict[str, str] = {}
        while True:
            page = await self._call(
                src,
                self._client.list_objects_v2,
                Bucket=self.bucket,
                Prefix=old,
                MaxKeys=1000,
                **token,
            )
            objects = page.get("Contents", [])
            keys = [obj["Key"] for obj in objects]
            await asyncio.gather(
                *(self._copy(src, o["Key"], new + o["Key"][len(old) :], o["Size"]) for o in objects)
            )
            markers += [k for k in keys if k.endswith("/")]
            await self._delete_objects(src, [k for k in keys if not k.endswith("/")])
            if not page.get("IsTruncated"):
                break
            token = {"ContinuationToken": page["NextContinuationToken"]}
        # Deepest first: SeaweedFS keeps a directory whose marker goes while it still has
        # children as an empty common prefix, which would leave a ghost of the old tree.
        markers.sort(key=lambda k: k.count("/"), reverse=True)
        await self._delete_objects(src, markers)

    async def _delete_objects(self, key: str, keys: list[str]) -> None:
        """Delete objects in order, in requests of at most 1000 (the S3 limit)."""
        for pos in range(0, len(keys), 1000):
            response = await self._call(
                key,
                self._client.delete_objects,
                Bucket=self.bucket,
                Delete={"Objects": [{"Key": k} for k in keys[pos : pos + 1000]], "Quiet": True},
            )
            if failed := response.get("Errors"):
                raise LoomError(
                    f"could not delete {len(failed)} objects below {key}, "
                    f"e.g. {failed[0].get('Key')}: {failed[0].get('Code')}",
                    path=key,
                )

    async def _copy(self, key: str, src_obj: str, dst_obj: str, size: int) -> None:
        if src_obj.endswith("/"):
            # A directory marker holds nothing worth copying, and SeaweedFS can't copy one.
            await self._call(
                key, self._client.put_object, Bucket=self.bucket, Key=dst_obj, Body=b""
            )
            return
        source = {"Bucket": self.bucket, "Key": src_obj}
        if size <= COPY_LIMIT:
            await self._call(
                key, self._client.copy_object, Bucket=self.bucket, Key=dst_obj, CopySource=source
            )
            return
        # One CopyObject can't go beyond 5 GiB: copy ranges as parts, in parallel.
        part_size = max(COPY_PART_SIZE, -(-size // MAX_PARTS))
        async with self._multipart(key, dst_obj) as upload_id:
            parts = await asyncio.gather(
                *(
                    self._part(
                        key,
                        dst_obj,
                        upload_id,
                        number,
                        CopySource=source,
                        CopySourceRange=f"bytes={start}-{min(start + part_size, size) - 1}",
                    )
                    for number, start in enumerate(range(0, size, part_size), 1)
                )
            )
            await self._complete(key, dst_obj, upload_id, parts)

    async def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._client.close()


def _is_name(name: str) -> bool:
    """Whether an object-key component can be a volume key component; keys such as
    'a//b' or 'a/../b' exist in S3 but have no place in a file namespace."""
    return name not in ("", ".", "..") and "/" not in name


def _code(exc: LoomError) -> str:
    cause = exc.__cause__
    if isinstance(cause, ClientError):
        return str(cause.response.get("Error", {}).get("Code", ""))
    return ""
