"""The tamper-evident audit log (core layer): every access and policy decision, hash-chained.

Whoever calls ``AuditLog.record`` (the governed namespace for every protocol, the fabric
server for site refusals) pays for a tuple appended to an in-memory buffer; a background
thread turns batches of them into JSON lines, chains them, writes them to the current
segment file under ``<data_dir>/audit/`` and fsyncs once per batch (every ``interval``
seconds or ``batch_size`` records, whichever comes first).

Why a thread and not an asyncio task: fsync blocks, so a task would have to hop to a
thread for every batch anyway; ``record`` is also called from code that is not on the
event loop (FUSE and S3 worker threads, scripts); and a busy event loop must not delay the
durability of what it already recorded.

Format: a segment ``audit-<first seq>.jsonl`` starts with a header line (``first_seq``,
``prev``, ``keyed``) and holds one record per line: seq, time_ns, site, protocol, user,
op, path, nbytes, result, detail, ``prev`` (the hash of the record before) and ``hash``,
a 256-bit BLAKE2b of the line's exact bytes without its hash field. Rotation by size
starts a new segment whose header (itself hashed) and first record carry the last hash
of the segment before, so removing a whole segment breaks the chain where it was.
Closed segments can be gzipped (``archive``) and still verify.

Threat model. The chain detects any edit, removal or reordering of records by someone who
does not rewrite everything after the change. With a plain hash, an attacker who can
write the log can recompute the chain from the edit to the end, and truncating the tail
leaves a shorter chain that is still whole. Two things close that gap, and both work:
*anchoring* the head (``loomfs audit head`` prints seq and hash; keep them elsewhere,
then ``verify --anchor SEQ:HASH`` proves that record and everything before it is intact),
and a *key* (``[audit] key_file``): the hashes become keyed BLAKE2b MACs, which an attacker
without the key cannot recompute; a segment that claims to be unkeyed while a key is
configured is reported as a downgrade.

Crashes. Batches are appended with one write each; a crash can at worst leave the last
line unfinished (no newline: power loss, or a process killed mid-write). That record was
never acknowledged (``flush`` returns only after the fsync). On restart the writer keeps
the torn bytes as they are and starts a new segment whose first record, ``audit.torn``,
names the segment and the number of torn bytes; ``verify`` reports such a tail as *torn*,
distinctly from tampering, and only where a recovery record (or the end of the log)
accounts for it.
"""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import hashlib
import heapq
import json
import logging
import os
import re
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from prometheus_client import Counter, Gauge, Histogram

from ..errors import BackendUnavailable, ConfigError, InvalidArgument
from .streams import fsync_dir
from .types import Principal

log = logging.getLogger(__name__)

RECORDS = Counter("loomfs_audit_records_total", "Audit records written and fsynced")
BATCHES = Counter("loomfs_audit_batches_total", "Audit batches written (one fsync each)")
FLUSH_SECONDS = Histogram(
    "loomfs_audit_flush_seconds",
    "Time to encode, hash, write and fsync one audit batch",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
)
BUFFER_DEPTH = Gauge("loomfs_audit_buffer_depth", "Audit records waiting to be written")

GENESIS = "0" * 64
TORN_OP = "audit.torn"
#: audit-<first seq>[-<n>].jsonl[.gz]: -n when a segment with that first seq exists
#: already (the log went on after a torn tail in a segment that held no whole record)
_SEGMENT = re.compile(r"^audit-(\d{16})(?:-(\d+))?\.jsonl(\.gz)?$")
_HASH_FIELD = ',"hash":"'
_escape = json.encoder.encode_basestring_ascii  # what json.dumps uses for str (C, fast)
_EMPTY = '""'
#: a record's path and detail are cut to this many characters (a record stays one line
#: that a reader can take in at once)
MAX_FIELD = 4096


class AuditSink(Protocol):
    """What the governed namespace and the servers record into; never blocks for I/O."""

    def record(
        self,
        who: Principal,
        op: str,
        path: str,
        result: str,
        *,
        nbytes: int = 0,
        detail: str = "",
    ) -> None: ...


@dataclass(frozen=True, slots=True)
class AuditRecord:
    seq: int
    time_ns: int
    site: str
    protocol: str
    user: str
    op: str
    path: str
    nbytes: int
    result: str
    detail: str
    prev: str
    hash: str

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}


