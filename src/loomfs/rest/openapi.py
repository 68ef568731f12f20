"""The REST API's OpenAPI 3.1 description (protocol layer), served at /openapi.json.

Written by hand next to the routes; a test checks that every route is described here and
that the document is valid OpenAPI.
"""

from __future__ import annotations

from typing import Any

from .. import __version__
from ..core.types import EntryKind

_PATH_PARAM = {
    "name": "path",
    "in": "path",
    "required": True,
    "description": "namespace path without its leading slash",
    "schema": {"type": "string"},
}
_ERROR = {"$ref": "#/components/responses/Error"}
_ENTRY = {"$ref": "#/components/schemas/Entry"}


def _json_ok(schema: dict[str, Any], description: str = "OK") -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


_READY: dict[str, Any] = {
    "type": "object",
    "required": ["status", "site", "reasons", "checks"],
    "properties": {
        "status": {"enum": ["ready", "degraded"]},
        "site": {"type": "string"},
        "reasons": {"type": "array", "items": {"type": "string"}},
        "checks": {"type": "object"},
    },
}


def _op(summary: str, responses: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"summary": summary, "responses": {**responses, "default": _ERROR}, **extra}


def _json_body(required: list[str], **properties: Any) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    return {"content": {"application/json": {"schema": schema}}}


