"""The REST wire format (protocol layer): entries as JSON, errors as a status table.

Shared by the server and the client so that an error raised in the hub comes out of the
client as the same ``loomfs.errors`` class, and an entry round-trips unchanged.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from ..core.types import Change, ChangeOp, Entry, EntryKind, WriteTags
from ..errors import (
    BY_CODE,
    AlreadyExists,
    AuthenticationFailed,
    BackendUnavailable,
    Conflict,
    CrossesVolume,
    DirectoryNotEmpty,
    InsufficientStorage,
    InvalidArgument,
    InvalidPath,
    IsADirectory,
    LoomError,
    NotADirectory,
    NotFound,
    NotSupported,
    PermissionDenied,
    RangeNotSatisfiable,
)
from ..namespace.listing import ListingDelta

API = "/v1"
ADMIN = f"{API}/admin"  # the hub's admin API (``rest.admin``)
#: the route variable a namespace path is matched by: any character, a newline too (a
#: name may hold one; aiohttp's default ``.*`` would leave such a path unreachable)
PATH = "{path:[\\s\\S]*}"
# a spoke forwards the end user it serves to its hub with these (see fabric.server)
USER_HEADER = "X-Loomfs-User"
PROTOCOL_HEADER = "X-Loomfs-Protocol"
# a write's idempotency key (the IETF draft's name): its repeat gets the first answer
WRITE_ID_HEADER = "Idempotency-Key"
#: the tags a write sets with its content (``Namespace.write``), as JSON
TAGS_HEADER = "X-Loomfs-Tags"

# The one table from error class to HTTP status; subclasses not listed use their base's.
STATUS: dict[type[LoomError], int] = {
    NotFound: 404,
    AlreadyExists: 409,
    NotADirectory: 409,
    IsADirectory: 409,
    DirectoryNotEmpty: 409,
    CrossesVolume: 409,
    Conflict: 412,
    AuthenticationFailed: 401,
    PermissionDenied: 403,
    RangeNotSatisfiable: 416,
    InvalidPath: 400,
    InvalidArgument: 400,
    # what the target can't do (a symlink's mode, a special file's content, a volume
    # without symlinks) is about the target, like IsADirectory, not a method the server lacks
    NotSupported: 409,
    InsufficientStorage: 507,
    BackendUnavailable: 503,
    LoomError: 500,
}


def basic_authorization(access_key: str, secret: str) -> str:
    """The ``Authorization`` header value of HTTP Basic credentials."""
    return "Basic " + base64.b64encode(f"{access_key}:{secret}".encode()).decode()


def status_of(exc: LoomError) -> int:
    for cls in type(exc).__mro__:
        if cls in STATUS:
            return STATUS[cls]
    return 500


def error_body(exc: LoomError) -> dict[str, Any]:
    return {"error": {"code": exc.code, "message": exc.message, "path": exc.path}}


def error_from(status: int, body: Any) -> LoomError:
    """Rebuild the server's error on the client side."""
    detail = body.get("error") if isinstance(body, dict) else None
    if not isinstance(detail, dict):
        if status == 404:  # no loomfs error: the route itself is missing (a spoke's admin calls)
            return NotSupported(f"the site does not serve this call (HTTP 404: {str(body)[:200]})")
        return LoomError(f"HTTP {status}: {str(body)[:200]}")
    cls = BY_CODE.get(str(detail.get("code")), LoomError)
    return cls(str(detail.get("message")), path=detail.get("path"))


def entry_json(entry: Entry) -> dict[str, Any]:
    return dataclasses.asdict(entry)


def entry_from(data: dict[str, Any]) -> Entry:
    return Entry(**{**data, "kind": EntryKind(data["kind"])})


def delta_lines(answer: ListingDelta) -> list[dict[str, Any]]:
    """A listing's delta as the lines of a listing: a first line with the whole listing's
    digest and whether this is all of it, the entries, then one line per name gone."""
    head: dict[str, Any] = {"digest": answer.digest, "full": answer.full}
    return [head, *map(entry_json, answer.entries), *({"gone": n} for n in answer.gone)]


def delta_from(lines: list[dict[str, Any]]) -> ListingDelta:
    if not lines or not isinstance(lines[0].get("digest"), str):
        raise InvalidArgument("a listing's delta begins with its digest")
    head, rest = lines[0], lines[1:]
    return ListingDelta(
        head["digest"],
        full=bool(head.get("full")),
        entries=[entry_from(line) for line in rest if "gone" not in line],
        gone=[str(line["gone"]) for line in rest if "gone" in line],
    )


def held_from(data: Any) -> dict[str, tuple[int, str]]:
    """The listings a tree's caller holds (directory -> [feed position, digest])."""
    try:
        return {str(d): (int(seq), str(copy)) for d, (seq, copy) in dict(data).items()}
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"'held' maps directories to [position, digest]: {exc}") from None


def tree_lines(
    answers: Iterable[tuple[str, ListingDelta | LoomError]], held: Mapping[str, tuple[int, str]]
) -> list[dict[str, Any]]:
    """A tree's listings (``namespace.listing.tree_deltas``) as lines: each directory's
    delta (``delta_lines``) with the directory named in its first line, or one line with
    the error that ends the tree there. A directory as its holder has it (most, in a
    tree walked again) is its name alone: its 16 bytes of digest are the holder's."""
    lines: list[dict[str, Any]] = []
    for directory, answer in answers:
        if isinstance(answer, LoomError):
            lines.append({"dir": directory, **error_body(answer)})
            continue
        if answer.unchanged and held.get(directory, (0, None))[1] == answer.digest:
            lines.append({"dir": directory})
            continue
        head, *rest = delta_lines(answer)
        lines += [{"dir": directory, **head}, *rest]
    return lines


def tree_from(
    lines: Iterable[dict[str, Any]], held: Mapping[str, tuple[int, str]]
) -> Iterator[tuple[str, ListingDelta | LoomError]]:
    """The directories of ``tree_lines`` and their answers, in the order sent, for the
    holder of the copies ``held``."""
    directory: str | None = None
    group: list[dict[str, Any]] = []
    for line in [*lines, {"dir": None}]:
        if "dir" not in line:
            group.append(line)
            continue
        if directory is not None:
            yield directory, delta_from(group)
        directory, group = line["dir"], [line]
        if len(line) == 1 and directory in held:  # as held: the holder's digest is it
            group = [{"digest": held[directory][1], "full": False}]
        if "error" in line:
            yield str(directory), error_from(500, line)
            return


ENTRY_HEADER = "X-Loomfs-Entry"


def entry_header(entry: Entry) -> str:
    """The entry a body belongs to, as a header value (base64url JSON: paths may be any
    Unicode, headers only ASCII)."""
    return base64.urlsafe_b64encode(json.dumps(entry_json(entry)).encode()).decode()


def entry_header_from(value: str) -> Entry:
    return entry_from(json.loads(base64.urlsafe_b64decode(value)))


def change_json(change: Change) -> dict[str, Any]:
    return dataclasses.asdict(change)


def change_from(data: dict[str, Any]) -> Change:
    return Change(**{**data, "op": ChangeOp(data["op"]), "kind": EntryKind(data["kind"])})


def tags_header(tags: WriteTags) -> str:
    return json.dumps(tags.as_json(), separators=(",", ":"))


def tags_from_header(value: str) -> WriteTags:
    try:
        data = json.loads(value)
        if not isinstance(data, dict):
            raise ValueError("not an object")
        return WriteTags.from_json(data)
    except ValueError as exc:
        raise InvalidArgument(f"{TAGS_HEADER} is not a write's tags: {exc}") from None