@dataclass(frozen=True, slots=True)
class Finding:
    """One place where the log is not what was written: ``kind`` is edited, removed,
    reordered, truncated or downgraded (tampering), or torn (a crash, not tampering)."""

    kind: str
    segment: str
    line: int
    seq: int | None
    message: str

    @property
    def tampering(self) -> bool:
        return self.kind != "torn"

    def __str__(self) -> str:
        seq = f" seq {self.seq}" if self.seq is not None else ""
        return f"{self.kind}: {self.segment} line {self.line}{seq}: {self.message}"


@dataclass(slots=True)
class VerifyReport:
    segments: int = 0
    records: int = 0
    head_seq: int = 0
    head_hash: str = GENESIS
    findings: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No tampering found (a torn tail from a crash is reported but is not a break)."""
        return not any(f.tampering for f in self.findings)


def load_key(path: Path | None) -> bytes | None:
    """The HMAC key from ``[audit] key_file``: at least 16 bytes of anything."""
    if path is None:
        return None
    try:
        key = path.read_bytes().strip()
    except OSError as exc:
        raise ConfigError(f"cannot read the audit key file {path}: {exc.strerror}") from None
    if len(key) < 16:
        raise ConfigError(f"the audit key in {path} is too short (at least 16 bytes)")
    # BLAKE2b takes keys up to 64 bytes; a longer one is reduced, not refused
    return key if len(key) <= 64 else hashlib.blake2b(key).digest()


def _digest(body: bytes, key: bytes | None) -> str:
    return hashlib.blake2b(body, digest_size=32, key=key or b"").hexdigest()


def _seal(fields: dict[str, Any], key: bytes | None) -> str:
    """The line for ``fields``: canonical JSON with its hash appended as the last field."""
    body = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return f'{body[:-1]}{_HASH_FIELD}{_digest(body.encode(), key)}"}}\n'


# what record() buffers: time_ns, site, protocol, user, op, path, nbytes, result, detail
_Pending = tuple[int, str, str, str, str, str, int, str, str]


def _record_line(
    seq: int, prev: str, item: _Pending, key: bytes | None, escaped: dict[str, str]
) -> str:
    """The sealed line of one record: byte for byte what ``_seal`` makes of its fields,
    built without the generic encoder (this is the writer's hot loop). ``escaped`` caches
    the JSON form of the few strings that repeat (sites, users, ops, results)."""
    time_ns, site, protocol, user, op, path, nbytes, result, detail = item

    def esc(text: str) -> str:
        found = escaped.get(text)
        if found is None:
            found = _escape(text)
            if len(escaped) < 10_000:
                escaped[text] = found
        return found

    body = (
        f'{{"detail":{_escape(detail) if detail else _EMPTY},"nbytes":{int(nbytes)},'
        f'"op":{esc(op)},"path":{_escape(path)},"prev":"{prev}","protocol":{esc(protocol)},'
        f'"result":{esc(result)},"seq":{seq},"site":{esc(site)},"time_ns":{time_ns},'
        f'"user":{esc(user)}}}'
    )
    return f'{body[:-1]}{_HASH_FIELD}{_digest(body.encode(), key)}"}}\n'


def _coerce(item: _Pending) -> _Pending:
    """A record whose fields had the wrong types, made encodable rather than lost."""
    time_ns, site, protocol, user, op, path, nbytes, result, detail = item
    try:
        size = int(nbytes)
    except (TypeError, ValueError):
        size = -1
    return (int(time_ns), str(site), str(protocol), str(user), str(op), str(path), size,
            str(result), str(detail))  # fmt: skip


def _unseal(line: str, key: bytes | None) -> tuple[dict[str, Any], str, bool]:
    """(fields, stored hash, whether the hash matches the bytes); ValueError if the line
    is not a sealed JSON object at all."""
    at = line.rfind(_HASH_FIELD)
    if at < 0 or not line.endswith('"}'):
        raise ValueError("no hash field")
    stored = line[at + len(_HASH_FIELD) : -2]
    body = line[:at] + "}"
    fields = json.loads(body)
    if not isinstance(fields, dict):
        raise ValueError("not an object")
    return fields, stored, _digest(body.encode(), key) == stored


def _new_segment(directory: Path, first_seq: int) -> Path:
    """A segment name not taken yet (archived segments included)."""
    taken = {p.name.removesuffix(".gz") for p in AuditReader(directory).segments()}
    name, n = f"audit-{first_seq:016d}.jsonl", 0
    while name in taken:
        n += 1
        name = f"audit-{first_seq:016d}-{n}.jsonl"
    return directory / name


def _segment_lines(path: Path) -> Iterator[bytes]:
    """A segment's lines (the newline kept), archived (gzip) or not."""
    if path.suffix == ".gz":
        with gzip.open(path, "rb") as archived:
            yield from archived
    else:
        with path.open("rb") as plain:
            yield from plain


_HEADER_START = b'{"audit":'


class _Segment(NamedTuple):
    name: str
    header: dict[str, Any] | None  # None: missing or not readable
    header_ok: bool
    first_line: int  # line number of lines[0]: 2 after a header line, else 1
    lines: list[bytes]  # complete lines after the header, without newlines
    torn: bytes  # bytes after the last newline


def _read_segment(path: Path, key: bytes | None) -> _Segment:
    *lines, torn = b"".join(_segment_lines(path)).split(b"\n")
    header: dict[str, Any] | None = None
    header_ok = False
    if lines and lines[0].startswith(_HEADER_START):
        with contextlib.suppress(ValueError, UnicodeDecodeError):
            header, _, header_ok = _unseal(lines[0].decode(), key)
        return _Segment(path.name, header, header_ok, 2, lines[1:], torn)
    return _Segment(path.name, None, False, 1, lines, torn)


class AuditReader:
    """Reads an audit directory: the segments in order, ``verify``, ``query``, ``head``.

    Needs no lock: it reads only complete lines, and the writer only appends."""

    def __init__(self, directory: Path, key: bytes | None = None) -> None:
        self.directory = directory
        self.key = key

    def segments(self) -> list[Path]:
        found = []
        with contextlib.suppress(FileNotFoundError):
            for path in self.directory.iterdir():
                match = _SEGMENT.match(path.name)
                if match:
                    found.append((int(match.group(1)), int(match.group(2) or 0), path))
        return [path for *_, path in sorted(found)]

    # -- verify ----------------------------------------------------------------------------

    def verify(self, anchor: tuple[int, str] | None = None) -> VerifyReport:
        """Check every segment's header and every record's hash and link; the findings
        name segment, line (1 = the header) and seq of each break."""
        report = VerifyReport()
        paths = self.segments()
        expected_prev: str | None = GENESIS
        last_seq = 0
        anchor_seen = False
        for index, path in enumerate(paths):
            segment = _read_segment(path, self.key)
            report.segments += 1
            if segment.header is None and not segment.lines:  # a crash while rotating
                self._explain_torn(segment, paths[index + 1 :], report)
                continue
            expected_prev, last_seq = self._verify_header(segment, expected_prev, last_seq, report)
            by_hash: dict[str, tuple[int, int]] = {}  # hash -> (line, seq)
            # (seq, prev, hash, hash matches) per line: what the links need, no more
            parsed: list[tuple[int, object, str, bool] | None] = []
            for number, raw in enumerate(segment.lines, start=segment.first_line):
                try:
                    fields, stored, good = _unseal(raw.decode(), self.key)
                    seq = int(fields["seq"])
                except (ValueError, KeyError, TypeError, UnicodeDecodeError):
                    report.findings.append(
                        Finding("edited", segment.name, number, None, "not a sealed record")
                    )
                    parsed.append(None)
                    continue
                if not good:
                    report.findings.append(
                        Finding("edited", segment.name, number, seq, "hash does not match")
                    )
                by_hash[stored] = (number, seq)
                parsed.append((seq, fields.get("prev"), stored, good))
            before_line = segment.first_line - 1
            for number, item in enumerate(parsed, start=segment.first_line):
                if item is None:  # unreadable: the link after it can't be checked
                    expected_prev, last_seq, before_line = None, last_seq + 1, number
                    continue
                seq, prev, stored, good = item
                if not good:
                    # its fields can't be trusted; it takes the next slot, and the record
                    # after it links to the hash it still carries
                    seq = last_seq + 1
                elif expected_prev is not None and prev != expected_prev:
                    self._explain_link(
                        segment.name, number, seq, prev, last_seq, before_line, by_hash, report
                    )
                if anchor is not None and seq == anchor[0]:
                    anchor_seen = True
                    if stored != anchor[1]:
                        report.findings.append(
                            Finding("edited", segment.name, number, seq, "differs from anchor")
                        )
                expected_prev, last_seq, before_line = stored, seq, number
                report.records += 1
            if segment.torn:
                self._explain_torn(segment, paths[index + 1 :], report)
        report.head_seq, report.head_hash = last_seq, expected_prev or "?"
        if anchor is not None and not anchor_seen:
            report.findings.append(
                Finding("removed", "-", 0, anchor[0], "the anchored record is gone")
            )
        report.findings = _merge(report.findings)
        return report

    def _verify_header(
        self, segment: _Segment, expected_prev: str | None, last_seq: int, report: VerifyReport
    ) -> tuple[str | None, int]:
        """Check a segment's header against the segment before; returns where its chain
        starts (its own ``prev``, so one finding is made per break, not one per line)."""
        header = segment.header
        if header is None:
            report.findings.append(Finding("edited", segment.name, 1, None, "no valid header"))
            return expected_prev, last_seq
        first = int(header.get("first_seq", 0))
        if self.key is not None and not header.get("keyed"):
            report.findings.append(
                Finding("downgraded", segment.name, 1, None, "unkeyed, but a key is configured")
            )
        elif not segment.header_ok:
            report.findings.append(
                Finding("edited", segment.name, 1, None, "header hash does not match")
            )
        if self.key is None and header.get("keyed"):
            raise ConfigError(
                f"the audit log in {self.directory} is keyed: verify it with [audit] key_file"
            )
        start = str(header.get("prev", ""))
        if (expected_prev is not None and start != expected_prev) or first != last_seq + 1:
            if first > last_seq + 1:
                where = "before it" if last_seq == 0 else f"after seq {last_seq}"
                message = f"seq {last_seq + 1}..{first - 1} missing {where} (segment removed?)"
                report.findings.append(Finding("removed", segment.name, 1, first, message))
            elif first <= last_seq:
                message = f"starts at seq {first}, but seq {last_seq} came before"
                report.findings.append(Finding("reordered", segment.name, 1, first, message))
            else:
                message = "does not chain to the segment before"
                report.findings.append(Finding("edited", segment.name, 1, first, message))
        return start, first - 1

    @staticmethod
    def _explain_link(
        name: str,
        number: int,
        seq: int,
        prev: object,
        last_seq: int,
        before_line: int,
        by_hash: dict[str, tuple[int, int]],
        report: VerifyReport,
    ) -> None:
        """The record at ``number`` does not link to the one before it: say why."""
        target = by_hash.get(prev) if isinstance(prev, str) else None
        if target is not None:
            message = f"follows seq {target[1]} (line {target[0]}), not seq {last_seq}"
            report.findings.append(Finding("reordered", name, number, seq, message))
        elif seq == last_seq + 1:
            # the seq fits but the link does not: the record before was rewritten and
            # its hash recomputed
            message = "changed and re-hashed (the next record's link disagrees)"
            report.findings.append(Finding("edited", name, before_line, last_seq, message))
        elif seq > last_seq + 1:
            message = f"seq {last_seq + 1}..{seq - 1} missing before this record"
            report.findings.append(Finding("removed", name, number, seq, message))
        else:
            message = f"seq {seq} after seq {last_seq}"
            report.findings.append(Finding("reordered", name, number, seq, message))

    def _explain_torn(self, segment: _Segment, later: list[Path], report: VerifyReport) -> None:
        line = len(segment.lines) + segment.first_line
        if not later:
            message = (
                f"{len(segment.torn)} bytes of an unfinished record: a crash (never"
                " acknowledged), or a write under way while this ran"
            )
            report.findings.append(Finding("torn", segment.name, line, None, message))
            return
        recovery = _read_segment(later[0], self.key)
        expected = _torn_detail(segment.name, len(segment.torn))
        first = _first_record(recovery)
        if first is not None and first.get("op") == TORN_OP and first.get("detail") == expected:
            message = f"{len(segment.torn)} bytes of an unfinished record, recovered after a crash"
            report.findings.append(Finding("torn", segment.name, line, None, message))
        else:
            message = "ends mid-record and no recovery record accounts for it"
            report.findings.append(Finding("truncated", segment.name, line, None, message))

    # -- query -----------------------------------------------------------------------------

    def records(self, since: int | None = None) -> Iterator[AuditRecord]:
        """Every complete record, in log order (no verification). With ``since``,
        segments that ended before it are skipped unread: every record of a segment was
        recorded before the next segment's header was written."""
        paths = self.segments()
        for index, path in enumerate(paths):
            if since is not None and index + 1 < len(paths):
                started = _header_time(paths[index + 1])
                if started is not None and started < since:
                    continue
            for raw in _segment_lines(path):
                if not raw.endswith(b"\n") or raw.startswith(_HEADER_START):
                    continue
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    fields, stored, _ = _unseal(raw[:-1].decode(), self.key)
                    yield AuditRecord(**fields, hash=stored)

    def query(
        self,
        *,
        user: str | None = None,
        site: str | None = None,
        op: str | None = None,
        path_prefix: str | None = None,
        since: int | None = None,
        until: int | None = None,
        result: str | None = None,
        protocol: str | None = None,
    ) -> Iterator[AuditRecord]:
        """Records matching every filter given (times in ns since the epoch, ``until``
        exclusive; ``path_prefix`` matches that path and everything below it)."""
        top = path_prefix.rstrip("/") if path_prefix else None
        below = None if top is None else top + "/"
        for r in self.records(since):
            if (
                (user is None or r.user == user)
                and (site is None or r.site == site)
                and (op is None or r.op == op)
                and (protocol is None or r.protocol == protocol)
                and (result is None or r.result == result)
                and (since is None or r.time_ns >= since)
                and (until is None or r.time_ns < until)
                and (below is None or r.path == top or r.path.startswith(below))
            ):
                yield r

    def head(self) -> tuple[int, str]:
        """(seq, hash) of the newest complete record: what to anchor elsewhere."""
        for path in reversed(self.segments()):
            segment = _read_segment(path, self.key)
            for raw in reversed(segment.lines):
                with contextlib.suppress(ValueError, KeyError, UnicodeDecodeError):
                    fields, stored, _ = _unseal(raw.decode(), self.key)
                    return int(fields["seq"]), stored
            if segment.header is not None:
                return int(segment.header["first_seq"]) - 1, str(segment.header["prev"])
        return 0, GENESIS


def merged(readers: Sequence[AuditReader], **filters: Any) -> Iterator[tuple[int, AuditRecord]]:
    """The records of several chains (one per gateway of a hub, each in its own
    directory) that match ``filters`` (``AuditReader.query``'s), merged by time: (the
    index of its chain in ``readers``, the record)."""

    def chain(index: int) -> Iterator[tuple[int, AuditRecord]]:
        return ((index, record) for record in readers[index].query(**filters))

    streams = [chain(index) for index in range(len(readers))]
    yield from heapq.merge(*streams, key=lambda item: item[1].time_ns)


def _header_time(path: Path) -> int | None:
    """When a segment was started, from its header (None where it has none)."""
    first = next(_segment_lines(path), b"")
    if not first.startswith(_HEADER_START):
        return None
    with contextlib.suppress(ValueError, UnicodeDecodeError):
        return int(_unseal(first.rstrip(b"\n").decode(), None)[0]["time_ns"])
    return None


def _torn_detail(segment: str, nbytes: int) -> str:
    return f"{segment}: {nbytes} torn bytes after the last complete record"


def _first_record(segment: _Segment) -> dict[str, Any] | None:
    if not segment.lines:
        return None
    with contextlib.suppress(ValueError, UnicodeDecodeError):
        return _unseal(segment.lines[0].decode(), None)[0]
    return None


def _merge(findings: list[Finding]) -> list[Finding]:
    """One finding for a run of the same kind on the same or consecutive lines (a swap of
    two records breaks three links; it is one reordering)."""
    merged: list[Finding] = []
    last_line = -1
    for finding in findings:
        if (
            merged
            and finding.kind == merged[-1].kind
            and finding.segment == merged[-1].segment
            and finding.line <= last_line + 1
        ):
            last_line = finding.line
            continue
        merged.append(finding)
        last_line = finding.line
    return merged


def parse_anchor(text: str) -> tuple[int, str]:
    seq, sep, digest = text.partition(":")
    if not sep or not seq.isdigit() or not re.fullmatch(r"[0-9a-f]{64}", digest):
        raise InvalidArgument(f"an anchor is SEQ:HASH as `loomfs audit head` prints, not {text!r}")
    return int(seq), digest


def archive(directory: Path) -> list[Path]:
    """Gzip every closed segment (all but the newest plain one), atomically: the archived
    copy is durable before the original goes. Returns the new files."""
    plain = [p for p in AuditReader(directory).segments() if p.suffix == ".jsonl"]
    made = []
    for path in plain[:-1]:
        target = path.with_name(path.name + ".gz")
        temp = path.with_name(path.name + ".gz.tmp")
        with path.open("rb") as src, temp.open("wb") as raw:
            with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
                while chunk := src.read(1 << 20):
                    gz.write(chunk)
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(temp, target)
        fsync_dir(directory)
        path.unlink()
        made.append(target)
    fsync_dir(directory)
    return made


class AuditLog:
    """The writer of one audit directory (one process at a time: it holds a lock file).

    ``record`` appends to a buffer and returns; past ``max_buffer`` waiting records it
    blocks until the writer catches up rather than drop one, and if the writer cannot
    write at all it raises ``BackendUnavailable``: an access is never left unrecorded
    without someone being told. ``flush`` waits until everything recorded before it is
    on disk; ``close`` flushes everything."""

    def __init__(
        self,
        directory: Path,
        *,
        site: str,
        key: bytes | None = None,
        segment_size: int = 16 << 20,
        batch_size: int = 1000,
        interval: float = 0.1,
        max_buffer: int = 100_000,
    ) -> None:
        if segment_size <= 0 or batch_size <= 0 or max_buffer < batch_size or interval <= 0:
            raise ConfigError("audit: sizes and the interval must be positive")
        self.directory = directory
        self.site = site
        self.key = key
        self.segment_size = segment_size
        self.batch_size = batch_size
        self.interval = interval
        self.max_buffer = max_buffer
        # record() takes only the plain lock (a C call); waiting for the writer goes
        # through the condition on the same lock, and the writer sleeps on an event
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._wake = threading.Event()
        self._buffer: list[_Pending] = []
        self._queued = 0  # records ever buffered
        self._durable = 0  # of those, written and fsynced
        self._closing = False
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._lock_fd: int | None = None
        self._fd: int | None = None
        self._size = 0
        self._seq = 0
        self._last = GENESIS
        self._escaped: dict[str, str] = {}

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> AuditLog:
        self.directory.mkdir(parents=True, exist_ok=True)
        lock_fd = os.open(self.directory / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(lock_fd)
            raise ConfigError(
                f"another process writes the audit log in {self.directory} "
                "(two sites share a data directory?)"
            ) from None
        self._lock_fd = lock_fd
        torn = self._resume()
        if torn is not None:
            self.record(
                Principal(user="system", site=self.site, protocol="internal"),
                TORN_OP,
                "",
                "torn",
                detail=torn,
            )
        self._thread = threading.Thread(target=self._run, name="audit-writer", daemon=True)
        self._thread.start()
        return self

    def _resume(self) -> str | None:
        """Continue the chain where the newest segment ends; a torn tail is left as it is
        (evidence) and the log goes on in a new segment. Returns the recovery detail."""
        paths = AuditReader(self.directory, self.key).segments()
        if not paths:
            return None
        newest = _read_segment(paths[-1], self.key)
        self._seq, self._last = AuditReader(self.directory, self.key).head()
        unfinished = newest.torn or (newest.header is None and not newest.lines)
        if paths[-1].suffix == ".jsonl" and not unfinished:
            self._open(paths[-1])
            return None
        if unfinished:
            log.warning(
                "audit log ends in a torn record (a crash); continuing in a new segment",
                extra={"segment": newest.name, "torn_bytes": len(newest.torn)},
            )
            return _torn_detail(newest.name, len(newest.torn))
        return None

    def close(self) -> None:
        """Write everything recorded so far, then stop the writer and release the lock."""
        with self._lock:
            self._closing = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        if self._buffer:
            why = self._error or "the log was never started"
            raise BackendUnavailable(
                f"audit log: {len(self._buffer)} records could not be written: {why}"
            )

    def __enter__(self) -> AuditLog:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- recording -------------------------------------------------------------------------

    def record(
        self,
        who: Principal,
        op: str,
        path: str,
        result: str,
        *,
        nbytes: int = 0,
        detail: str = "",
    ) -> None:
        # a spoke's user is recorded with the protocol it reached the spoke by (the site
        # column says it came over the fabric link)
        item = (
            time.time_ns(), who.site, who.forwarded or who.protocol, who.user, op,
            path[:MAX_FIELD], nbytes, result, detail[:MAX_FIELD],
        )  # fmt: skip
        with self._lock:
            if self._closing:
                raise BackendUnavailable("audit log is closed")
            self._buffer.append(item)
            self._queued += 1
            depth = len(self._buffer)
        if depth == self.batch_size:
            self._wake.set()
        if depth >= self.max_buffer:
            self._wait_for_room()

    def _wait_for_room(self) -> None:
        """Back-pressure: wait for the writer to drain the buffer; fail loudly where it
        cannot write at all, rather than drop a record."""
        with self._cond:
            while len(self._buffer) >= self.max_buffer:
                if self._error is not None or self._thread is None:
                    raise BackendUnavailable(f"audit log cannot be written: {self._error}")
                self._wake.set()
                self._cond.wait(self.interval)

    def flush(self, timeout: float | None = None) -> int:
        """Block until every record recorded before this call is fsynced; returns the
        seq of the newest durable record."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            target = self._queued
            self._wake.set()
            while self._durable < target:
                if self._thread is None:
                    raise BackendUnavailable("audit log: flush before start or after close")
                if self._error is not None:
                    raise BackendUnavailable(f"audit log cannot be written: {self._error}")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise BackendUnavailable("audit log: flush timed out")
                self._cond.wait(left)
            return self._seq

    # -- the writer thread -----------------------------------------------------------------

    def _run(self) -> None:
        while True:
            # woken by a full batch, a flush, back-pressure or close; else every interval
            self._wake.wait(self.interval)
            self._wake.clear()
            with self._lock:
                batch, self._buffer = self._buffer, []
                closing = self._closing
            BUFFER_DEPTH.set(len(batch))
            if batch:
                self._write_batch(batch)
            if closing:
                with self._lock:
                    if not self._buffer or self._error is not None:
                        return

    def _write_batch(self, batch: list[_Pending]) -> None:
        started = time.perf_counter()
        seq, last = self._seq, self._last
        try:
            if self._fd is None or self._size >= self.segment_size:
                self._rotate()
            lines = []
            for item in batch:
                seq += 1
                try:
                    line = _record_line(seq, last, item, self.key, self._escaped)
                except (TypeError, ValueError):  # a caller passed a non-str or non-int
                    line = _record_line(seq, last, _coerce(item), self.key, self._escaped)
                last = line[-67:-3]  # the 64 hex digits of the hash just sealed
                lines.append(line)
            self._append("".join(lines).encode())
        except Exception as exc:  # the writer must outlive any failure, and say so
            log.exception("audit batch not written; retrying", extra={"error": str(exc)})
            with self._cond:
                self._error = exc
                self._buffer[:0] = batch  # keep the order; retried on the next round
                self._cond.notify_all()
            time.sleep(self.interval)
            return
        self._seq, self._last = seq, last
        FLUSH_SECONDS.observe(time.perf_counter() - started)
        RECORDS.inc(len(batch))
        BATCHES.inc()
        with self._cond:
            self._error = None
            self._durable += len(batch)
            self._cond.notify_all()

    def _append(self, data: bytes) -> None:
        """Append and fsync all of ``data`` or, on failure, none of it (a retried batch
        must not leave a half batch before it)."""
        assert self._fd is not None
        view = memoryview(data)
        try:
            while view:
                written = os.write(self._fd, view)
                view = view[written:]
            os.fsync(self._fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self._size)
            raise
        self._size += len(data)

    def _rotate(self) -> None:
        """Start the segment the next record goes to; its header names the chain's
        state so far and is durable (with the directory entry) before records follow."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        path = _new_segment(self.directory, self._seq + 1)
        header = _seal(
            {"audit": 1, "first_seq": self._seq + 1, "prev": self._last,
             "keyed": self.key is not None, "time_ns": time.time_ns()},
            self.key,
        )  # fmt: skip
        fd = self._open(path)
        try:
            self._append(header.encode())
            fsync_dir(self.directory)
        except OSError:
            # no segment without its header: the next try starts this one afresh
            os.close(fd)
            self._fd = None
            path.unlink(missing_ok=True)
            raise

    def _open(self, path: Path) -> int:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
        self._size = os.fstat(self._fd).st_size
        return self._fd