def _ndjson(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/x-ndjson": {"schema": {}}}}


def spec() -> dict[str, Any]:
    flag = {"schema": {"type": "boolean"}, "in": "query"}
    if_match = {
        "name": "If-Match",
        "in": "header",
        "schema": {"type": "string"},
        "description": "only if the entry is at this version",
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "loomfs REST API", "version": __version__},
        "paths": {
            "/v1/stat/{path}": {
                "parameters": [_PATH_PARAM],
                "get": _op("Stat an entry", {"200": _json_ok(_ENTRY)}),
            },
            "/v1/list/{path}": {
                "parameters": [_PATH_PARAM],
                "get": _op(
                    "List a directory, streamed as one JSON entry per line",
                    {"200": _ndjson("entries ordered by name")},
                    parameters=[
                        {"name": "start_after", "in": "query", "schema": {"type": "string"}},
                        {"name": "limit", "in": "query", "schema": {"type": "integer"}},
                    ],
                ),
            },
            "/v1/listing/{path}": {
                "parameters": [_PATH_PARAM],
                "get": _op(
                    "What changed in a directory's listing the caller holds (a hub's): a"
                    " first line with the whole listing's digest and 'full', then the"
                    " entries changed since (all of them where full), then {'gone': name}"
                    " lines",
                    {"200": _ndjson("the digest line, entries, names gone")},
                    parameters=[
                        {
                            "name": "since",
                            "in": "query",
                            "schema": {"type": "integer"},
                            "description": "the change-feed position the held copy was listed at",
                        },
                        {
                            "name": "digest",
                            "in": "query",
                            "schema": {"type": "string"},
                            "description": "the held copy's digest (namespace.listing)",
                        },
                    ],
                ),
            },
            "/v1/tree/{path}": {
                "parameters": [_PATH_PARAM],
                "post": _op(
                    "The listings of a directory and of every directory below it (a hub's),"
                    " in walk order, each as /v1/listing answers it with 'dir' in its first"
                    " line; a directory the caller may not list ends it with its error line",
                    {"200": _ndjson("per directory: its digest line, entries, names gone")},
                    requestBody=_json_body(
                        [],
                        held={
                            "type": "object",
                            "description": "directory -> [feed position, digest] of held copies",
                        },
                    ),
                ),
            },
            "/v1/files/{path}": {
                "parameters": [_PATH_PARAM],
                "get": _op(
                    "Read a file or a byte range of it",
                    {
                        "200": {"description": "the whole file"},
                        "206": {"description": "the requested range"},
                    },
                    parameters=[
                        {"name": "Range", "in": "header", "schema": {"type": "string"}},
                        if_match,
                    ],
                ),
                "put": _op(
                    "Create or replace a file atomically from the request body",
                    {"201": _json_ok(_ENTRY, "the new entry")},
                    parameters=[
                        if_match,
                        {"name": "If-None-Match", "in": "header", "schema": {"const": "*"}},
                        {"name": "X-Loomfs-Mode", "in": "header", "schema": {"type": "integer"}},
                        _WRITE_ID,
                    ],
                    requestBody={
                        "content": {"application/octet-stream": {"schema": {}}},
                    },
                ),
                "delete": _op(
                    "Remove a file or directory",
                    {"204": {"description": "removed"}},
                    parameters=[{"name": "recursive", **flag}, if_match],
                ),
            },
            "/v1/mkdir/{path}": {
                "parameters": [_PATH_PARAM],
                "post": _op(
                    "Create a directory",
                    {"201": _json_ok(_ENTRY)},
                    parameters=[{"name": "parents", **flag}, {"name": "exist_ok", **flag}],
                ),
            },
            "/v1/rename": {
                "post": _op(
                    "Move a file or directory within a volume",
                    {"200": _json_ok(_ENTRY)},
                    requestBody=_json_body(
                        ["src", "dst"],
                        src={"type": "string"},
                        dst={"type": "string"},
                        overwrite={"type": "boolean"},
                    ),
                ),
            },
            "/v1/symlink/{path}": {
                "parameters": [_PATH_PARAM],
                "post": _op(
                    "Create a symlink (where the volume has them)",
                    {"201": _json_ok(_ENTRY, "the new symlink")},
                    requestBody={
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "required": ["target"],
                                    "properties": {"target": {"type": "string"}},
                                }
                            }
                        }
                    },
                ),
            },
            "/v1/mknod/{path}": {
                "parameters": [_PATH_PARAM],
                "post": _op(
                    "Create a fifo, device or socket (where the volume has them)",
                    {"201": _json_ok(_ENTRY, "the new special file")},
                    requestBody=_json_body(
                        ["mode"],
                        mode={"type": "integer", "minimum": 0, "description": "type and bits"},
                        rdev={"type": "integer", "minimum": 0},
                    ),
                ),
            },
            "/v1/link/{path}": {
                "parameters": [_PATH_PARAM],
                "post": _op(
                    "Create a hard link at path to 'src' (where the volume has them)",
                    {"201": _json_ok(_ENTRY, "the new name")},
                    requestBody=_json_body(["src"], src={"type": "string"}),
                ),
            },
            "/v1/lease/{path}": {
                "parameters": [_PATH_PARAM],
                "post": _op(
                    "Take or renew this site's write lease of a path (writes from other"
                    " sites are refused while it lasts), or give it up with release=true",
                    {
                        "200": _json_ok(
                            {"type": "object", "properties": {"term": {"type": "number"}}},
                            "seconds granted (0 after a release)",
                        )
                    },
                    parameters=[{"name": "release", **flag}],
                ),
            },
            "/v1/attrs/{path}": {
                "parameters": [_PATH_PARAM],
                "patch": _op(
                    "Change mode bits, owner, mtime or atime (absent fields stay as they are)",
                    {"200": _json_ok(_ENTRY)},
                    requestBody=_json_body(
                        [],
                        mode={"type": "integer", "minimum": 0},
                        uid={"type": "integer", "minimum": 0},
                        gid={"type": "integer", "minimum": 0},
                        mtime_ns={"type": "integer"},
                        atime_ns={"type": "integer"},
                    ),
                ),
            },
            "/v1/tags/{path}": {
                "parameters": [_PATH_PARAM],
                "get": _op(
                    "Tags of an entry", {"200": _json_ok({"$ref": "#/components/schemas/Tags"})}
                ),
                "patch": _op(
                    "Set and remove tags",
                    {"200": _json_ok({"$ref": "#/components/schemas/Tags"})},
                    requestBody=_json_body(
                        [],
                        set={"$ref": "#/components/schemas/Tags"},
                        remove={"type": "array", "items": {"type": "string"}},
                    ),
                ),
            },
            "/v1/whoami": {
                "get": _op(
                    "Who this server takes the caller for (user, groups, site, protocol)",
                    {"200": _json_ok({"type": "object"})},
                ),
            },
            "/v1/changes": {
                "get": _op(
                    "The change log after a sequence number",
                    {"200": _json_ok({"type": "object"})},
                    parameters=[
                        {"name": "since", "in": "query", "schema": {"type": "integer"}},
                        {"name": "limit", "in": "query", "schema": {"type": "integer"}},
                        {
                            "name": "wait",
                            "in": "query",
                            "schema": {"type": "number"},
                            "description": "hold the request up to this many seconds (max 30) "
                            "until there is a change",
                        },
                        {
                            "name": "ack",
                            "in": "query",
                            "schema": {"type": "integer"},
                            "description": "a spoke: every change up to this one is applied "
                            "(renews its read lease)",
                        },
                    ],
                ),
            },
            "/v1/volumes": {
                "get": _op("Volumes of this hub", {"200": _json_ok({"type": "array"})}),
                "post": _op(
                    "Assimilate a volume (metadata only); progress streamed as JSON lines",
                    {"200": _ndjson("progress lines, the last one the result or an error")},
                    requestBody=_json_body(
                        ["mount", "url"], mount={"type": "string"}, url={"type": "string"}
                    ),
                ),
                "delete": _op(
                    "Forget a volume's metadata (its data is untouched)",
                    {"204": {"description": "removed"}},
                    parameters=[
                        {
                            "name": "mount",
                            "in": "query",
                            "required": True,
                            "schema": {"type": "string"},
                        }
                    ],
                ),
            },
            "/v1/volumes/rescan": {
                "post": _op(
                    "Rescan a volume for changes made behind loomfs's back",
                    {"200": _ndjson("progress lines, the last one the result or an error")},
                    requestBody={
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "required": ["mount"],
                                    "properties": {"mount": {"type": "string"}},
                                }
                            }
                        }
                    },
                ),
            },
            "/v1/settle": {
                "post": _op(
                    "At a hub: wait until every leased spoke applied a change (say an eviction)",
                    {"200": _json_ok({"type": "object"})},
                    requestBody=_json_body(["seq"], seq={"type": "integer"}),
                ),
            },
            "/v1/warm": {
                "post": _op(
                    "At a spoke: fetch a tree into the cache ahead of reads (progress lines)",
                    {"200": _ndjson("progress lines, the last one the result or an error")},
                    requestBody=_json_body(
                        ["path"], path={"type": "string"}, pin={"type": "boolean"}
                    ),
                ),
            },
            "/v1/sync": {
                "post": _op(
                    "At a spoke: wait until every journaled write is committed at the hub",
                    {"204": {"description": "all committed"}},
                ),
            },
            **_chunk_paths(if_match),
            **_admin_paths(),
            "/v1/plans": {
                "post": _op(
                    "At a spoke: publish a data loader's plan (its files and read order)",
                    {"201": _json_ok({"type": "object"}, "the job, its start and its reads")},
                    requestBody=_json_body(
                        ["plan", "files"],
                        plan={"type": "string", "description": "base64 of Plan.encode()"},
                        files={"type": "string", "description": "base64 zlib of path lines"},
                        sizes={"type": "array", "items": {"type": "integer"}},
                    ),
                ),
                "get": _op(
                    "At a spoke: prefetch metrics (hit ratio, bytes, waste, stall time)",
                    {"200": _json_ok({"type": "object"})},
                ),
            },
            "/v1/plans/heartbeat": {
                "post": _op(
                    "At a spoke: how many samples a job has read (its stream position)",
                    {"204": {"description": "recorded"}},
                    requestBody=_json_body(
                        ["job", "position"], job={"type": "string"}, position={"type": "integer"}
                    ),
                ),
            },
            "/v1/plans/end": {
                "post": _op(
                    "At a spoke: a job is done; its plan no longer guides the cache",
                    {"204": {"description": "ended"}},
                    requestBody=_json_body(["job"], job={"type": "string"}),
                ),
            },
            "/v1/local": {
                "get": _op(
                    "At a spoke: its local socket for reads from the cache files on this "
                    "machine (rest.local), and the token the socket greets with",
                    {"200": _json_ok({"type": "object"}, "socket (@: abstract) and token")},
                ),
            },
            "/openapi.json": {"get": _op("This document", {"200": _json_ok({"type": "object"})})},
            "/metrics": {"get": _op("Prometheus metrics", {"200": {"description": "text format"}})},
            "/healthz": {"get": _op("Liveness", {"200": _json_ok({"type": "object"})})},
            "/readyz": {
                "get": _op(
                    "Readiness: each check of the site, and the reasons it is not ready",
                    {
                        "200": _json_ok(_READY, "ready"),
                        "503": _json_ok(_READY, "degraded: 'reasons' says why"),
                    },
                )
            },
        },
        "security": [{"basic": []}, {}],
        "components": {
            "securitySchemes": {
                "basic": {
                    "type": "http",
                    "scheme": "basic",
                    "description": "an access key id and its secret (`loomfs user add`); "
                    "without credentials the caller is anonymous where the site allows it",
                }
            },
            "schemas": {
                "Entry": {
                    "type": "object",
                    "properties": {
                        "path": {"type": "string"},
                        "kind": {"enum": [kind.value for kind in EntryKind]},
                        "size": {"type": "integer"},
                        "mtime_ns": {"type": "integer"},
                        "mode": {"type": "integer"},
                        "uid": {"type": "integer"},
                        "gid": {"type": "integer"},
                        "version": {"type": "integer"},
                        "etag": {"type": ["string", "null"]},
                        "inode": {"type": ["integer", "null"]},
                        "link_target": {"type": ["string", "null"]},
                        "rdev": {"type": ["integer", "null"]},
                        "nlink": {"type": "integer"},
                        "atime_ns": {"type": ["integer", "null"]},
                        "ctime_ns": {"type": ["integer", "null"]},
                        # the hub catalog's number for the entry: it outlives renames
                        "id": {"type": ["integer", "null"]},
                    },
                },
                "Tags": {"type": "object", "additionalProperties": {"type": "string"}},
                "Error": {
                    "type": "object",
                    "properties": {
                        "error": {
                            "type": "object",
                            "properties": {
                                "code": {"type": "string"},
                                "message": {"type": "string"},
                                "path": {"type": ["string", "null"]},
                            },
                        }
                    },
                },
            },
            "responses": {
                "Error": {
                    "description": "an error, with a stable code (NotFound, Conflict, ...)",
                    "content": {
                        "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}
                    },
                }
            },
        },
    }


