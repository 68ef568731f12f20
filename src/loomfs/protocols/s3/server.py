"""The S3 gateway (protocol layer): S3 requests in, namespace calls out, S3 XML back.

Buckets are namespace directories named in the configuration (``[s3.buckets]``), plus,
where ``[s3] bucket_root`` is set, the directories below it, which CreateBucket and
DeleteBucket make and remove. An object key 'a/b/c' is the file ``<bucket dir>/a/b/c``;
since S3 has no mkdir, a PUT creates the directories a key needs, and a DELETE prunes
the ones it leaves empty; a folder marker ('a/', no body) is the directory, tagged so
that it lists as an object (see ``listing.py``). Every request is authenticated with
SigV4 against the user registry and runs as that user's ``Principal``; where
``[s3] anonymous`` allows it, an unsigned request runs as the anonymous caller. Who may
do what is the namespace's decision (its access rules, which S3 ACLs are translated to:
see ``acl.py``). Errors leave through one table (``errors.from_loom``) as S3 XML.

What S3 keeps beside an object lives in the object's tags under ``s3.``: the ETag it
computed while the bytes streamed in (with the version it belongs to, so a file changed
behind loomfs's back never shows a stale ETag), the Content-Type and the user metadata.
Versioning is the namespace's (``hub.versions``): the gateway maps a bucket's state, its
versions and delete markers to S3's requests; a versionId is the namespace version.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import logging
import random
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from email.utils import parsedate_to_datetime
from pathlib import Path
from urllib.parse import quote, unquote

from aiohttp import ClientError, web
from prometheus_client import Counter

from ... import paths
from ...core.acl import ANONYMOUS
from ...core.catalog.base import UploadRecords
from ...core.metrics import REQUEST_SECONDS
from ...core.types import SPECIAL_KINDS, SYSTEM, Action, Entry, EntryKind, Principal, WriteTags
from ...core.users import UserRegistry
from ...errors import (
    AlreadyExists,
    DirectoryNotEmpty,
    InvalidPath,
    IsADirectory,
    LoomError,
    NotADirectory,
    NotFound,
    NotSupported,
    PermissionDenied,
)
from ...namespace import lifecycle as rules_of
from ...namespace import objectlock as nslock
from ...namespace.base import NULL_VERSION, VERSIONING_STATES, Namespace, Reader, Version
from ...namespace.governed import GovernedNamespace
from ...namespace.objectlock import Lock
from ...namespace.sse import Sealing
from ..http import parse_range, serve_reader
from . import (
    acl,
    checksums,
    cors,
    encryption,
    lifecycle,
    objectlock,
    policy,
    post,
    sigv2,
    sigv4,
    tagging,
)
from .errors import S3Error, error_xml, from_loom
from .listing import MARKER_TAG, Item, Lister, check_key
from .multipart import Part, Staging, Upload
from .xmlio import (
    MAX_DOCUMENT,
    Xml,
    child_text,
    document,
    el,
    http_time,
    iso_time,
    local,
    nodes,
    parse,
)
from .xmlio import url_encode as _enc

log = logging.getLogger(__name__)

REQUESTS = Counter("loomfs_s3_requests_total", "S3 requests", ["op", "status"])
BYTES_OUT = Counter("loomfs_s3_read_bytes_total", "Object bytes sent by the S3 gateway")
BYTES_IN = Counter("loomfs_s3_write_bytes_total", "Object bytes received by the S3 gateway")

TAG = "s3."
ETAG_TAG = "s3.etag"  # "<version> <quoted etag>"
META_TAG = "s3.meta."
OWNER_TAG = "s3.owner"  # of a bucket made by CreateBucket: who made it
LOCATION_TAG = "s3.location"  # the LocationConstraint it was made with
PARTS_TAG = "s3.parts"  # part sizes of a multipart object (valid with ETAG_TAG's version)
CHECKSUM_TAG = "s3.checksum"  # the additional checksum it came with (checksums.Kept)
PART_SUMS_TAG = "s3.part-checksums"  # a multipart object's parts' (valid as PARTS_TAG)
MAX_PARTS_TAG = 1024
STORED_HEADERS = ("content-type", "cache-control", "content-disposition", "content-encoding",
                  "content-language", "expires")  # fmt: skip
EMPTY_MD5 = f'"{hashlib.md5(b"").hexdigest()}"'
MAX_KEYS = 1000
# what GetObjectAttributes may be asked for (an object that came with no additional
# checksum has none: Checksum is answered by leaving it out, as S3 does)
OBJECT_ATTRIBUTES = frozenset({"ETag", "Checksum", "ObjectParts", "StorageClass", "ObjectSize"})
GiB = 1 << 30
TiB = 1 << 40
# subresources this gateway does not implement: answered NotImplemented rather than
# mistaken for a plain GET or PUT of the object or bucket
UNSUPPORTED = frozenset(
    {
        "policy",
        "cors",
        "lifecycle",
        "website",
        "tagging",
        "logging",
        "notification",
        "replication",
        "encryption",
        "object-lock",
        "retention",
        "legal-hold",
        "torrent",
        "restore",
        "select",
        "accelerate",
        "requestPayment",
        "analytics",
        "inventory",
        "metrics",
        "ownershipControls",
        "publicAccessBlock",
        "intelligent-tiering",
    }
)
# Bucket configurations no bucket here has. Clients read them to learn what a bucket does
# (s3fs asks for versioning before it removes a tree, consoles and the aws CLI for the
# rest), so reading one answers what S3 answers for a bucket without it, and deleting one
# is done; setting one stays NotImplemented. The error S3 gives for each that is missing:
ABSENT_CONFIG = {
    "lifecycle": ("NoSuchLifecycleConfiguration", "the lifecycle configuration does not exist"),
    "policy": ("NoSuchBucketPolicy", "the bucket policy does not exist"),
    "encryption": (
        "ServerSideEncryptionConfigurationNotFoundError",
        "the server side encryption configuration was not found",
    ),
    "publicAccessBlock": (
        "NoSuchPublicAccessBlockConfiguration",
        "the public access block configuration was not found",
    ),
    "ownershipControls": (
        "OwnershipControlsNotFoundError",
        "the bucket ownership controls were not found",
    ),
    "website": ("NoSuchWebsiteConfiguration", "the bucket does not have a website configuration"),
    "object-lock": (
        "ObjectLockConfigurationNotFoundError",
        "object lock configuration does not exist for this bucket",
    ),
    "replication": (
        "ReplicationConfigurationNotFoundError",
        "the replication configuration was not found",
    ),
}
# ... and those whose absence S3 answers with an empty document
EMPTY_CONFIG = {
    "logging": "BucketLoggingStatus",
    "notification": "NotificationConfiguration",
    "accelerate": "AccelerateConfiguration",
}
# Server-side encryption (SSE-S3, SSE-KMS, SSE-C, also for a copy's source) is the
# governed namespace's: over another namespace a request asking for it is refused, so a
# client never believes bytes are encrypted that are stored as they came
#: what a request that meets a delete marker is answered with, besides its error
MARKED = {"x-amz-delete-marker": "true"}
UNMARKED = {"x-amz-delete-marker": "false"}
SSE_PREFIXES = ("x-amz-server-side-encryption", "x-amz-copy-source-server-side-encryption")


@dataclass(slots=True)
class Call:
    """One authenticated request, parsed."""

    request: web.Request
    who: Principal
    auth: sigv4.Verified
    bucket: str
    key: str
    query: dict[str, str]
    op: str = "-"
    #: the version a write made in a versioning-enabled bucket, answered in its headers
    version_id: str | None = None
    #: how a write encrypted its object, answered in its headers
    sealing: Sealing | None = None

    @property
    def resource(self) -> str:
        return f"/{self.bucket}/{self.key}" if self.key else f"/{self.bucket}"


def _lowered(headers: Mapping[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


def _request_id() -> str:
    # unique, not secret: a getrandom() per request cost more than the rest of a small GET's
    # request parsing (profiled), so the Mersenne generator
    return f"{random.getrandbits(64):016X}"


def _split_query(raw: str) -> list[tuple[str, str]]:
    # not parse_qsl: '+' is a literal plus in S3 query strings, never a space
    pairs = []
    for part in raw.split("&"):
        if part:
            name, _, value = part.partition("=")
            pairs.append((unquote(name), unquote(value)))
    return pairs


def _header_time(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError):
        return None  # as AWS: an unparsable date is ignored


def _etag_matches(header: str, etag: str) -> bool:
    return any(t.strip() in ("*", etag, etag.strip('"')) for t in header.split(","))


def check_preconditions(
    get: Callable[[str], str | None], etag: str, mtime_ns: int, *, copy: bool = False
) -> int | None:
    """The status (412, or 304 for a GET) the conditional headers demand, or None.

    RFC 9110's order, which is also S3's: If-Match decides before If-Unmodified-Since,
    and If-None-Match before If-Modified-Since. ``get`` reads a header; with ``copy``
    the x-amz-copy-source-if-* family, where every failure is 412.
    """
    prefix = "x-amz-copy-source-" if copy else ""
    modified = mtime_ns // 1_000_000_000
    if_match = get(prefix + "if-match")
    if if_match is not None:
        if not _etag_matches(if_match, etag):
            return 412
    else:
        since = _header_time(get(prefix + "if-unmodified-since"))
        if since is not None and modified > since:
            return 412
    if_none = get(prefix + "if-none-match")
    if if_none is not None:
        if _etag_matches(if_none, etag):
            return 412 if copy else 304
    else:
        since = _header_time(get(prefix + "if-modified-since"))
        if since is not None and modified <= since:
            return 412 if copy else 304
    return None


class Tally:
    """Counts and hashes bytes on their way to a write, refusing more than ``limit``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.size = 0
        self.md5 = hashlib.md5()

    async def through(self, data: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        async for chunk in data:
            self.size += len(chunk)
            if self.size > self.limit:
                raise S3Error("EntityTooLarge", f"the upload exceeds {self.limit} bytes")
            self.md5.update(chunk)
            yield chunk

    @property
    def etag(self) -> str:
        return f'"{self.md5.hexdigest()}"'


def object_etag(entry: Entry, tags: Mapping[str, str]) -> str:
    """The ETag S3 computed when the object came through it, if it is still that version;
    otherwise a value that is stable for this content version (files that arrived by
    another road: posix tools, assimilation)."""
    if entry.is_dir:
        return EMPTY_MD5
    version, _, etag = tags.get(ETAG_TAG, "").partition(" ")
    if etag and version == str(entry.version):
        return etag
    seed = f"{entry.version}:{entry.etag or ''}:{entry.size}".encode()
    return f'"{hashlib.md5(seed).hexdigest()}"'


def encode_parts(sizes: list[int]) -> str:
    """Part sizes, run-length encoded ('5242880*3,1048576'): uploads use equal parts."""
    runs: list[list[int]] = []
    for size in sizes:
        if runs and runs[-1][0] == size:
            runs[-1][1] += 1
        else:
            runs.append([size, 1])
    return ",".join(f"{size}*{count}" if count > 1 else str(size) for size, count in runs)


def parts_of(entry: Entry, tags: Mapping[str, str]) -> list[int]:
    """The sizes of the parts an object was uploaded in; one part unless multipart."""
    layout = tags.get(PARTS_TAG)
    if layout is None or tags.get(ETAG_TAG, "").partition(" ")[0] != str(entry.version):
        if object_etag(entry, tags).rstrip('"').rpartition("-")[1]:
            raise S3Error("NotImplemented", "the part layout of this object is not known")
        return [entry.size]
    sizes: list[int] = []
    for run in layout.split(","):
        size, _, count = run.partition("*")
        sizes += [int(size)] * int(count or 1)
    return sizes


def part_checksums(entry: Entry, tags: Mapping[str, str]) -> list[str]:
    """The checksums of a multipart object's parts, in order; none where not known."""
    if tags.get(ETAG_TAG, "").partition(" ")[0] != str(entry.version):
        return []
    return [v for v in tags.get(PART_SUMS_TAG, "").split(",") if v]


def part_window(number: int, entry: Entry, tags: Mapping[str, str]) -> tuple[int, int]:
    sizes = parts_of(entry, tags)
    if not 1 <= number <= len(sizes):
        raise S3Error("InvalidPart", f"the object has {len(sizes)} parts, not {number}")
    return sum(sizes[: number - 1]), sizes[number - 1]


def _stored_meta(headers: Mapping[str, str]) -> dict[str, str]:
    """The tags that keep a request's Content-Type, x-amz-meta-* and x-amz-tagging."""
    tags = tagging.from_header(headers.get("x-amz-tagging"))
    tags |= {f"{TAG}{name}": headers[name] for name in STORED_HEADERS if name in headers}
    # aws-chunked is the upload's framing, not a coding of the stored object
    codings = [c.strip() for c in tags.pop(f"{TAG}content-encoding", "").split(",")]
    if kept := ", ".join(c for c in codings if c and c != "aws-chunked"):
        tags[f"{TAG}content-encoding"] = kept
    for name, value in headers.items():
        if name.startswith("x-amz-meta-"):
            tags[META_TAG + name[len("x-amz-meta-") :]] = value
    return tags


def _meta_headers(tags: Mapping[str, str]) -> dict[str, str]:
    out = {"Content-Type": tags.get(f"{TAG}content-type", "binary/octet-stream")}
    for name in STORED_HEADERS[1:]:
        if f"{TAG}{name}" in tags:
            out[name.title()] = tags[f"{TAG}{name}"]
    for key, value in tags.items():
        if key.startswith(META_TAG):
            out["x-amz-meta-" + key[len(META_TAG) :]] = value
    if count := len(tagging.of(tags)):
        out["x-amz-tagging-count"] = str(count)
    return out


def _int_param(value: str | None, name: str, default: int) -> int:
    if value is None or value == "":
        return default
    try:
        number = int(value)
    except ValueError:
        raise S3Error("InvalidArgument", f"{name} must be an integer") from None
    if number < 0:
        raise S3Error("InvalidArgument", f"{name} must not be negative")
    return number


class S3Gateway:
    def __init__(
        self,
        namespace: Namespace,
        users: UserRegistry,
        buckets: Mapping[str, str],
        *,
        staging: Path,
        uploads: UploadRecords,
        region: str = "us-east-1",
        bucket_root: str | None = None,
        anonymous: bool = False,
        site: str = "hub",
        max_object_size: int = 5 * GiB,
        max_part_size: int = 5 * GiB,
        max_upload_size: int = 5 * TiB,
        clock: Callable[[], float] = time.time,
        lifecycle_day: float = rules_of.DAY_S,
    ) -> None:
        self.ns = namespace
        #: the namespace's access rules, where it keeps them: S3 ACLs are translated to them
        self.rules = namespace if isinstance(namespace, GovernedNamespace) else None
        if self.rules is not None and self.rules.rules is None:
            self.rules = None
        #: the namespace that encrypts (``namespace.sse``), where it is the governed one
        self.sealer = namespace if isinstance(namespace, GovernedNamespace) else None
        self.anonymous = anonymous
        self.users = users
        self.buckets = {name: paths.normalize(path) for name, path in buckets.items()}
        self.bucket_root = paths.normalize(bucket_root) if bucket_root else None
        self.staging = Staging(staging, uploads)
        self.site = site
        self.max_object_size = max_object_size
        self.max_part_size = max_part_size
        self.max_upload_size = max_upload_size
        self.verifier = sigv4.Verifier(region, clock)
        self.region = region
        self.lifecycle_day = lifecycle_day
        #: whether each bucket has object lock, as last seen (a write into one without
        #: asks nothing more): this gateway is what enables it, and it is never disabled
        self._lock_enabled: dict[str, bool] = {}
        #: buckets' lifecycle rules, for x-amz-expiration (kept as ``_versioning`` is)
        self._rules: dict[str, list[rules_of.Rule]] = {}
        #: each bucket's versioning state as the namespace last said (this gateway is what
        #: sets it): a PUT or DELETE in an unversioned bucket asks no more than before
        self._versioning: dict[str, str | None] = {}

    def app(self) -> web.Application:
        # bodies stream; client_max_size bounds only what aiohttp itself would buffer
        app = web.Application(client_max_size=MAX_DOCUMENT)
        app.router.add_route("*", "/{tail:.*}", self.handle, expect_handler=self._expect)
        return app

    # -- the edge: authenticate, dispatch, map errors ---------------------------------------

    async def handle(self, request: web.Request) -> web.StreamResponse:
        began = time.perf_counter()
        request_id = _request_id()
        raw_path, _, raw_query = request.raw_path.partition("?")
        path = unquote(raw_path)
        bucket, _, key = path.lstrip("/").partition("/")
        resource = path
        op = "-"
        try:
            if request.method == "OPTIONS":
                op = "preflight"
                response: web.StreamResponse = await self.preflight(request, bucket)
            elif _is_form_post(request, key):
                op = "post_object"  # signed in its form, not its headers
                response = await self.post_object(request, bucket)
            else:
                query = _split_query(raw_query)
                headers = {k.lower(): v for k, v in request.headers.items()}
                auth, who = await self._authenticate(request, query, headers)
                call = Call(request, who, auth, bucket, key, dict(query))
                response = await self._dispatch(call)
                op = call.op
        except S3Error as exc:
            response = self._error(request, exc, resource, request_id)
        except LoomError as exc:
            response = self._error(request, from_loom(exc, resource), resource, request_id)
        except ConnectionResetError:
            raise  # the client went away: nobody is left to answer
        except Exception:
            log.exception("unexpected error", extra={"path": path, "request_id": request_id})
            error = S3Error("InternalError", "internal error, see the server log")
            response = self._error(request, error, resource, request_id)
        origin = request.headers.get("Origin")
        if origin is not None and bucket and request.method != "OPTIONS":
            # a browser's cross-origin request: what the bucket's CORS rules let it read
            with contextlib.suppress(S3Error, LoomError):
                method = request.headers.get("Access-Control-Request-Method", request.method)
                rule = cors.matching(await self._cors_rules(bucket), origin, method, [])
                if rule is not None:
                    response.headers.update(rule.answer(origin, []))
        response.headers.setdefault("x-amz-request-id", request_id)
        REQUESTS.labels(op, str(response.status)).inc()
        REQUEST_SECONDS.labels("s3", op).observe(time.perf_counter() - began)
        return response

    async def _expect(self, request: web.Request) -> web.Response | None:
        """Expect: 100-continue is answered only once the signature is good, so that a
        refused client does not send its body for nothing (as S3: the error comes
        instead of 100). Any other expectation is ignored, as S3 does (aiohttp's default
        would answer 417)."""
        if request.headers.get("Expect", "").lower() != "100-continue":
            return None
        raw_path, _, raw_query = request.raw_path.partition("?")
        if _is_form_post(request, unquote(raw_path).lstrip("/").partition("/")[2]):
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            return None  # its signature is in the body
        headers = {k.lower(): v for k, v in request.headers.items()}
        try:
            await self._authenticate(request, _split_query(raw_query), headers)
        except S3Error as exc:
            request_id = _request_id()
            response = self._error(request, exc, unquote(raw_path), request_id)
            response.headers["x-amz-request-id"] = request_id
            # the body the client holds back would otherwise be read as the next request
            response.force_close()
            return response
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        return None

    def _error(
        self, request: web.Request, exc: S3Error, resource: str, request_id: str
    ) -> web.Response:
        level = logging.ERROR if exc.status >= 500 else logging.WARNING
        log.log(
            level,
            "s3 request refused",
            extra={
                "code": exc.code,
                "method": request.method,
                "path": resource,
                "remote": request.remote,
                "reason": exc.message,
                "request_id": request_id,
                # what the client is not told about a server-side failure
                "cause": repr(exc.__cause__) if exc.status >= 500 and exc.__cause__ else None,
            },
        )
        exc.resource = exc.resource or resource
        if request.method == "HEAD" or exc.status == 304:
            return web.Response(status=exc.status, headers=exc.headers)
        body = error_xml(exc, request_id)
        return web.Response(
            status=exc.status, body=body, content_type="application/xml", headers=exc.headers
        )

    def _key_lookup(self) -> tuple[post.SecretLookup, dict[str, Principal]]:
        """A function from an access key to its secret, and where it leaves the key's
        user as a principal ('who')."""
        found: dict[str, Principal] = {}

        async def lookup(access_key: str) -> str | None:
            hit = await self.users.lookup_access_key(access_key)
            if hit is None:
                return None
            user, secret = hit
            found["who"] = user.principal("s3", self.site)
            return secret

        return lookup, found

    async def _authenticate(
        self, request: web.Request, query: list[tuple[str, str]], headers: dict[str, str]
    ) -> tuple[sigv4.Verified, Principal]:
        lookup, found = self._key_lookup()
        raw_path, _, raw_query = request.raw_path.partition("?")
        if self.anonymous and not _signed(headers, query):
            unsigned = sigv4.Verified("", sigv4.UNSIGNED, "", "", "", b"")
            return unsigned, Principal(ANONYMOUS, site=self.site, protocol="s3")
        if sigv2.is_v2(headers, dict(query)):
            auth = await sigv2.verify(
                request.method, raw_path, raw_query, headers, lookup, self.verifier.clock()
            )
        else:
            auth = await self.verifier.verify(
                request.method, unquote(raw_path), query, headers, lookup
            )
        return auth, found["who"]

    async def _dispatch(self, c: Call) -> web.StreamResponse:
        method, q = c.request.method, c.query
        sse = sorted(h.lower() for h in c.request.headers if h.lower().startswith(SSE_PREFIXES))
        if sse and self.sealer is None:
            raise S3Error(
                "NotImplemented",
                f"server-side encryption is not supported ({sse[0]}): this gateway's "
                "namespace is not the governed one, which encrypts",
            )
        handler: Callable[[Call], Awaitable[web.StreamResponse]] | None
        config = (ABSENT_CONFIG.keys() | EMPTY_CONFIG.keys()) & q.keys()
        if "encryption" in q and c.bucket and not c.key and self.sealer is not None:
            handler = {
                "GET": self.get_encryption,
                "PUT": self.put_encryption,
                "DELETE": self.delete_encryption,
            }.get(method)
        elif "cors" in q and c.bucket and not c.key:
            handler = {
                "GET": self.get_cors,
                "PUT": self.put_cors,
                "DELETE": self.delete_cors,
            }.get(method)
        elif "lifecycle" in q and c.bucket and not c.key:
            handler = {
                "GET": self.get_lifecycle,
                "PUT": self.put_lifecycle,
                "DELETE": self.delete_lifecycle,
            }.get(method)
        elif "object-lock" in q and c.bucket and not c.key:
            handler = {"GET": self.get_lock_config, "PUT": self.put_lock_config}.get(method)
        elif ("retention" in q or "legal-hold" in q) and c.key:
            handler = {"GET": self.get_lock, "PUT": self.put_lock}.get(method)
        elif "versioning" in q and c.bucket and not c.key:
            handler = {"GET": self.get_versioning, "PUT": self.put_versioning}.get(method)
        elif "policy" in q and c.bucket and not c.key and self.rules is not None:
            handler = {
                "GET": self.get_policy,
                "PUT": self.put_policy,
                "DELETE": self.delete_policy,
            }.get(method)
        elif "publicAccessBlock" in q and c.bucket and not c.key and self.rules is not None:
            handler = {
                "GET": self.get_public_block,
                "PUT": self.put_public_block,
                "DELETE": self.delete_public_block,
            }.get(method)
        elif "policyStatus" in q and c.bucket and not c.key and self.rules is not None:
            handler = {"GET": self.get_policy_status}.get(method)
        elif "tagging" in q and c.bucket:
            handler = {
                "GET": self.get_tagging,
                "PUT": self.put_tagging,
                "DELETE": self.delete_tagging,
            }.get(method)
        elif config and c.bucket and not c.key and method != "PUT":
            handler = {
                "GET": self.get_bucket_config,
                "DELETE": self.delete_bucket_config if config <= ABSENT_CONFIG.keys() else None,
            }.get(method)
        elif UNSUPPORTED & q.keys():
            raise S3Error("NotImplemented", f"{sorted(UNSUPPORTED & q.keys())[0]} is not supported")
        elif "acl" in q and c.bucket:
            handler = {"GET": self.get_acl, "PUT": self.put_acl}.get(method)
        elif not c.bucket:
            handler = {"GET": self.list_buckets}.get(method)
        elif not c.key:
            handler = {
                "GET": self.get_bucket,
                "HEAD": self.head_bucket,
                "PUT": self.create_bucket,
                "DELETE": self.delete_bucket,
                "POST": self.delete_objects if "delete" in q else None,
            }.get(method)
        elif "uploadId" in q:
            handler = {
                "GET": self.list_parts,
                "PUT": self.upload_part,
                "POST": self.complete_upload,
                "DELETE": self.abort_upload,
            }.get(method)
        else:
            handler = {
                "GET": self.get_object_attributes if "attributes" in q else self.get_object,
                "HEAD": self.get_object,
                "PUT": self.copy_object
                if "x-amz-copy-source" in c.request.headers
                else self.put_object,
                "DELETE": self.delete_object,
                "POST": self.create_upload if "uploads" in q else None,
            }.get(method)
        if handler is None:
            raise S3Error("MethodNotAllowed", f"{method} is not allowed on this resource")
        c.op = handler.__name__
        if c.key:
            check_key(c.key)
        # a canned ACL S3 does not know is an error on every request that may carry one;
        # one it knows, on a create, is not applied (see acl.py) but does not fail it
        canned = acl.check_canned(c.request.headers.get("x-amz-acl"))
        if canned is not None and c.key and method in ("PUT", "POST") and self.rules is not None:
            # before the write: a public access block refuses the object, not only its ACL
            subjects = {s for s, _ in acl.canned(canned, bucket=False)}
            await self.rules.check_public_grants(self.object_path(c), subjects)
        if handler != self.create_bucket:
            await self._check_owner(c, "x-amz-expected-bucket-owner")
        response = await handler(c)
        if c.version_id is not None:
            response.headers["x-amz-version-id"] = c.version_id
        return response

    async def _check_owner(self, c: Call, header: str) -> None:
        """AccessDenied unless the bucket's owner is the one a request's header expects
        (a guard clients set against writing into a bucket someone else re-created)."""
        expected = c.request.headers.get(header)
        if expected is not None and c.bucket and expected != await self._bucket_owner(c):
            raise S3Error("AccessDenied", f"the bucket is not owned by the {header}")

    # -- buckets --------------------------------------------------------------------------

    def bucket_dir(self, bucket: str) -> str:
        if bucket in self.buckets:
            return self.buckets[bucket]
        if self.bucket_root is not None and _valid_bucket_name(bucket):
            return paths.join(self.bucket_root, bucket)
        raise S3Error("NoSuchBucket", "the specified bucket does not exist", resource=f"/{bucket}")

    async def _bucket_entry(self, c: Call) -> str:
        folder = self.bucket_dir(c.bucket)
        try:
            entry = await self.ns.stat(c.who, folder)
        except NotFound:
            raise S3Error("NoSuchBucket", "the specified bucket does not exist") from None
        if not entry.is_dir:
            raise S3Error("NoSuchBucket", "the specified bucket does not exist")
        return folder

    def object_path(self, c: Call, key: str | None = None) -> str:
        return self.bucket_dir(c.bucket) + "/" + (c.key if key is None else key)

    async def list_buckets(self, c: Call) -> web.Response:
        # a bucket that isn't there (yet) or that the caller may not see is left out: one
        # such bucket must not fail the whole listing
        found: dict[str, int] = {}
        for name, folder in self.buckets.items():
            with contextlib.suppress(NotFound, PermissionDenied):
                found[name] = (await self.ns.stat(c.who, folder)).mtime_ns
        if self.bucket_root is not None:
            # as S3: the buckets the caller owns, not those others let them see
            with contextlib.suppress(NotFound, PermissionDenied):
                async for entry in self.ns.list(c.who, self.bucket_root):
                    if entry.is_dir and _valid_bucket_name(entry.name):
                        with contextlib.suppress(NotFound, PermissionDenied):
                            tags = await self.ns.get_tags(c.who, entry.path)
                            if tags.get(OWNER_TAG) in (None, c.who.user):
                                found.setdefault(entry.name, entry.mtime_ns)
        after = c.query.get("continuation-token", "")
        prefix = c.query.get("prefix", "")
        limit = _int_param(c.query.get("max-buckets"), "max-buckets", 10000) or 10000
        names = [n for n in sorted(found) if n > after and n.startswith(prefix)]
        shown = names[:limit]
        buckets = [
            el("Bucket", el("Name", name), el("CreationDate", iso_time(found[name])))
            for name in shown
        ]
        return _xml(
            document(
                "ListAllMyBucketsResult",
                self._owner(c),
                el("Buckets", nodes(buckets)),
                el("ContinuationToken", shown[-1]) if len(names) > limit else None,
                el("Prefix", prefix) if prefix else None,
            )
        )

    async def _bucket_owner(self, c: Call) -> str:
        """Who owns the bucket, and so every object in it (the namespace keeps no owner
        per file): who created it, or for a configured bucket the caller."""
        tags = await self.ns.get_tags(c.who, await self._bucket_entry(c))
        return tags.get(OWNER_TAG) or c.who.user

    def _owner(self, c: Call, owner: str | None = None) -> Xml:
        owner = owner or c.who.user
        return el("Owner", el("ID", owner), el("DisplayName", owner))

    async def get_acl(self, c: Call) -> web.Response:
        path = (await self._object(c))[0].path if c.key else await self._bucket_entry(c)
        rules: acl.Grants = frozenset()
        if self.rules is not None:
            rules = (await self.rules.access(c.who, path))[0]
        owner = await self._bucket_owner(c)
        return _xml(acl.policy_xml(owner, rules, bucket=not c.key))

    async def put_acl(self, c: Call) -> web.Response:
        path = (await self._object(c))[0].path if c.key else await self._bucket_entry(c)
        owner = await self._bucket_owner(c)
        headers = {k.lower(): v for k, v in c.request.headers.items()}
        body = await _read_document(c.request)
        await self._apply_acl(c, path, acl.requested(headers, body, owner, bucket=not c.key))
        return web.Response()

    async def _apply_acl(self, c: Call, path: str, grants: acl.Grants) -> None:
        """Make ``grants`` the rules on a bucket's or an object's path. A bucket made
        here keeps its creator's admin and stays private; a configured bucket's rules are
        its administrator's, only added to."""
        if self.rules is None:
            if grants:
                raise S3Error("NotImplemented", "this gateway's namespace keeps no access rules")
            return
        if c.key:
            await self.rules.set_access(c.who, path, grants)
            return
        creator = (await self.ns.get_tags(c.who, path)).get(OWNER_TAG)
        if creator is None:
            kept, _ = await self.rules.access(c.who, path)
            await self.rules.set_access(c.who, path, kept | grants)
            return
        owned = grants | {(f"user:{creator}", Action.ADMIN)}
        await self.rules.set_access(c.who, path, owned, private=True)

    async def _acl_on_create(self, c: Call, path: str, canned: str | None = None) -> None:
        """Apply the canned ACL a create carries (x-amz-acl, or ``canned`` where it comes
        another way); 'private' and none leave the rules as they are."""
        name = acl.check_canned(canned or c.request.headers.get("x-amz-acl"))
        grants = acl.canned(name, bucket=not c.key) if name is not None else frozenset()
        if grants:
            await self._apply_acl(c, path, grants)

    async def get_bucket_config(self, c: Call) -> web.Response:
        await self._bucket_entry(c)
        name = min((ABSENT_CONFIG.keys() | EMPTY_CONFIG.keys()) & c.query.keys())
        if name in EMPTY_CONFIG:
            return _xml(document(EMPTY_CONFIG[name]))
        raise S3Error(*ABSENT_CONFIG[name])

    async def delete_bucket_config(self, c: Call) -> web.Response:
        await self._bucket_entry(c)  # none is kept: deleting it is done
        return web.Response(status=204)

    async def _tagged(self, c: Call) -> tuple[str, dict[str, str]]:
        """The path whose tags hold the tag set (the object's or the bucket's), and its tags."""
        if c.key:
            entry, tags = await self._object(c)
            return entry.path, tags
        folder = await self._bucket_entry(c)
        return folder, await self.ns.get_tags(c.who, folder)

    async def get_tagging(self, c: Call) -> web.Response:
        _, tags = await self._tagged(c)
        if not c.key and not tagging.of(tags):
            raise S3Error("NoSuchTagSet", "the TagSet does not exist")
        return _xml(tagging.as_xml(tags))

    async def put_tagging(self, c: Call) -> web.Response:
        limit = tagging.MAX_OBJECT_TAGS if c.key else tagging.MAX_BUCKET_TAGS
        new = tagging.from_xml(await _read_document(c.request), limit)
        path, _ = await self._tagged(c)
        await self._set_s3_tags(c, path, new, tagging.PREFIX)
        return web.Response()

    async def delete_tagging(self, c: Call) -> web.Response:
        path, _ = await self._tagged(c)
        await self._set_s3_tags(c, path, {}, tagging.PREFIX)
        return web.Response(status=204)

    async def _policy_bucket(self, c: Call) -> tuple[GovernedNamespace, str]:
        # as SYSTEM: a Deny may take the bucket's metadata from its owner, never its policy
        folder = self.bucket_dir(c.bucket)
        with contextlib.suppress(NotFound):
            if (await self.ns.stat(SYSTEM, folder)).is_dir and self.rules is not None:
                return self.rules, folder
        raise S3Error("NoSuchBucket", "the specified bucket does not exist")

    async def get_policy(self, c: Call) -> web.Response:
        rules, folder = await self._policy_bucket(c)
        document = await rules.bucket_policy(c.who, folder)
        if document is None:
            raise S3Error(*ABSENT_CONFIG["policy"])
        return web.Response(body=document.encode(), content_type="application/json")

    async def put_policy(self, c: Call) -> web.Response:
        rules, folder = await self._policy_bucket(c)
        body = await c.request.content.read(policy.MAX_SIZE + 1)
        if policy.allows_everyone(body):  # a public access block refuses it as it is
            await rules.check_public_grants(folder, {policy.EVERYONE_SUBJECT}, "policy")
        document, made = policy.translate(body, c.bucket, folder)
        await rules.set_bucket_policy(c.who, folder, document, made)
        return web.Response(status=204)

    async def get_policy_status(self, c: Call) -> web.Response:
        rules, folder = await self._policy_bucket(c)
        return _xml(policy.status_xml(await rules.bucket_public(c.who, folder)))

    async def delete_policy(self, c: Call) -> web.Response:
        rules, folder = await self._policy_bucket(c)
        await rules.set_bucket_policy(c.who, folder, None)
        return web.Response(status=204)

    async def get_public_block(self, c: Call) -> web.Response:
        rules, folder = await self._policy_bucket(c)
        block = await rules.public_block(c.who, folder)
        if block is None:
            raise S3Error(*ABSENT_CONFIG["publicAccessBlock"])
        return _xml(policy.public_block_xml(block))

    async def put_public_block(self, c: Call) -> web.Response:
        rules, folder = await self._policy_bucket(c)
        block = policy.public_block_from_xml(await _read_document(c.request))
        await rules.set_public_block(c.who, folder, block)
        return web.Response()

    async def delete_public_block(self, c: Call) -> web.Response:
        rules, folder = await self._policy_bucket(c)
        await rules.set_public_block(c.who, folder, None)
        return web.Response(status=204)

    async def get_cors(self, c: Call) -> web.Response:
        rules = cors.of(await self.ns.get_tags(c.who, await self._bucket_entry(c)))
        if not rules:
            raise S3Error("NoSuchCORSConfiguration", "the CORS configuration does not exist")
        return _xml(cors.as_xml(rules))

    async def put_cors(self, c: Call) -> web.Response:
        rules = cors.from_xml(await _read_document(c.request))
        await self._set_s3_tags(c, await self._bucket_entry(c), cors.as_tags(rules), cors.PREFIX)
        return web.Response()

    async def delete_cors(self, c: Call) -> web.Response:
        await self._set_s3_tags(c, await self._bucket_entry(c), {}, cors.PREFIX)
        return web.Response(status=204)

    async def get_lifecycle(self, c: Call) -> web.Response:
        rules = rules_of.of(await self.ns.get_tags(c.who, await self._bucket_entry(c)))
        if not rules:
            raise S3Error(*ABSENT_CONFIG["lifecycle"])
        return _xml(lifecycle.as_xml(rules))

    async def put_lifecycle(self, c: Call) -> web.Response:
        rules = lifecycle.from_xml(await _read_document(c.request))
        folder = await self._bucket_entry(c)
        await self._set_s3_tags(c, folder, rules_of.as_tags(rules), rules_of.PREFIX)
        self._rules[c.bucket] = rules
        return web.Response()

    async def delete_lifecycle(self, c: Call) -> web.Response:
        await self._set_s3_tags(c, await self._bucket_entry(c), {}, rules_of.PREFIX)
        self._rules[c.bucket] = []
        return web.Response(status=204)

    async def get_encryption(self, c: Call) -> web.Response:
        assert self.sealer is not None
        sealing = await self.sealer.default_sealing(c.who, await self._bucket_entry(c))
        if sealing is None:
            raise S3Error(*ABSENT_CONFIG["encryption"])
        return _xml(encryption.config_xml(sealing))

    async def put_encryption(self, c: Call) -> web.Response:
        assert self.sealer is not None
        sealing = encryption.config_of(await _read_document(c.request))
        folder = await self._bucket_entry(c)
        await self.sealer.set_default_sealing(c.who, folder, sealing)
        return web.Response()

    async def delete_encryption(self, c: Call) -> web.Response:
        assert self.sealer is not None
        await self.sealer.set_default_sealing(c.who, await self._bucket_entry(c), None)
        return web.Response(status=204)

    async def _expiration(self, c: Call, entry: Entry, tags: dict[str, str]) -> dict[str, str]:
        """The x-amz-expiration header of the call's (current) object; {} if no rule
        expires it. Its days are S3's (a hub run with a shortened ``lifecycle_day``, for
        a test, expires sooner than it says, as RGW's debug interval does). The rules are
        read as the system, as a preflight's are: anyone who may read the object may
        learn when it goes."""
        if c.bucket not in self._rules:
            folder = self.bucket_dir(c.bucket)
            self._rules[c.bucket] = rules_of.of(await self.ns.get_tags(SYSTEM, folder))
        header = lifecycle.expiration_header(
            self._rules[c.bucket], c.key, entry.size, tags, entry.mtime_ns
        )
        return {} if header is None else {"x-amz-expiration": header}

    def _bucket_of(self, folder: str) -> str | None:
        """The bucket whose directory ``folder`` is, if one is."""
        named = next((name for name, path in self.buckets.items() if path == folder), None)
        if named is not None or self.bucket_root is None:
            return named
        parent, name = paths.split(folder)
        return name if parent == self.bucket_root and _valid_bucket_name(name) else None

    async def expire_uploads(self, folder: str, rules: list[rules_of.Rule], now: float) -> None:
        """The hub's lifecycle hook: abort the uploads a rule's AbortIncompleteMultipart
        Upload says are too old (the hub's ``lifecycle_day`` is a day here too)."""
        bucket = self._bucket_of(folder)
        timed = [r for r in rules if r.abort_days is not None]
        if bucket is None or not timed:
            return
        for upload in await self.staging.uploads(bucket):
            for rule in timed:
                assert rule.abort_days is not None
                due = upload.initiated_ns / 1e9 + rule.abort_days * self.lifecycle_day
                if upload.key.startswith(rule.prefix) and now >= due:
                    await self.staging.remove(upload)
                    log.info("upload expired", extra={"path": folder, "key": upload.key})
                    break

    # -- object lock (the namespace's: namespace.objectlock) ---------------------------------

    async def _locked_bucket(self, c: Call) -> tuple[str, dict[str, str]]:
        """The bucket's directory and tags; InvalidRequest unless it has object lock."""
        folder = await self._bucket_entry(c)
        tags = await self.ns.get_tags(c.who, folder)
        self._lock_enabled[c.bucket] = nslock.ENABLED in tags
        if nslock.ENABLED not in tags:
            raise S3Error("InvalidRequest", "the bucket has no object lock configuration")
        return folder, tags

    async def get_lock_config(self, c: Call) -> web.Response:
        tags = await self.ns.get_tags(c.who, await self._bucket_entry(c))
        if nslock.ENABLED not in tags:
            raise S3Error(*ABSENT_CONFIG["object-lock"])
        return _xml(objectlock.configuration_xml(tags))

    async def put_lock_config(self, c: Call) -> web.Response:
        folder = await self._bucket_entry(c)
        tags = objectlock.configuration_from_xml(await _read_document(c.request))
        if await self.ns.versioning(c.who, folder) != "Enabled":
            raise S3Error("InvalidBucketState", "object lock needs versioning Enabled")
        await self.ns.set_tags(c.who, folder, tags)
        self._lock_enabled[c.bucket] = True
        return web.Response()

    async def _lock_target(self, c: Call) -> tuple[str, str | None, Lock]:
        """(path, version id or None for the current one, its lock now)."""
        await self._locked_bucket(c)
        path = paths.normalize(self.object_path(c))
        vid = c.query.get("versionId")
        if vid is None:
            return path, None, Lock.of(await self.ns.get_tags(c.who, path))
        version = await self._version(c, vid)
        if version is None or version.marker:
            raise S3Error("NoSuchVersion", "the specified version does not exist")
        return path, vid, Lock.of(version.tags)

    async def get_lock(self, c: Call) -> web.Response:
        _, _, lock = await self._lock_target(c)
        if "legal-hold" in c.query:
            return _xml(objectlock.legal_hold_xml(lock))
        return _xml(objectlock.retention_xml(lock))

    async def put_lock(self, c: Call) -> web.Response:
        path, vid, old = await self._lock_target(c)
        body = await _read_document(c.request)
        if "legal-hold" in c.query:
            new = objectlock.legal_hold_from_xml(body, old)
        else:
            new = objectlock.retention_from_xml(body, old)
        await self.ns.set_lock(c.who, path, vid, new, bypass=_bypass(c))
        return web.Response()

    async def _new_lock(self, c: Call, asked: Lock | None) -> dict[str, str]:
        """The lock tags a new object gets, written with its content: those ``asked``
        (its x-amz-object-lock-* headers), else the bucket's default retention."""
        if asked is None and self._lock_enabled.get(c.bucket) is False:
            return {}  # known to have no object lock: no catalog trip
        tags = await self.ns.get_tags(c.who, await self._bucket_entry(c))
        self._lock_enabled[c.bucket] = nslock.ENABLED in tags
        if nslock.ENABLED not in tags:
            if asked is not None:
                raise S3Error("InvalidRequest", "the bucket has no object lock configuration")
            return {}
        lock = objectlock.with_default(asked, tags)
        return {} if lock is None else lock.as_tags()

    async def _cors_rules(self, bucket: str) -> list[cors.Rule]:
        """A bucket's CORS rules, read for a browser that has not (yet) said who it is:
        as the system, since S3 answers a preflight before any signature; only the
        rules leave this method, which anyone may learn by asking."""
        return cors.of(await self.ns.get_tags(SYSTEM, self.bucket_dir(bucket)))

    async def preflight(self, request: web.Request, bucket: str) -> web.Response:
        """A browser's CORS preflight (OPTIONS): allowed by the bucket's first rule that
        allows the origin, the method and the headers, or refused."""
        origin = request.headers.get("Origin")
        method = request.headers.get("Access-Control-Request-Method")
        if origin is None or method is None:
            raise S3Error(
                "BadRequest", "a preflight needs Origin and Access-Control-Request-Method"
            )
        try:
            rules = await self._cors_rules(bucket) if bucket else []
        except NotFound:
            rules = []
        if not rules:
            raise S3Error("AccessForbidden", "CORS is not enabled for this bucket")
        requested = cors.requested_headers(request.headers.get("Access-Control-Request-Headers"))
        rule = cors.matching(rules, origin, method, requested)
        if rule is None:
            raise S3Error("AccessForbidden", "this CORS request is not allowed")
        return web.Response(headers=rule.answer(origin, requested))

    async def head_bucket(self, c: Call) -> web.Response:
        await self._bucket_entry(c)
        return web.Response(headers={"x-amz-bucket-region": self.region})

    async def create_bucket(self, c: Call) -> web.Response:
        if c.bucket not in self.buckets and not _valid_bucket_name(c.bucket):
            raise S3Error("InvalidBucketName", "the specified bucket is not valid")
        folder = self.bucket_dir(c.bucket)
        if c.bucket in self.buckets or self.bucket_root is None:
            if await self.ns.exists(c.who, folder):
                raise S3Error("BucketAlreadyOwnedByYou", "the bucket exists and is configured")
            raise S3Error("AccessDenied", "buckets are configured, not created, here")
        location = ""
        body = await _read_document(c.request)
        if body.strip():
            location = child_text(parse(body), "LocationConstraint") or ""
        try:
            if self.rules is not None:
                await self.rules.mkdir_owned(c.who, folder)
            else:
                await self.ns.mkdir(c.who, folder)
        except AlreadyExists:
            try:
                owner = (await self.ns.get_tags(c.who, folder)).get(OWNER_TAG)
            except PermissionDenied:
                owner = ""  # not the caller's to see: someone else's
            if owner is not None and owner != c.who.user:
                raise S3Error("BucketAlreadyExists", "the bucket belongs to someone else") from None
            # us-east-1 answers a repeated create with success, every other region not
            if self.region != "us-east-1":
                raise S3Error("BucketAlreadyOwnedByYou", "you already own this bucket") from None
            return web.Response(headers={"Location": f"/{c.bucket}"})
        made = {OWNER_TAG: c.who.user, LOCATION_TAG: location}
        locked = c.request.headers.get("x-amz-bucket-object-lock-enabled", "").lower() == "true"
        if locked:  # versioned for good (namespace.objectlock)
            await self.ns.set_versioning(c.who, folder, "Enabled")
            made[nslock.ENABLED] = "Enabled"
        self._versioning.pop(c.bucket, None)
        self._rules.pop(c.bucket, None)
        self._lock_enabled[c.bucket] = locked
        await self.ns.set_tags(c.who, folder, made)
        await self._acl_on_create(c, folder)
        return web.Response(headers={"Location": f"/{c.bucket}"})

    async def delete_bucket(self, c: Call) -> web.Response:
        self._versioning.pop(c.bucket, None)
        self._rules.pop(c.bucket, None)
        self._lock_enabled.pop(c.bucket, None)
        folder = await self._bucket_entry(c)
        if c.bucket in self.buckets:
            raise S3Error("AccessDenied", "a configured bucket cannot be deleted over S3")
        if await self.ns.versioning(c.who, folder) is not None and await self.ns.versions(
            c.who, folder
        ):  # as S3: kept versions and delete markers are the bucket's content too
            raise S3Error("BucketNotEmpty", "the bucket you tried to delete has versions")
        try:
            await self.ns.remove(c.who, folder)
        except DirectoryNotEmpty:
            raise S3Error("BucketNotEmpty", "the bucket you tried to delete is not empty") from None
        if self.rules is not None:  # a bucket made anew under this name starts afresh
            await self.rules.forget_access(c.who, folder)
        return web.Response(status=204)

    async def get_bucket(self, c: Call) -> web.Response:
        if "location" in c.query:
            tags = await self.ns.get_tags(c.who, await self._bucket_entry(c))
            region = "" if self.region == "us-east-1" else self.region
            return _xml(document("LocationConstraint", tags.get(LOCATION_TAG) or region))
        if "uploads" in c.query:
            return await self.list_uploads(c)
        if "versions" in c.query:
            return await self.list_versions(c)
        return await self.list_objects(c)

    # -- listing --------------------------------------------------------------------------

    async def _page(
        self, c: Call, prefix: str, delimiter: str, after: str | None, max_keys: int
    ) -> tuple[list[Item], bool]:
        folder = await self._bucket_entry(c)
        items: list[Item] = []
        if max_keys == 0:
            return items, False
        lister = Lister(self.ns, c.who, folder, prefix=prefix, delimiter=delimiter, after=after)
        async for item in lister.items():
            if len(items) == max_keys:
                return items, True
            items.append(item)
        return items, False

    async def _contents(
        self, c: Call, items: list[Item], encode: bool, tag: str, owner: str | None
    ) -> Xml:
        """Contents (or Version) rows and CommonPrefixes; ``owner`` where rows name it."""
        rows = []
        for item in items:
            if item.entry is None:
                continue
            tags = await self.ns.get_tags(c.who, item.entry.path)
            extra = (el("VersionId", "null"), el("IsLatest", True)) if tag == "Version" else ()
            rows.append(
                el(
                    tag,
                    el("Key", _enc(item.key, encode)),
                    *extra,
                    el("LastModified", iso_time(item.entry.mtime_ns)),
                    el("ETag", object_etag(item.entry, tags)),
                    el("Size", 0 if item.entry.is_dir else item.entry.size),
                    el("StorageClass", "STANDARD"),
                    self._owner(c, owner) if owner else None,
                )
            )
        prefixes = [
            el("CommonPrefixes", el("Prefix", _enc(i.key, encode)))
            for i in items
            if i.entry is None
        ]
        return nodes([*rows, *prefixes])

    async def list_objects(self, c: Call) -> web.Response:
        q = c.query
        v2 = q.get("list-type") == "2"
        prefix, delimiter = q.get("prefix", ""), q.get("delimiter", "")
        encode = q.get("encoding-type") == "url"
        if "encoding-type" in q and not encode:
            raise S3Error("InvalidArgument", "encoding-type must be url")
        max_keys = min(_int_param(q.get("max-keys"), "max-keys", MAX_KEYS), MAX_KEYS)
        if v2:
            token = q.get("continuation-token")
            after = _decode_token(token) if token is not None else q.get("start-after") or None
        else:
            after = q.get("marker") or None
        items, truncated = await self._page(c, prefix, delimiter, after, max_keys)
        next_after = items[-1].key if truncated and items else None
        common = (
            el("Name", c.bucket),
            # V1 echoes the prefix as given even with encoding-type=url (clients rely on it)
            el("Prefix", _enc(prefix, encode and v2)),
            el("Delimiter", _enc(delimiter, encode)) if delimiter else None,
            el("MaxKeys", max_keys),
            el("EncodingType", "url") if encode else None,
            el("IsTruncated", truncated),
        )
        # V1 always names the owner, V2 only when asked to
        with_owner = not v2 or q.get("fetch-owner") == "true"
        owner = await self._bucket_owner(c) if with_owner else None
        contents = await self._contents(c, items, encode, "Contents", owner)
        if v2:
            return _xml(
                document(
                    "ListBucketResult",
                    *common,
                    el("KeyCount", len(items)),
                    el("ContinuationToken", q["continuation-token"])
                    if "continuation-token" in q
                    else None,
                    el("NextContinuationToken", _encode_token(next_after)) if next_after else None,
                    el("StartAfter", _enc(q["start-after"], encode))
                    if "start-after" in q
                    else None,
                    contents,
                )
            )
        return _xml(
            document(
                "ListBucketResult",
                *common,
                el("Marker", _enc(q.get("marker", ""), encode)),
                el("NextMarker", _enc(next_after, encode)) if next_after else None,
                contents,
            )
        )

    async def list_versions(self, c: Call) -> web.Response:
        """Unversioned buckets: every object is its only version, VersionId 'null'."""
        q = c.query
        folder = await self._bucket_entry(c)
        if await self._bucket_versioning(c, folder) is not None:
            return await self._list_kept_versions(c, folder)
        prefix, delimiter = q.get("prefix", ""), q.get("delimiter", "")
        encode = q.get("encoding-type") == "url"
        max_keys = min(_int_param(q.get("max-keys"), "max-keys", MAX_KEYS), MAX_KEYS)
        items, truncated = await self._page(
            c, prefix, delimiter, q.get("key-marker") or None, max_keys
        )
        next_after = items[-1].key if truncated and items else None
        return _versions_result(
            c, q.get("key-marker", ""), next_after, "null", max_keys, truncated,
            await self._contents(c, items, encode, "Version", await self._bucket_owner(c)),
        )  # fmt: skip

    async def _list_kept_versions(self, c: Call, folder: str) -> web.Response:
        """A versioned bucket's versions: the objects as they are (from the listing) and
        the old versions and delete markers the namespace kept, by key, newest first."""
        q = c.query
        prefix, delimiter = q.get("prefix", ""), q.get("delimiter", "")
        encode = q.get("encoding-type") == "url"
        max_keys = min(_int_param(q.get("max-keys"), "max-keys", MAX_KEYS), MAX_KEYS)
        after = q.get("key-marker") or ""
        # the objects as they are, from the key marker on, one more than a page: past the
        # last of them nothing is complete (an object there may sort before a kept version)
        items, more = await self._page(c, prefix, delimiter, after or None, max_keys + 1)
        limit = items[-1].key if more and items else None
        kept = await self.ns.versions(c.who, folder)
        now_of = {v.path: v for v in kept if v.latest and not v.marker}
        # (key, version id, the object as it is or the element of a kept version): an
        # object's tags are asked only if it is shown
        rows: list[tuple[str, str, Entry | Xml]] = []
        prefixes = {i.key for i in items if i.entry is None}
        owner = self._owner(c, await self._bucket_owner(c))
        for item in items:
            if item.entry is not None:
                now = now_of.get(item.entry.path)
                rows.append((item.key, now.vid if now else NULL_VERSION, item.entry))
        # the version-id-marker: the rest of the key-marker's own versions come first
        vid_marker = q.get("version-id-marker") if after else None
        passed = vid_marker is None
        for version in kept:
            key = version.path[len(folder) + 1 :]
            if (version.latest and not version.marker) or not key.startswith(prefix):
                if key == after and version.vid == vid_marker:
                    passed = True  # the marker named the object as it is
                continue
            if key == after and not passed:
                passed = version.vid == vid_marker
                continue
            if key < after or (key == after and vid_marker is None):
                continue
            if limit is not None and key > limit:
                continue
            cut = key.find(delimiter, len(prefix)) if delimiter else -1
            if cut >= 0:
                prefixes.add(key[: cut + len(delimiter)])
                continue
            if version.marker:
                element = el(
                    "DeleteMarker", owner, el("Key", _enc(key, encode)),
                    el("VersionId", version.vid), el("IsLatest", version.latest),
                    el("LastModified", iso_time(version.mtime_ns)),
                )  # fmt: skip
            else:
                element = self._version_row(
                    key, version.vid, False, version.entry(), version.tags, owner, encode
                )
            rows.append((key, version.vid, element))
        rows.sort(key=lambda r: r[0])  # stable: each key's versions stay newest first
        truncated = len(rows) > max_keys
        shown: list[Xml] = []
        for key, vid, row in rows[:max_keys]:
            if isinstance(row, Entry):
                tags = await self.ns.get_tags(c.who, row.path)
                row = self._version_row(key, vid, True, row, tags, owner, encode)  # noqa: PLW2901
            shown.append(row)
        last = rows[max_keys - 1] if truncated and max_keys else None
        if limit is not None:
            prefixes = {p for p in prefixes if p <= limit}
        return _versions_result(
            c, after, last[0] if last else None, last[1] if last else None, max_keys, truncated,
            nodes(shown),
            nodes([el("CommonPrefixes", el("Prefix", _enc(p, encode))) for p in sorted(prefixes)]),
        )  # fmt: skip

    @staticmethod
    def _version_row(
        key: str, vid: str, latest: bool, entry: Entry, tags: Mapping[str, str], owner: Xml,
        encode: bool,
    ) -> Xml:  # fmt: skip
        return el(
            "Version",
            el("Key", _enc(key, encode)),
            el("VersionId", vid),
            el("IsLatest", latest),
            el("LastModified", iso_time(entry.mtime_ns)),
            el("ETag", object_etag(entry, tags)),
            el("Size", 0 if entry.is_dir else entry.size),
            el("StorageClass", "STANDARD"),
            owner,
        )

    # -- objects --------------------------------------------------------------------------

    async def _object(self, c: Call) -> tuple[Entry, dict[str, str]]:
        path = self.object_path(c)
        try:
            entry, tags = await self.ns.stat_tags(c.who, path)
        except NotFound:
            await self._bucket_entry(c)  # NoSuchBucket before NoSuchKey
            raise S3Error(
                "NoSuchKey", "the specified key does not exist", headers=await self._marked(c)
            ) from None
        if entry.kind is EntryKind.SYMLINK:
            # a symlink is the object it leads to: its bytes, size, version and tags
            try:
                entry = await self.ns.followed(c.who, entry)
            except (NotFound, IsADirectory):
                raise S3Error("NoSuchKey", "the specified key does not exist") from None
            tags = await self.ns.get_tags(c.who, entry.path)
        if (
            entry.is_dir != c.key.endswith("/")
            or (entry.is_dir and MARKER_TAG not in tags)
            or entry.kind in SPECIAL_KINDS
        ):
            # 'a/' names a folder marker, 'a' a file; a fifo, device or socket is no object
            raise S3Error("NoSuchKey", "the specified key does not exist")
        return entry, tags

    async def get_object(self, c: Call) -> web.StreamResponse:
        request = c.request
        old = await self._old_version(c)
        entry, tags = (old.entry(), old.tags) if old is not None else await self._object(c)
        etag = object_etag(entry, tags)
        status = check_preconditions(request.headers.get, etag, entry.mtime_ns)
        if status == 304:
            return web.Response(
                status=304, headers={"ETag": etag, "Last-Modified": http_time(entry.mtime_ns)}
            )
        if status == 412:
            raise S3Error("PreconditionFailed", "at least one of the preconditions failed")
        headers = {
            "ETag": etag,
            "Last-Modified": http_time(entry.mtime_ns),
            "Accept-Ranges": "bytes",
            **_meta_headers(tags),
            **objectlock.headers_of(tags),
            **encryption.headers_of(tags),
            **(await self._expiration(c, entry, tags) if old is None else {}),
        }
        key = encryption.read_key(_lowered(request.headers))
        if "versionId" in c.query:
            headers["x-amz-version-id"] = c.query["versionId"]
        elif await self._bucket_versioning(c, self.bucket_dir(c.bucket)) is not None:
            found = await self.ns.versions(c.who, entry.path)
            now = next((v for v in found if v.path == entry.path and v.latest), None)
            headers["x-amz-version-id"] = now.vid if now is not None else NULL_VERSION
        for name in STORED_HEADERS:
            override = c.query.get(f"response-{name}")
            if override is not None:
                headers[name.title()] = override
        kept = checksums.Kept.of(entry.version, tags.get(CHECKSUM_TAG))
        part = c.query.get("partNumber")
        if kept is not None and _checksum_mode(request) and "Range" not in request.headers:
            sums = part_checksums(entry, tags)
            if part is None:
                headers |= kept.headers()
            elif part.isdigit() and 1 <= int(part) <= len(sums):
                headers |= replace(kept, value=sums[int(part) - 1]).headers()
        if entry.is_dir:  # a folder marker ('dir/'): an empty object
            return web.Response(headers={**headers, "Content-Length": "0"})
        window: tuple[int, int] | None
        if part is not None:
            window = part_window(_int_param(part, "partNumber", 0), entry, tags)
            if PARTS_TAG in tags:
                headers["x-amz-mp-parts-count"] = str(len(parts_of(entry, tags)))
        else:
            window = parse_range(request.headers.get("Range"), entry.size)
        offset, length = window if window is not None else (0, None)
        async with await self._open(c.who, entry, old, offset, length, key) as reader:
            return await serve_reader(
                request, reader, headers, ranged=window is not None, sent=BYTES_OUT.inc
            )

    def _open(
        self,
        who: Principal,
        entry: Entry,
        old: Version | None,
        offset: int,
        length: int | None,
        key: Sealing | None,
    ) -> Awaitable[Reader]:
        """A read of the object ``entry`` is (or of its old version ``old``), decrypted by
        the namespace, or refused there without the customer's ``key`` it needs."""
        if self.sealer is None:
            if key is not None:
                raise S3Error("NotImplemented", "this gateway's namespace does not encrypt")
            if old is not None:
                return self.ns.read_version(who, entry.path, old.vid, offset, length)
            return self.ns.read_entry(who, entry, offset, length)
        if old is not None:
            return self.sealer.read_version(who, entry.path, old.vid, offset, length, key=key)
        return self.sealer.read_entry(who, entry, offset, length, key=key)

    async def get_object_attributes(self, c: Call) -> web.Response:
        entry, tags = await self._object(c)
        headers = c.request.headers
        if self.sealer is not None and not entry.is_dir:  # refused as a read would be
            await self.sealer.check_key(c.who, entry, encryption.read_key(_lowered(headers)))
        wanted = {a.strip() for a in headers.get("x-amz-object-attributes", "").split(",")}
        wanted.discard("")
        if not wanted or not wanted <= OBJECT_ATTRIBUTES:
            raise S3Error(
                "InvalidArgument",
                f"x-amz-object-attributes must name some of {sorted(OBJECT_ATTRIBUTES)}",
            )
        etag = object_etag(entry, tags)
        kept = checksums.Kept.of(entry.version, tags.get(CHECKSUM_TAG))
        sums = part_checksums(entry, tags)
        parts = None
        # only a multipart object has parts to show (its ETag ends in -<count>)
        if "ObjectParts" in wanted and etag.rstrip('"').rpartition("-")[1]:
            sizes = parts_of(entry, tags)
            after = _int_param(headers.get("x-amz-part-number-marker"), "part-number-marker", 0)
            limit = min(_int_param(headers.get("x-amz-max-parts"), "max-parts", 1000), 1000)
            numbered = [(n, size) for n, size in enumerate(sizes, 1) if n > after]
            shown = numbered[:limit]
            parts = el(
                "ObjectParts",
                el("PartsCount", len(sizes)),
                el("PartNumberMarker", after),
                el("NextPartNumberMarker", shown[-1][0]) if shown else None,
                el("MaxParts", limit),
                el("IsTruncated", len(numbered) > limit),
                nodes(
                    el(
                        "Part",
                        el("PartNumber", n),
                        el("Size", size),
                        el(kept.element, sums[n - 1]) if kept and n <= len(sums) else None,
                    )
                    for n, size in shown
                ),
            )
        checksum = None
        if "Checksum" in wanted and kept is not None:
            checksum = el("Checksum", el(kept.element, kept.value), el("ChecksumType", kept.kind))
        body = document(
            "GetObjectAttributesResponse",
            # unlike every other response, here the ETag goes without quotes
            el("ETag", etag.strip('"')) if "ETag" in wanted else None,
            checksum,
            parts,
            el("StorageClass", "STANDARD") if "StorageClass" in wanted else None,
            el("ObjectSize", entry.size) if "ObjectSize" in wanted else None,
        )
        response = _xml(body)
        response.headers["Last-Modified"] = http_time(entry.mtime_ns)
        return response

    def _body(self, c: Call, limit: int) -> tuple[AsyncIterator[bytes], checksums.Declared | None]:
        """The request body as the signature covers it: plain (SHA-256 checked at the end
        when signed) or decoded from aws-chunked (every chunk's signature checked), and
        with the additional checksum its headers declare checked at the end; and that
        checksum."""
        request = c.request
        headers = request.headers
        decoded = headers.get("x-amz-decoded-content-length")
        if (
            request.content_length is None
            and decoded is None
            and "chunked" not in headers.get("Transfer-Encoding", "")
        ):
            raise S3Error("MissingContentLength", "you must provide the Content-Length header")
        decoded_length = int(decoded) if decoded and decoded.isdigit() else None
        declared = decoded_length if decoded_length is not None else request.content_length
        if declared is not None and declared > limit:
            raise S3Error("EntityTooLarge", f"the upload exceeds {limit} bytes")
        checker = sigv4.PayloadChecker(c.auth, decoded_length)
        if c.auth.payload in (sigv4.STREAMING, sigv4.STREAMING_UNSIGNED_TRAILER):
            reader = sigv4.ChunkReader(request.content.readline, request.content.read)
            body = checker.chunked(reader)
        else:
            body = checker.plain(request.content.iter_chunked(1 << 20))
        lowered = {k.lower(): v for k, v in headers.items()}
        checksum = checksums.declared(lowered, checker.trailers)
        if checksum is not None:
            body = checksums.checked(body, checksum)
        return _from_client(body), checksum

    async def _ensure_parent(self, c: Call, path: str) -> None:
        parent = paths.split(paths.normalize(path))[0]
        try:
            await self.ns.mkdir(c.who, parent, parents=True, exist_ok=True)
        except (AlreadyExists, NotADirectory):
            raise S3Error(
                "InvalidRequest", "a prefix of this key is an object, so it cannot hold keys"
            ) from None

    async def _store(
        self,
        c: Call,
        path: str,
        data: AsyncIterator[bytes],
        meta: dict[str, str],
        *,
        etag: str | None = None,
        content_md5: bytes | None = None,
        checksum: Callable[[], checksums.Kept | None] = lambda: None,
        lock: Lock | None = None,
        sealing: Sealing | None = None,
        limit: int,
    ) -> tuple[Entry, str]:
        """Stream ``data`` into the object at ``path`` and record its S3 tags and lock
        (``lock`` asked for, or the bucket's default), with the additional checksum
        ``checksum`` gives once ``data`` has ended, encrypted as ``sealing`` (None: as
        the bucket's default says; ``c.sealing`` is set to what was chosen)."""
        await self._bucket_entry(c)
        locked = await self._new_lock(c, lock)
        await self._ensure_parent(c, path)
        exclusive, if_version = await self._write_conditions(c, path)
        tally = Tally(limit)

        async def checked() -> AsyncIterator[bytes]:
            async for chunk in tally.through(data):
                yield chunk
            if content_md5 is not None and tally.md5.digest() != content_md5:
                raise S3Error("BadDigest", "the Content-MD5 you specified did not match")

        def tags() -> WriteTags:
            # asked once the bytes have ended, and committed with them: a crash leaves
            # the old object with its metadata or the new one with its own
            stamped = {ETAG_TAG: etag or tally.etag}
            if (kept := checksum()) is not None:
                stamped[CHECKSUM_TAG] = kept.text()
            return WriteTags({**meta, **locked}, stamped, replace_prefix=TAG)

        if self.sealer is None:
            entry = await self.ns.write(
                c.who, path, checked(), exclusive=exclusive, if_version=if_version, tags=tags
            )
        else:
            c.sealing = sealing or await self.sealer.sealing_for(c.who, path)
            entry = await self.sealer.write(
                c.who, path, checked(), exclusive=exclusive, if_version=if_version, tags=tags,
                sealing=c.sealing,
            )  # fmt: skip
        etag = etag or tally.etag
        if await self._bucket_versioning(c, self.bucket_dir(c.bucket)) == "Enabled":
            c.version_id = str(entry.version)
        return entry, etag

    async def _write_conditions(self, c: Call, path: str) -> tuple[bool, int | None]:
        """(exclusive, if_version) for the write from If-Match / If-None-Match: the
        version the ETags were checked against is passed on, so the check and the
        write are one atomic step in the namespace."""
        headers = c.request.headers
        if_match, if_none = headers.get("If-Match"), headers.get("If-None-Match")
        if if_none is not None and if_none.strip() == "*" and if_match is None:
            return True, None
        if if_match is None and if_none is None:
            return False, None
        try:
            entry, tags = await self.ns.stat_tags(c.who, path)
        except NotFound:
            if if_match is not None:
                raise S3Error("NoSuchKey", "the specified key does not exist") from None
            return True, None  # If-None-Match: nothing there matches; keep it so
        etag = object_etag(entry, tags)
        if (if_match is not None and not _etag_matches(if_match, etag)) or (
            if_none is not None and _etag_matches(if_none, etag)
        ):
            raise S3Error("PreconditionFailed", "at least one of the preconditions failed")
        return False, entry.version

    async def _set_s3_tags(
        self, c: Call, path: str, new: dict[str, str], prefix: str = TAG
    ) -> None:
        """Make ``new`` the tags under ``prefix`` (all that S3 keeps, by default)."""
        tags = await self.ns.set_tags(c.who, path, new)
        stale = [k for k in tags if k.startswith(prefix) and k not in new]
        if stale:
            await self.ns.set_tags(c.who, path, {}, stale)

    async def put_object(self, c: Call) -> web.Response:
        headers = {k.lower(): v for k, v in c.request.headers.items()}
        content_md5 = _content_md5(headers.get("content-md5"))
        data, declared = self._body(c, self.max_object_size)
        path = self.object_path(c)
        if c.key.endswith("/"):  # a folder marker: the directory itself
            async for chunk in data:
                if chunk:
                    raise S3Error("InvalidRequest", "a key ending in '/' holds no data here")
            await self._bucket_entry(c)
            await self.ns.mkdir(c.who, path, parents=True, exist_ok=True)
            await self._set_s3_tags(c, path, {**_stored_meta(headers), MARKER_TAG: "1"})
            return web.Response(headers={"ETag": EMPTY_MD5})
        meta = _stored_meta(headers)
        entry, etag = await self._store(
            c,
            path,
            data,
            meta,
            content_md5=content_md5,
            checksum=checksums.as_kept(declared),
            lock=objectlock.asked(headers),
            sealing=encryption.asked(headers),
            limit=self.max_object_size,
        )
        await self._acl_on_create(c, path)
        answer = {"ETag": etag, **(declared.kept().headers() if declared else {})}
        answer |= encryption.sealing_headers(c.sealing)
        answer |= await self._expiration(c, entry, meta)
        return web.Response(headers=answer)

    async def post_object(self, request: web.Request, bucket: str) -> web.Response:
        """POST Object: a browser form's upload (``post.py``), written as a PUT is, as the
        user who signed its policy."""
        form = await post.read_form(request)
        lookup, found = self._key_lookup()
        access_key = await post.signer(form, lookup, self.region)
        if access_key is not None:
            who = found["who"]
        elif self.anonymous:
            who = Principal(ANONYMOUS, site=self.site, protocol="s3")
        else:
            raise S3Error("AccessDenied", "this gateway takes signed POST forms only")
        key = form.key
        check_key(key)
        data: AsyncIterator[bytes] = form.chunks()
        declared = checksums.declared(
            {k: v for k, v in form.fields.items() if k.startswith(checksums.PREFIX)}, {}
        )
        if declared is not None:
            data = checksums.checked(data, declared)
        if "policy" in form.fields:
            policy = post.Policy.parse(form.fields["policy"])
            policy.check({**form.fields, "bucket": bucket, "key": key}, self.verifier.clock())
            data = policy.sized(data)
        auth = sigv4.Verified(access_key or "", sigv4.UNSIGNED, "", "", "", b"")
        c = Call(request, who, auth, bucket, key, {}, op="post_object")
        fields = form.fields
        meta = _stored_meta(
            {k: v for k, v in fields.items() if k in STORED_HEADERS or k.startswith("x-amz-meta-")}
        )
        if "tagging" in fields:
            meta |= tagging.from_xml(fields["tagging"].encode(), tagging.MAX_OBJECT_TAGS)
        canned = acl.check_canned(fields.get("acl"))
        path = self.object_path(c)
        if key.endswith("/"):
            raise S3Error("InvalidRequest", "a key ending in '/' holds no data here")
        _, etag = await self._store(
            c,
            path,
            _from_client(data),
            meta,
            checksum=checksums.as_kept(declared),
            sealing=encryption.asked({k.lower(): v for k, v in fields.items()}),
            limit=self.max_object_size,
        )
        await self._acl_on_create(c, path, canned)
        answer = {"ETag": etag, "Location": f"/{bucket}/{quote(key)}"}
        redirect = fields.get("success_action_redirect") or fields.get("redirect")
        if redirect:
            joiner = "&" if "?" in redirect else "?"
            answer["Location"] = (
                f"{redirect}{joiner}bucket={quote(bucket)}&key={quote(key)}&etag={quote(etag)}"
            )
            return web.Response(status=303, headers=answer)
        status = fields.get("success_action_status")
        if status == "201":
            body = (
                '<?xml version="1.0" encoding="UTF-8"?>\n'
                + el(
                    "PostResponse",
                    el("Location", answer["Location"]),
                    el("Bucket", bucket),
                    el("Key", key),
                    el("ETag", etag),
                )
            ).encode()
            return web.Response(
                status=201, body=body, headers=answer, content_type="application/xml"
            )
        return web.Response(status=200 if status == "200" else 204, headers=answer)

    async def _copy_source(self, c: Call) -> tuple[Call, Entry, dict[str, str], Version | None]:
        """The copy source (x-amz-copy-source: BUCKET/KEY, maybe ?versionId=): the call
        that names it, its entry and tags, and the old version it is, if one."""
        raw, _, query = c.request.headers["x-amz-copy-source"].partition("?")
        source = unquote(raw)
        bucket, _, key = source.lstrip("/").partition("/")
        if not bucket or not key:
            raise S3Error("InvalidArgument", "x-amz-copy-source must be BUCKET/KEY")
        check_key(key)
        vid = query.removeprefix("versionId=") if query.startswith("versionId=") else None
        source_call = Call(
            c.request, c.who, c.auth, bucket, key, {} if vid is None else {"versionId": vid}
        )
        old = await self._old_version(source_call)
        entry, tags = (
            (old.entry(), old.tags) if old is not None else await self._object(source_call)
        )
        return source_call, entry, tags, old

    async def _read_source(
        self, c: Call, window: tuple[int, int | None] = (0, None)
    ) -> tuple[Entry, dict[str, str], AsyncGenerator[bytes, None]]:
        """The copy source's entry, tags and bytes, after its conditions were checked."""
        source_call, entry, tags, old = await self._copy_source(c)
        await self._check_owner(source_call, "x-amz-source-expected-bucket-owner")
        status = check_preconditions(
            c.request.headers.get, object_etag(entry, tags), entry.mtime_ns, copy=True
        )
        if status is not None:
            raise S3Error("PreconditionFailed", "at least one of the preconditions failed")

        key = encryption.customer_key(_lowered(c.request.headers), encryption.COPY_CUSTOMER)

        async def stream() -> AsyncGenerator[bytes, None]:
            opened = self._open(c.who, entry, old, *window, key)
            async with await opened as reader:
                async for chunk in reader.chunks():
                    yield chunk
                await reader.verify()

        return entry, tags, stream()

    async def copy_object(self, c: Call) -> web.Response:
        headers = {k.lower(): v for k, v in c.request.headers.items()}
        replace = headers.get("x-amz-metadata-directive", "COPY").upper() == "REPLACE"
        entry, tags, data = await self._read_source(c)
        path = self.object_path(c)
        meta = (
            _stored_meta(headers)
            if replace
            else {k: v for k, v in tags.items() if k.startswith(TAG)}
        )
        # the tag set follows its own directive, not the metadata's
        meta = {k: v for k, v in meta.items() if not k.startswith(tagging.PREFIX)}
        if headers.get("x-amz-tagging-directive", "COPY").upper() == "REPLACE":
            meta |= tagging.from_header(headers.get("x-amz-tagging"))
        else:
            meta |= {k: v for k, v in tags.items() if k.startswith(tagging.PREFIX)}
        for own in (ETAG_TAG, PARTS_TAG, CHECKSUM_TAG, PART_SUMS_TAG):  # a new single-part object
            meta.pop(own, None)
        if paths.normalize(path) == entry.path:
            await data.aclose()
            if not replace:
                raise S3Error(
                    "InvalidRequest",
                    "this copy request is illegal because it copies an object to itself "
                    "without changing the object's metadata",
                )
            etag = object_etag(entry, tags)
            await self._set_s3_tags(c, path, {**meta, ETAG_TAG: f"{entry.version} {etag}"})
            result = entry
        else:
            asked = objectlock.asked(headers)
            result, etag = await self._store(
                c,
                path,
                data,
                meta,
                lock=asked,
                sealing=encryption.asked(headers),
                limit=self.max_object_size,
            )
        await self._acl_on_create(c, path)
        response = _xml(
            document(
                "CopyObjectResult", el("LastModified", iso_time(result.mtime_ns)), el("ETag", etag)
            )
        )
        response.headers.update(encryption.sealing_headers(c.sealing))
        return response

    async def _remove_key(
        self,
        c: Call,
        key: str,
        if_match: str | None = None,
        holds: Callable[[Entry], bool] | None = None,
    ) -> None:
        """Delete one key; a key that isn't there is no error (S3), unless ``if_match``
        (an If-Match header or a DeleteObjects ETag) asks for it, which the object's ETag
        must also match, as it must the other conditions (``holds``): those checks and
        the removal are one step in the namespace. The directories that only existed
        for the key are pruned up to the bucket, folder markers kept."""
        folder = self.bucket_dir(c.bucket)
        path = paths.normalize(folder + "/" + key)
        try:
            entry, tags = await self.ns.stat_tags(c.who, path)
        except NotFound:
            if if_match is not None:
                raise S3Error("NoSuchKey", "the specified key does not exist") from None
            return
        if entry.is_dir != key.endswith("/") or (entry.is_dir and MARKER_TAG not in tags):
            if if_match is not None:
                raise S3Error("NoSuchKey", "the specified key does not exist")
            if not entry.is_dir or not key.endswith("/"):
                return
        if (if_match is not None and not _etag_matches(if_match, object_etag(entry, tags))) or (
            holds is not None and not holds(entry)
        ):
            raise S3Error("PreconditionFailed", "at least one of the preconditions failed")
        conditional = if_match is not None or holds is not None
        try:
            await self.ns.remove(c.who, path, if_version=entry.version if conditional else None)
        except NotFound:
            return
        except DirectoryNotEmpty:
            if MARKER_TAG not in tags:
                return
            # the marker goes, the keys inside it stay (two keys); once untagged, the
            # directory is removed by whoever finds it empty: the delete of its last key
            # (which keeps a marked parent), or this one, if that delete ran meanwhile
            await self._set_s3_tags(c, path, {})
            try:
                await self.ns.remove(c.who, path)
            except (NotFound, DirectoryNotEmpty):
                return
        if self.rules is not None:  # an object's ACL goes with it
            await self.rules.forget_access(c.who, path)
        await self._prune(c, path)

    async def _prune(self, c: Call, path: str) -> None:
        """Remove the directories that only existed for the key at ``path`` (now gone),
        up to the bucket; folder markers stay."""
        folder = self.bucket_dir(c.bucket)
        parent = paths.split(path)[0]
        while parent != folder and paths.is_within(parent, folder):
            try:
                if MARKER_TAG in await self.ns.get_tags(c.who, parent):
                    return
                await self.ns.remove(c.who, parent)
            except (DirectoryNotEmpty, NotFound, InvalidPath):
                return
            parent = paths.split(parent)[0]

    async def delete_object(self, c: Call) -> web.Response:
        folder = await self._bucket_entry(c)
        headers = c.request.headers
        state = await self._bucket_versioning(c, folder)
        vid = c.query.get("versionId")
        if vid is not None and (state is not None or vid != NULL_VERSION):
            await self._version_holds(c, c.key, vid, headers.get("If-Match"), headers)
            return web.Response(status=204, headers=await self._remove_version(c, c.key, vid))
        await self._remove_key(c, c.key, headers.get("If-Match"), _delete_conditions(headers))
        if state is None:
            return web.Response(status=204)
        return web.Response(status=204, headers=await self._marker_left(c, c.key))

    async def _version_holds(
        self, c: Call, key: str, vid: str, if_match: str | None, headers: Mapping[str, str]
    ) -> None:
        """PreconditionFailed unless version ``vid`` of ``key`` meets a delete's
        conditions (If-Match, the x-amz-if-match-* headers)."""
        holds = _delete_conditions(headers)
        if if_match is None and holds is None:
            return
        call = Call(c.request, c.who, c.auth, c.bucket, key, {"versionId": vid})
        try:
            old = await self._old_version(call)
            entry, tags = (old.entry(), old.tags) if old is not None else await self._object(call)
        except S3Error as exc:
            if exc.code in ("NoSuchVersion", "NoSuchKey"):
                return  # nothing there to delete: no condition to fail (S3's -ENOENT)
            raise
        if (if_match is not None and not _etag_matches(if_match, object_etag(entry, tags))) or (
            holds is not None and not holds(entry)
        ):
            raise S3Error("PreconditionFailed", "at least one of the preconditions failed")

    async def _marker_left(self, c: Call, key: str) -> dict[str, str]:
        """The headers naming the delete marker a delete of ``key`` left: the one its
        removal left, or for a key that was not there one left now (as S3 leaves)."""
        path = paths.normalize(self.object_path(c, key))
        try:
            vid = await self.ns.mark_removed(c.who, path)
        except AlreadyExists:  # not an object (a directory): nothing was deleted
            return {}
        if vid is None:
            return {}
        return {"x-amz-delete-marker": "true", "x-amz-version-id": vid}

    async def _remove_version(self, c: Call, key: str, vid: str) -> dict[str, str]:
        """Delete one version of ``key`` for good; the response's headers."""
        path = paths.normalize(self.object_path(c, key))
        try:
            gone = await self.ns.remove_version(c.who, path, vid, bypass=_bypass(c))
        except NotSupported:
            raise S3Error("NoSuchVersion", "this gateway keeps no versions") from None
        if not await self.ns.exists(c.who, path):
            await self._prune(c, path)
        answer = {"x-amz-version-id": vid}
        if gone is not None and gone.marker:
            answer["x-amz-delete-marker"] = "true"
        return answer

    # -- versioning -----------------------------------------------------------------------

    async def get_versioning(self, c: Call) -> web.Response:
        state = await self.ns.versioning(c.who, await self._bucket_entry(c))
        self._versioning[c.bucket] = state
        status = el("Status", state) if state is not None else None
        return _xml(document("VersioningConfiguration", status))

    async def put_versioning(self, c: Call) -> web.Response:
        folder = await self._bucket_entry(c)
        root = parse(await _read_document(c.request))
        status = child_text(root, "Status")
        if local(root.tag) != "VersioningConfiguration" or status not in VERSIONING_STATES:
            raise S3Error("MalformedXML", "Status must be Enabled or Suspended")
        if status != "Enabled" and nslock.ENABLED in await self.ns.get_tags(c.who, folder):
            raise S3Error("InvalidBucketState", "a bucket with object lock stays versioned")
        try:
            await self.ns.set_versioning(c.who, folder, status)
        except NotSupported:
            raise S3Error("NotImplemented", "this gateway keeps no versions") from None
        self._versioning[c.bucket] = status
        return web.Response()

    async def _bucket_versioning(self, c: Call, folder: str) -> str | None:
        if c.bucket not in self._versioning:
            self._versioning[c.bucket] = await self.ns.versioning(c.who, folder)
        return self._versioning[c.bucket]

    async def _version(self, c: Call, vid: str) -> Version | None:
        """Version ``vid`` of the call's key; None for the null version of an object
        never versioned (the object itself)."""
        await self._bucket_entry(c)
        path = paths.normalize(self.object_path(c))
        with contextlib.suppress(NotSupported):
            for version in await self.ns.versions(c.who, path):
                if version.path == path and version.vid == vid:
                    return version
        if vid == NULL_VERSION:
            return None
        raise S3Error("NoSuchVersion", "the specified version does not exist")

    async def _old_version(self, c: Call) -> Version | None:
        """The old version a GET or HEAD names (versionId), None for the object as is."""
        vid = c.query.get("versionId")
        version = None if vid is None else await self._version(c, vid)
        if version is None or (version.latest and not version.marker):
            return None
        if version.marker:
            raise S3Error(
                "MethodNotAllowed", "the specified version is a delete marker", headers=MARKED
            )
        return version

    async def _marked(self, c: Call) -> dict[str, str]:
        """The headers of a missing key's 404: whether its newest version is a delete
        marker (AWS leaves out "false"; RGW, and the s3-tests suite, say it)."""
        if await self._bucket_versioning(c, self.bucket_dir(c.bucket)) is None:
            return UNMARKED
        path = paths.normalize(self.object_path(c))
        with contextlib.suppress(NotSupported):
            newest = next((v for v in await self.ns.versions(c.who, path) if v.path == path), None)
            if newest is not None and newest.marker:
                return MARKED
        return UNMARKED

    async def delete_objects(self, c: Call) -> web.Response:
        state = await self._bucket_versioning(c, await self._bucket_entry(c))
        root = parse(await _read_document(c.request))
        if local(root.tag) != "Delete":
            raise S3Error("MalformedXML", "the root element must be Delete")
        quiet = (child_text(root, "Quiet") or "").lower() == "true"
        objects = [
            (child_text(o, "Key"), child_text(o, "VersionId"), child_text(o, "ETag"))
            for o in root
            if local(o.tag) == "Object"
        ]
        if not objects or len(objects) > 1000 or any(k is None for k, _, _ in objects):
            raise S3Error("MalformedXML", "Delete needs 1 to 1000 Object elements with a Key")
        results = []
        for key, version, if_match in objects:
            assert key is not None
            try:
                check_key(key)
                if version is not None and (state is not None or version != NULL_VERSION):
                    await self._version_holds(c, key, version, if_match, {})
                    done = await self._remove_version(c, key, version)
                else:
                    await self._remove_key(c, key, if_match)
                    done = await self._marker_left(c, key) if state is not None else {}
            except (S3Error, LoomError) as exc:
                error = exc if isinstance(exc, S3Error) else from_loom(exc, key)
                results.append(
                    el(
                        "Error",
                        el("Key", key),
                        el("VersionId", version) if version is not None else None,
                        el("Code", error.code),
                        el("Message", error.message),
                    )
                )
                continue
            if not quiet:
                marker = done.get("x-amz-delete-marker") == "true"
                results.append(
                    el(
                        "Deleted",
                        el("Key", key),
                        el("VersionId", version) if version is not None else None,
                        el("DeleteMarker", True) if marker else None,
                        el("DeleteMarkerVersionId", done["x-amz-version-id"])
                        if marker and version is None
                        else None,
                    )
                )
        return _xml(document("DeleteResult", nodes(results)))

    # -- multipart ------------------------------------------------------------------------

    async def _may_write(self, c: Call, op: str) -> None:
        """Ask the namespace whether the caller may write the object an upload makes:
        its parts are staged outside the namespace until Complete writes them there, so
        each step is authorized (and a refusal audited) on the object's path."""
        if self.rules is not None:
            await self.rules.authorize(c.who, op, Action.WRITE, self.object_path(c))

    async def _upload(self, c: Call) -> Upload:
        upload = await self.staging.get(c.query["uploadId"], c.bucket, c.key)
        await self._may_write(c, c.op)
        return upload

    async def create_upload(self, c: Call) -> web.Response:
        await self._bucket_entry(c)
        await self._may_write(c, c.op)
        headers = {k.lower(): v for k, v in c.request.headers.items()}
        algorithm = checksums.algorithm_of(headers.get("x-amz-checksum-algorithm"))
        checksum, answer = None, {}
        if algorithm is not None:
            only_full = algorithm in checksums.FULL_OBJECT_ONLY
            kind = headers.get("x-amz-checksum-type", "").upper()
            kind = kind or ("FULL_OBJECT" if only_full else "COMPOSITE")
            if kind not in checksums.KINDS or (kind == "COMPOSITE" and only_full):
                raise S3Error("InvalidRequest", f"{algorithm.upper()} has no {kind} checksum")
            checksum = f"{algorithm} {kind}"
            answer = {"x-amz-checksum-algorithm": algorithm.upper(), "x-amz-checksum-type": kind}
        meta = _stored_meta(headers)
        asked = objectlock.asked(headers)
        if asked is not None:  # kept with the upload, written with its object on Complete
            await self._new_lock(c, asked)
            meta |= asked.as_tags()
        sealing = encryption.asked(headers)
        if sealing is not None:  # how, never a customer's key: that comes with each part
            meta[encryption.UPLOAD_TAG] = encryption.upload_value(sealing)
            answer |= encryption.sealing_headers(sealing)
        upload = await self.staging.create(c.bucket, c.key, c.who.user, meta, checksum)
        response = _xml(
            document(
                "InitiateMultipartUploadResult",
                el("Bucket", c.bucket),
                el("Key", c.key),
                el("UploadId", upload.upload_id),
            )
        )
        response.headers.update(answer)
        return response

    @staticmethod
    def _part_checksum(
        upload: Upload, data: AsyncIterator[bytes], declared: checksums.Declared | None
    ) -> tuple[AsyncIterator[bytes], Callable[[], str] | None]:
        """A part's bytes and its checksum ('<algorithm> <value>', once they have ended):
        the one it declared (checked), or where it declared none the one its upload
        asked for, computed as the bytes go by."""
        algorithm = upload.checksum.split(" ")[0] if upload.checksum else None
        if declared is not None:
            if algorithm is not None and declared.algorithm != algorithm:
                raise S3Error(
                    "InvalidRequest",
                    f"the part's checksum is {declared.algorithm.upper()}, the upload's "
                    f"{algorithm.upper()}",
                )
            return data, lambda: f"{declared.algorithm} {declared.value}"
        if algorithm is None:
            return data, None
        found: list[str] = []
        return checksums.hashed(data, algorithm, found.append), lambda: f"{algorithm} {found[0]}"

    async def upload_part(self, c: Call) -> web.Response:
        upload = await self._upload(c)
        number = _int_param(c.query.get("partNumber"), "partNumber", 0)
        sealing = encryption.upload_sealing(
            upload.meta.get(encryption.UPLOAD_TAG), _lowered(c.request.headers)
        )
        if "x-amz-copy-source" not in c.request.headers:
            body, checksum = self._part_checksum(upload, *self._body(c, self.max_part_size))
            part = await self.staging.put_part(upload, number, body, self.max_part_size, checksum)
            answer = {"ETag": part.etag, **encryption.sealing_headers(sealing)}
            if part.checksum is not None:
                algorithm, _, value = part.checksum.partition(" ")
                answer[checksums.PREFIX + algorithm] = value
            return web.Response(headers=answer)
        window: tuple[int, int | None] = (0, None)
        source_range = c.request.headers.get("x-amz-copy-source-range")
        if source_range:
            _, source, _, _ = await self._copy_source(c)
            window = _copy_range(source_range, source.size)
        _, _, source_data = await self._read_source(c, window)
        data, checksum = self._part_checksum(upload, source_data, None)
        part = await self.staging.put_part(upload, number, data, self.max_part_size, checksum)
        response = _xml(
            document(
                "CopyPartResult",
                el("LastModified", iso_time(part.mtime_ns)),
                el("ETag", part.etag),
                _part_checksum_xml(part),
            )
        )
        response.headers.update(encryption.sealing_headers(sealing))
        return response

    async def complete_upload(self, c: Call) -> web.Response:
        done = await self.staging.completed(c.query["uploadId"], c.bucket, c.key)
        if done is not None:
            return self._completed(c, done[0], checksums.Kept.parse(done[1]))
        upload = await self._upload(c)
        root = parse(await _read_document(c.request))
        if local(root.tag) != "CompleteMultipartUpload":
            raise S3Error("MalformedXML", "the root element must be CompleteMultipartUpload")
        chosen = []
        listed: dict[int, str] = {}  # the checksums the client lists for its parts
        for part in root:
            if local(part.tag) != "Part":
                continue
            number, etag = child_text(part, "PartNumber"), child_text(part, "ETag")
            if number is None or etag is None or not number.isdigit():
                raise S3Error("MalformedXML", "each Part needs a PartNumber and an ETag")
            chosen.append((int(number), etag))
            for child in part:
                name = local(child.tag)
                if name.startswith("Checksum") and name != "ChecksumType":
                    listed[int(number)] = f"{name[len('Checksum') :].lower()} {child.text or ''}"
        data, etag, parts = await self.staging.assemble(upload, chosen)
        sizes = [p.size for p in parts]
        if sum(sizes) > self.max_upload_size:  # refused before a byte of it is written
            raise S3Error("EntityTooLarge", f"the object exceeds {self.max_upload_size} bytes")
        for staged in parts:
            if staged.number in listed and listed[staged.number] != staged.checksum:
                raise S3Error(
                    "InvalidPart", f"part {staged.number}'s checksum is not the one listed"
                )
        data, kept = self._object_checksum(c, upload, parts, data)
        path = self.object_path(c)
        meta = dict(upload.meta)
        sealing = encryption.upload_sealing(
            meta.pop(encryption.UPLOAD_TAG, None), _lowered(c.request.headers)
        )
        layout = encode_parts(sizes)
        if len(layout) <= MAX_PARTS_TAG:  # else GET by partNumber answers NotImplemented
            meta[PARTS_TAG] = layout
        if upload.checksum is not None:
            sums = ",".join(p.checksum.partition(" ")[2] for p in parts if p.checksum)
            if len(sums) <= MAX_PARTS_TAG:  # else a part's GET has no checksum to answer
                meta[PART_SUMS_TAG] = sums
        asked = Lock.of(meta) if nslock.touches(meta) else None
        await self._store(
            c,
            path,
            data,
            meta,
            etag=etag,
            checksum=kept,
            lock=asked,
            sealing=sealing,
            limit=self.max_upload_size,
        )
        checksum = kept()
        await self.staging.finish(upload, etag, checksum.text() if checksum else None)
        return self._completed(c, etag, checksum)

    @staticmethod
    def _object_checksum(
        c: Call, upload: Upload, parts: list[Part], data: AsyncIterator[bytes]
    ) -> tuple[AsyncIterator[bytes], Callable[[], checksums.Kept | None]]:
        """The bytes of a multipart object and its checksum, of the kind its upload asked
        for: COMPOSITE from the parts', FULL_OBJECT computed as the bytes stream (checked
        against the one Complete sends, if it does)."""
        if upload.checksum is None:
            return data, lambda: None
        algorithm, kind = upload.checksum.split(" ")
        sent = c.request.headers.get(checksums.PREFIX + algorithm)
        if kind == "COMPOSITE":
            named = [(p.checksum or " ").split(" ") for p in parts]
            if any(name != algorithm for name, _ in named):
                return data, lambda: None  # a part staged without it: none, not a wrong one
            values = [value for _, value in named]
            kept = checksums.Kept(algorithm, kind, checksums.composite(algorithm, values))
            if sent is not None and sent != kept.value:
                raise S3Error("BadDigest", f"the parts' {algorithm.upper()} is not {sent}")
            return data, lambda: kept
        if sent is not None:
            digest = checksums.decode(algorithm, sent)
            checked = checksums.checked(data, checksums.Declared(algorithm, lambda: digest))
            return checked, lambda: checksums.Kept(algorithm, kind, sent)
        found: list[str] = []
        hashed = checksums.hashed(data, algorithm, found.append)
        return hashed, lambda: checksums.Kept(algorithm, kind, found[0])

    def _completed(self, c: Call, etag: str, kept: checksums.Kept | None = None) -> web.Response:
        response = _xml(
            document(
                "CompleteMultipartUploadResult",
                el("Location", f"/{c.bucket}/{c.key}"),
                el("Bucket", c.bucket),
                el("Key", c.key),
                el("ETag", etag),
                el(kept.element, kept.value) if kept else None,
                el("ChecksumType", kept.kind) if kept else None,
            )
        )
        response.headers.update(encryption.sealing_headers(c.sealing))
        return response

    async def abort_upload(self, c: Call) -> web.Response:
        await self.staging.remove(await self._upload(c))
        return web.Response(status=204)

    async def list_parts(self, c: Call) -> web.Response:
        upload = await self._upload(c)
        after = _int_param(c.query.get("part-number-marker"), "part-number-marker", 0)
        max_parts = min(_int_param(c.query.get("max-parts"), "max-parts", 1000), 1000)
        parts = [p for p in await self.staging.parts(upload) if p.number > after]
        shown, truncated = parts[:max_parts], len(parts) > max_parts
        return _xml(
            document(
                "ListPartsResult",
                el("Bucket", c.bucket),
                el("Key", c.key),
                el("UploadId", upload.upload_id),
                el("PartNumberMarker", after),
                el("NextPartNumberMarker", shown[-1].number) if shown else None,
                el("MaxParts", max_parts),
                el("IsTruncated", truncated),
                self._owner(c, upload.owner),
                el("StorageClass", "STANDARD"),
                nodes(
                    el(
                        "Part",
                        el("PartNumber", p.number),
                        el("LastModified", iso_time(p.mtime_ns)),
                        el("ETag", p.etag),
                        el("Size", p.size),
                        _part_checksum_xml(p),
                    )
                    for p in shown
                ),
            )
        )

    async def list_uploads(self, c: Call) -> web.Response:
        await self._bucket_entry(c)
        prefix = c.query.get("prefix", "")
        uploads = [u for u in await self.staging.uploads(c.bucket) if u.key.startswith(prefix)]
        return _xml(
            document(
                "ListMultipartUploadsResult",
                el("Bucket", c.bucket),
                el("KeyMarker", ""),
                el("UploadIdMarker", ""),
                el("Prefix", prefix),
                el("MaxUploads", 1000),
                el("IsTruncated", False),
                nodes(
                    el(
                        "Upload",
                        el("Key", u.key),
                        el("UploadId", u.upload_id),
                        el("Initiator", el("ID", u.owner), el("DisplayName", u.owner)),
                        el("Owner", el("ID", u.owner), el("DisplayName", u.owner)),
                        el("StorageClass", "STANDARD"),
                        el("Initiated", iso_time(u.initiated_ns)),
                    )
                    for u in uploads
                ),
            )
        )


async def _from_client(body: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """A request body whose client may hang up: that is the client's error, and must not
    reach a volume's write as an OSError (which it would report as a server fault)."""
    try:
        async for chunk in body:
            BYTES_IN.inc(len(chunk))
            yield chunk
    except (ConnectionError, ClientError) as exc:
        raise S3Error("IncompleteBody", "the client closed the connection mid-body") from exc


def _part_checksum_xml(part: Part) -> Xml | None:
    if part.checksum is None:
        return None
    algorithm, _, value = part.checksum.partition(" ")
    return el("Checksum" + algorithm.upper(), value)


def _checksum_mode(request: web.Request) -> bool:
    return request.headers.get("x-amz-checksum-mode", "").upper() == "ENABLED"


def _delete_conditions(headers: Mapping[str, str]) -> Callable[[Entry], bool] | None:
    """DeleteObject's conditions besides If-Match: x-amz-if-match-last-modified-time and
    x-amz-if-match-size (an object that is not there meets them)."""
    when = _header_time(headers.get("x-amz-if-match-last-modified-time"))
    size = headers.get("x-amz-if-match-size")
    if when is None and size is None:
        return None

    def holds(entry: Entry) -> bool:
        same_time = when is None or entry.mtime_ns // 1_000_000_000 == int(when)
        return same_time and (size is None or size.strip() == str(entry.size))

    return holds


def _bypass(c: Call) -> bool:
    return c.request.headers.get("x-amz-bypass-governance-retention", "").lower() == "true"


def _is_form_post(request: web.Request, key: str) -> bool:
    return request.method == "POST" and not key and request.content_type == "multipart/form-data"


def _xml(body: bytes, status: int = 200) -> web.Response:
    return web.Response(status=status, body=body, content_type="application/xml")


def _versions_result(
    c: Call, key_marker: str, next_key: str | None, next_vid: str | None, max_keys: int,
    truncated: bool, *listed: Xml,
) -> web.Response:  # fmt: skip
    """A ListObjectVersions answer: the request's own parameters, then what it lists."""
    q = c.query
    prefix, delimiter = q.get("prefix", ""), q.get("delimiter", "")
    encode = q.get("encoding-type") == "url"
    return _xml(
        document(
            "ListVersionsResult",
            el("Name", c.bucket),
            el("Prefix", _enc(prefix, encode)),
            el("Delimiter", _enc(delimiter, encode)) if delimiter else None,
            el("KeyMarker", _enc(key_marker, encode)),
            el("VersionIdMarker", q.get("version-id-marker", "")),
            el("NextKeyMarker", _enc(next_key, encode)) if next_key else None,
            el("NextVersionIdMarker", next_vid) if next_key and next_vid else None,
            el("MaxKeys", max_keys),
            el("EncodingType", "url") if encode else None,
            el("IsTruncated", truncated),
            *listed,
        )
    )


async def _read_document(request: web.Request) -> bytes:
    body = await request.content.read(MAX_DOCUMENT + 1)
    if len(body) > MAX_DOCUMENT:
        raise S3Error("MalformedXML", "the XML document is too large")
    return body


def _content_md5(value: str | None) -> bytes | None:
    if value is None:
        return None
    try:
        digest = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        digest = b""
    if len(digest) != 16:
        raise S3Error("InvalidDigest", "the Content-MD5 you specified is not valid")
    return digest


def _copy_range(header: str, size: int) -> tuple[int, int]:
    """x-amz-copy-source-range: unlike Range, only 'bytes=first-last' inside the object."""
    first, sep, last = header.removeprefix("bytes=").partition("-")
    if not header.startswith("bytes=") or not sep or not first.isdigit() or not last.isdigit():
        raise S3Error("InvalidArgument", "x-amz-copy-source-range must be bytes=first-last")
    start, end = int(first), int(last)
    if start > end or end >= size:
        raise S3Error("InvalidRange", f"the range {header} is not inside the {size} byte source")
    return start, end - start + 1


def _encode_token(key: str) -> str:
    return base64.urlsafe_b64encode(key.encode()).decode()


def _decode_token(token: str) -> str:
    try:
        return base64.urlsafe_b64decode(token.encode()).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise S3Error("InvalidArgument", "the continuation token provided is incorrect") from None


SIGNED_QUERY = frozenset(
    {"X-Amz-Algorithm", "X-Amz-Credential", "X-Amz-Signature", "AWSAccessKeyId", "Signature"}
)


def _signed(headers: Mapping[str, str], query: list[tuple[str, str]]) -> bool:
    """Whether a request carries credentials (which then must verify)."""
    return "authorization" in headers or any(name in SIGNED_QUERY for name, _ in query)


def _valid_bucket_name(name: str) -> bool:
    return (
        3 <= len(name) <= 63
        and name[0].isalnum()
        and name[-1].isalnum()
        and all(ch.islower() or ch.isdigit() or ch in "-." for ch in name)
        and ".." not in name
    )