def _octets(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    }


_WRITE_ID = {
    "name": "Idempotency-Key",
    "in": "header",
    "schema": {"type": "string", "maxLength": 128},
    "description": "the write's key: a repeat of it is answered with the first write's entry",
}


def _chunk_paths(if_match: dict[str, Any]) -> dict[str, Any]:
    """The fabric link's chunk routes (served to spokes by the hub's fabric listener)."""
    ids = {"type": "array", "items": {"type": "string", "description": "BLAKE3, hex"}}
    return {
        "/v1/chunkmap/{path}": {
            "parameters": [_PATH_PARAM],
            "get": _op(
                "A file's current version: its chunk map (ChunkMap wire form), or when it is "
                "at most `small` bytes the whole file as one frame, its BLAKE3 id in header "
                "X-Loomfs-Whole (and an empty body when that id is `have`, content the "
                "caller holds); the entry is in X-Loomfs-Entry",
                {"200": _octets("the chunk map, or the whole file's frame")},
                parameters=[
                    {"name": "small", "in": "query", "schema": {"type": "integer"}},
                    {"name": "have", "in": "query", "schema": {"type": "string"}},
                ],
            ),
        },
        "/v1/chunks": {
            "post": _op(
                "Frames of chunks by id, in order: one record (varint length, frame) each, "
                "length 0 where the hub holds no verified copy; with `base` (a file version "
                "the caller holds) and `at` (where each chunk likely sits in it), delta frames",
                {"200": _octets("the records")},
                requestBody=_json_body(
                    ["ids"],
                    ids=ids,
                    base={
                        "type": "object",
                        "properties": {"path": {"type": "string"}, "version": {"type": "integer"}},
                    },
                    at={"type": "array", "items": {"type": ["integer", "null"]}},
                ),
            ),
        },
        "/v1/chunks/small": {
            "post": _op(
                "Many small files in one answer (loomfs.chunks.bundle): the ask is zstd JSON "
                "{small, files: [[path, version, held id hex]]}, the answer a varint-framed "
                "zstd JSON head (per file: skipped, held or sent, size, id) and one zstd frame "
                "of the files sent, against the held versions named in the head as its "
                "dictionary",
                {"200": _octets("the head and the frame")},
                requestBody={"content": {"application/octet-stream": {"schema": {}}}},
            ),
        },
        "/v1/chunks/missing": {
            "post": _op(
                "Which of these chunks the hub holds in no file",
                {"200": _json_ok({"type": "object", "properties": {"missing": ids}})},
                requestBody=_json_body(["ids"], ids=ids),
            ),
        },
        "/v1/chunks/upload": {
            "post": _op(
                "Upload frames (records: 32-byte id, varint length, frame); each is verified "
                "and staged for a commit",
                {
                    "200": _json_ok(
                        {"type": "object", "properties": {"stored": {"type": "integer"}}}
                    )
                },
                requestBody={"content": {"application/octet-stream": {"schema": {}}}},
            ),
        },
        "/v1/chunks/commit/{path}": {
            "parameters": [_PATH_PARAM],
            "post": _op(
                "Write a file assembled from chunks the hub holds or was sent, given its "
                "chunk map; preconditions as for PUT /v1/files",
                {"201": _json_ok(_ENTRY, "committed")},
                parameters=[
                    if_match,
                    {"name": "If-None-Match", "in": "header", "schema": {"type": "string"}},
                    {"name": "X-Loomfs-Mode", "in": "header", "schema": {"type": "integer"}},
                    _WRITE_ID,
                ],
                requestBody={"content": {"application/octet-stream": {"schema": {}}}},
            ),
        },
    }


def _admin_paths() -> dict[str, Any]:
    """The hub's admin API (``rest.admin``): every route needs an explicit admin right."""
    s, strings = {"type": "string"}, {"type": "array", "items": {"type": "string"}}
    name = {"name": "name", "in": "path", "required": True, "schema": s}
    done = {"204": {"description": "done"}}
    listed = {"200": _json_ok({"type": "array"})}
    obj: dict[str, Any] = {"type": "object"}
    made = {"201": _json_ok(obj, "made")}
    query = [
        {"name": "access_key", "in": "query", "schema": s},
        {"name": "ssh_key", "in": "query", "schema": s, "description": "the public key line"},
    ]
    rule = _json_body(["subject", "permission", "path"], subject=s, permission=s, path=s)
    a = "/v1/admin"
    return {
        f"{a}/users": {
            "get": _op("Users, their groups and key ids (never secrets)", listed),
            "post": _op(
                "Add a user with a new access key (its secret in this answer only)",
                made,
                requestBody=_json_body(["user"], user=s, groups=strings, ssh_key=s),
            ),
        },
        f"{a}/users/{{name}}": {
            "parameters": [name],
            "delete": _op("Remove a user and all their keys", done),
        },
        f"{a}/users/{{name}}/keys": {
            "parameters": [name],
            "post": _op(
                "A new access key (secret shown once), or with ssh_key an SSH public key",
                made,
                requestBody=_json_body([], ssh_key=s),
            ),
            "delete": _op("Revoke one key (exactly one query parameter)", done, parameters=query),
        },
        f"{a}/users/{{name}}/smb-password": {
            "parameters": [name],
            "put": _op(
                "Set the user's SMB password by its NT hash (the password is never sent)",
                {"200": _json_ok(obj)},
                requestBody=_json_body(["nt_hash"], nt_hash=s),
            ),
        },
        f"{a}/groups": {
            "get": _op("Groups and their members", listed),
            "post": _op("Create a group", done, requestBody=_json_body(["group"], group=s)),
        },
        f"{a}/groups/{{name}}": {
            "parameters": [name],
            "delete": _op("Remove a group (refused while a rule names it)", done),
        },
        f"{a}/groups/{{name}}/members": {
            "parameters": [name],
            "post": _op(
                "Put a user in the group, or with member false take them out",
                done,
                requestBody=_json_body(["user"], user=s, member={"type": "boolean"}),
            ),
        },
        f"{a}/acl": {"get": _op("Every rule and private export", {"200": _json_ok(obj)})},
        f"{a}/acl/grant": {
            "post": _op("Grant a right on a path (admin right on the path)", made, requestBody=rule)
        },
        f"{a}/acl/revoke": {"post": _op("Take back a rule", done, requestBody=rule)},
        f"{a}/acl/private": {
            "post": _op(
                "Mark an export private (or with private false open again)",
                done,
                requestBody=_json_body(["path"], path=s, private={"type": "boolean"}),
            )
        },
        f"{a}/sites": {
            "get": _op("Sites trusted (and revoked)", listed),
            "post": _op(
                "Trust a site, pinned to its PEM certificate",
                made,
                requestBody=_json_body(["cert"], cert=s, site=s, labels=strings),
            ),
        },
        f"{a}/sites/{{name}}": {"parameters": [name], "delete": _op("Forget a site", done)},
        f"{a}/sites/{{name}}/revoke": {
            "parameters": [name],
            "post": _op("Stop trusting a site", done),
        },
        f"{a}/policies": {
            "get": _op("Placement policies", listed),
            "post": _op(
                "Add or replace a policy; settle on the answer's seq (/v1/settle)",
                made,
                requestBody=_json_body(
                    ["policy", "paths", "allow"],
                    policy=s,
                    paths=strings,
                    allow=strings,
                    tag=s,
                    metadata=s,
                ),
            ),
        },
        f"{a}/exports": {
            "get": _op(
                "What each protocol serves: S3 buckets, the SFTP root, NFS exports and SMB "
                "shares (each with its source: config or catalog)",
                {"200": _json_ok(obj)},
            )
        },
        f"{a}/exports/nfs": {
            "post": _op(
                "Export a namespace directory over NFS (admin right on it), served from "
                "the NFS server's next MNT",
                made,
                requestBody=_json_body(
                    ["path"],
                    path=s,
                    clients=strings,
                    access={"type": "string", "enum": ["rw", "ro"]},
                    squash={"type": "string", "enum": ["root", "all", "none"]},
                    anonymous={"type": "boolean"},
                ),
            ),
            "delete": _op(
                "Remove an NFS export added here: no new mount, its handles are STALE",
                done,
                parameters=[{"name": "path", "in": "query", "required": True, "schema": s}],
            ),
        },
        f"{a}/exports/smb": {
            "post": _op(
                "Share a namespace directory over SMB as a named share (admin right on the "
                "directory), served by smbd within seconds, no restart",
                made,
                requestBody=_json_body(
                    ["share", "path"],
                    share=s,
                    path=s,
                    access={"type": "string", "enum": ["rw", "ro"]},
                ),
            ),
            "delete": _op(
                "Remove an SMB share added here: it takes no new connection",
                done,
                parameters=[{"name": "name", "in": "query", "required": True, "schema": s}],
            ),
        },
        f"{a}/policies/{{name}}": {
            "parameters": [name],
            "delete": _op("Remove a policy (a loosening)", done),
        },
        f"{a}/audit": {
            "get": _op(
                "The newest audit records matching every filter, oldest first",
                listed,
                parameters=[
                    {"name": "user", "in": "query", "schema": s},
                    {
                        "name": "path",
                        "in": "query",
                        "schema": s,
                        "description": "this path and everything below it",
                    },
                    {"name": "protocol", "in": "query", "schema": s},
                    {
                        "name": "since",
                        "in": "query",
                        "schema": {"type": "integer"},
                        "description": "ns since the epoch",
                    },
                    {
                        "name": "until",
                        "in": "query",
                        "schema": {"type": "integer"},
                        "description": "ns since the epoch, exclusive",
                    },
                    {"name": "limit", "in": "query", "schema": {"type": "integer"}},
                ],
            )
        },
    }
