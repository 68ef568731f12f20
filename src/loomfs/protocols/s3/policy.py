"""S3 bucket policies, translated into the namespace's access rules (protocol layer).

As with ACLs (``acl.py``), who may do what is decided once, in the namespace, for every
protocol: PutBucketPolicy turns the document into rules (``core.acl.PolicyRule``) kept
with it and replaced with it in one step, so that a Deny holds over REST, SFTP and FUSE
as over S3. What the rules can say exactly is taken; anything else is refused whole with
MalformedPolicy naming the element and why, never granted wider or narrower:

=====================================  ==============================================
policy                                 rules
=====================================  ==============================================
Principal ``*``, ``{"AWS": "*"}``      group:everyone (anonymous callers too)
``{"AWS": NAME or ARN :user/NAME}``    user:NAME (``CanonicalUser`` IDs too, as in ACLs)
Resource ``arn:aws:s3:::B``            the bucket (for s3:ListBucket)
``arn:aws:s3:::B/*``, ``B/prefix/*``   the bucket's path, the prefix's (objects)
``arn:aws:s3:::B/key``                 the key's path (were it a folder: all in it)
=====================================  ==============================================

The namespace has one permission where S3 has several, so a subject's actions on a path
must be a set the namespace can grant: s3:ListBucket alone is list (which shows each key's
metadata and tags too, as HeadObject does, where S3 lists fewer fields); with s3:GetObject it is
read (reading needs seeing the key: the namespace's read includes list); with s3:PutObject
and s3:DeleteObject it is put (create, overwrite, remove: one permission here, so the two
come together); all four are write. s3:GetObject or the pair on a prefix need s3:ListBucket
on the bucket for the same subject (or everyone), which the read or put there includes. A
Deny takes away reading (s3:GetObject), changing (the pair), or everything (the four: what
takes s3:ListBucket, which metadata needs, takes the rest with it). A wildcard action
(``s3:*``, ``s3:Get*``) stands for the data actions above that it matches: bucket
configuration (ACLs, policy, tags, CORS) stays its administrator's and is not given by a
policy. Condition, NotPrincipal, NotAction and NotResource, other services' actions,
resources outside the bucket, wildcards inside a key, and accounts as principals are
refused. A Deny binds the bucket owner too, except for the policy itself (its admin).

A public access block (Put/Get/DeletePublicAccessBlock) is the namespace's too
(``core.acl.PublicBlock`` on the bucket's path), so it binds every protocol: public ACL
rules and policies are refused or made to grant nothing, as its four flags say.
"""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from ... import paths
from ...core.acl import EVERYONE, PolicyRule, PublicBlock, granted, needed, parse_subject
from ...core.types import Action
from ...errors import InvalidArgument
from .errors import S3Error
from .xmlio import child_text, document, el, local, parse

VERSIONS = frozenset({"2012-10-17", "2008-10-17"})
MAX_SIZE = 20 * 1024  # S3's limit on a bucket policy's document
LIST, GET, PUT, DELETE = "s3:ListBucket", "s3:GetObject", "s3:PutObject", "s3:DeleteObject"
ON_BUCKET = frozenset({LIST})
ON_OBJECTS = frozenset({GET, PUT, DELETE})
KNOWN = {a.lower(): a for a in ON_BUCKET | ON_OBJECTS}
# a subject's actions on one path -> what an Allow of them grants, a Deny takes away
ALLOWED = {
    frozenset({LIST}): granted(Action.LIST),
    frozenset({LIST, GET}): granted(Action.READ),
    frozenset({LIST, PUT, DELETE}): granted(Action.PUT),
    frozenset({LIST, GET, PUT, DELETE}): granted(Action.WRITE),
}
DENIED = {
    frozenset({GET}): needed(Action.READ),
    frozenset({PUT, DELETE}): needed(Action.WRITE),
    frozenset({GET, PUT, DELETE}): needed(Action.READ, Action.WRITE),
    frozenset({LIST, GET, PUT, DELETE}): needed(Action.LIST, Action.READ, Action.WRITE),
}
STATEMENT_KEYS = frozenset({"Sid", "Effect", "Principal", "Action", "Resource"})
INEXPRESSIBLE = ("Condition", "NotPrincipal", "NotAction", "NotResource")
USER_ARN = re.compile(r"arn:aws:iam::\d{12}:user/([^/]+)")
ACCOUNT = re.compile(r"\d{12}")  # an account, which is no loomfs user
EVERYONE_SUBJECT = f"group:{EVERYONE}"


def _malformed(message: str) -> S3Error:
    return S3Error("MalformedPolicy", message)


def _strings(value: Any, element: str) -> list[str]:
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, list) or not values or not all(isinstance(v, str) for v in values):
        raise _malformed(f"{element} must be a string or a non-empty list of strings")
    return values


def _subjects(principal: Any) -> set[str]:
    if principal == "*":
        return {EVERYONE_SUBJECT}
    if not isinstance(principal, dict) or not principal:
        raise _malformed('Principal must be "*" or {"AWS": ...}')
    out = set()
    for kind, value in principal.items():
        if kind not in ("AWS", "CanonicalUser"):
            raise _malformed(f"Principal {kind!r}: only AWS users map to loomfs users")
        for name in _strings(value, f"Principal {kind}"):
            if name == "*":
                out.add(EVERYONE_SUBJECT)
                continue
            arn = USER_ARN.fullmatch(name)
            if (name.startswith("arn:") and arn is None) or ACCOUNT.fullmatch(name):
                raise _malformed(f"Principal {name!r}: only user ARNs (:user/NAME) map to users")
            try:
                out.add(parse_subject(f"user:{arn.group(1) if arn else name}"))
            except InvalidArgument as exc:
                raise _malformed(f"Principal {name!r}: {exc}") from None
    return out


def _actions(value: Any) -> tuple[set[str], list[set[str]]]:
    """Every action named, and per named pattern the actions it stands for."""
    everything, each = set(), []
    for pattern in _strings(value, "Action"):
        lowered = "s3:*" if pattern == "*" else pattern.lower()
        if not lowered.startswith("s3:"):
            raise _malformed(f"Action {pattern!r}: only s3 actions apply to a bucket")
        if "*" in lowered or "?" in lowered:
            matched = {KNOWN[a] for a in fnmatch.filter(KNOWN, lowered)}
            if not matched:
                raise _malformed(f"Action {pattern!r} matches no action these rules can say")
        elif lowered in KNOWN:
            matched = {KNOWN[lowered]}
        else:
            raise _malformed(
                f"Action {pattern!r} cannot be expressed as the namespace's access rules "
                f"(they say {', '.join(sorted(KNOWN.values()))})"
            )
        everything |= matched
        each.append(matched)
    return everything, each


def _resources(value: Any, bucket: str, folder: str) -> tuple[bool, set[str]]:
    """Whether the bucket itself is named, and the paths of the objects named."""
    on_bucket, objects = False, set()
    for arn in _strings(value, "Resource"):
        name, slash, key = arn.removeprefix("arn:aws:s3:::").partition("/")
        if not arn.startswith("arn:aws:s3:::") or name != bucket:
            raise _malformed(f"Resource {arn!r} is outside the bucket {bucket}")
        if not slash:
            on_bucket = True
            continue
        if not key or "${" in key:
            raise _malformed(f"Resource {arn!r}: an empty key or a policy variable is no path")
        prefix = key.removesuffix("*")
        if "*" in prefix or "?" in prefix:
            raise _malformed(f"Resource {arn!r}: a wildcard is only taken as a key's last '*'")
        if key.endswith("*") and prefix and not prefix.endswith("/"):
            raise _malformed(
                f"Resource {arn!r}: a prefix must end at a '/' (the rules are on paths)"
            )
        if not key.endswith("*") and key.endswith("/"):
            raise _malformed(f"Resource {arn!r}: a folder marker alone is not a path's rule")
        inner = prefix.rstrip("/") if key.endswith("*") else key
        parts = inner.split("/") if inner else []
        if any(p in ("", ".", "..") for p in parts):
            raise _malformed(f"Resource {arn!r} is no path in the bucket")
        objects.add(paths.normalize(folder + ("/" + inner if inner else "")))
    return on_bucket, objects


def _statement(
    stmt: Any, bucket: str, folder: str, held: dict[tuple[bool, str, str], set[str]]
) -> None:
    if not isinstance(stmt, dict):
        raise _malformed("each Statement must be an object")
    for element in INEXPRESSIBLE:
        if element in stmt:
            raise _malformed(f"{element} cannot be expressed as the namespace's access rules")
    unknown = sorted(stmt.keys() - STATEMENT_KEYS)
    if unknown:
        raise _malformed(f"unknown element {unknown[0]!r} in a Statement")
    for element in ("Effect", "Principal", "Action", "Resource"):
        if element not in stmt:
            raise _malformed(f"a Statement needs {element}")
    if stmt["Effect"] not in ("Allow", "Deny"):
        raise _malformed(f"Effect must be Allow or Deny, not {stmt['Effect']!r}")
    deny = stmt["Effect"] == "Deny"
    subjects = _subjects(stmt["Principal"])
    actions, each = _actions(stmt["Action"])
    on_bucket, objects = _resources(stmt["Resource"], bucket, folder)
    for matched in each:
        if not (on_bucket and matched & ON_BUCKET) and not (objects and matched & ON_OBJECTS):
            raise _malformed(
                f"Action {', '.join(sorted(matched))} does not apply to any resource in statement"
            )
    for subject in subjects:
        if on_bucket and LIST in actions:
            held.setdefault((deny, folder, subject), set()).add(LIST)
        for where in objects:
            if actions & ON_OBJECTS:
                held.setdefault((deny, where, subject), set()).update(actions & ON_OBJECTS)


def _rules(held: Mapping[tuple[bool, str, str], set[str]], folder: str) -> list[PolicyRule]:
    out = []
    for (deny, where, subject), actions in sorted(held.items()):
        if deny:
            # what everyone is denied there is denied to each user as well
            wanted = frozenset(actions | held.get((True, where, EVERYONE_SUBJECT), set()))
            table = DENIED
        else:
            lists = {(False, folder, subject), (False, folder, EVERYONE_SUBJECT)}
            listed = any(LIST in held.get(k, set()) for k in lists)
            wanted = frozenset(actions | ({LIST} if listed else set()))
            table = ALLOWED
        if wanted not in table:
            effect = "Deny" if deny else "Allow"
            raise _malformed(
                f"{effect} of {', '.join(sorted(actions))} for {subject} on {where}: the "
                f"namespace's permissions there take {_sets(table)}"
            )
        out.append(PolicyRule(where, subject, deny, table[wanted]))
    return out


def _sets(table: Iterable[frozenset[str]]) -> str:
    return " or ".join("{" + ", ".join(sorted(s)) + "}" for s in table)


def status_xml(public: bool) -> bytes:
    """GetBucketPolicyStatus's answer: public when the bucket's rules (its ACL's or its
    policy's) grant anything to everyone or to every authenticated caller."""
    return document("PolicyStatus", el("IsPublic", "true" if public else "false"))


BLOCK_FIELDS = ("BlockPublicAcls", "IgnorePublicAcls", "BlockPublicPolicy", "RestrictPublicBuckets")


def public_block_from_xml(body: bytes) -> PublicBlock:
    """A PutPublicAccessBlock's PublicAccessBlockConfiguration (a field left out: false)."""
    root = parse(body)
    if local(root.tag) != "PublicAccessBlockConfiguration":
        raise S3Error("MalformedXML", "the root element must be PublicAccessBlockConfiguration")
    values = []
    for name in BLOCK_FIELDS:
        text = (child_text(root, name) or "false").strip().lower()
        if text not in ("true", "false"):
            raise S3Error("MalformedXML", f"{name} is true or false")
        values.append(text == "true")
    return PublicBlock(*values)


def public_block_xml(block: PublicBlock) -> bytes:
    on = (block.block_acls, block.ignore_acls, block.block_policy, block.restrict_policy)
    return document(
        "PublicAccessBlockConfiguration",
        *(el(name, value) for name, value in zip(BLOCK_FIELDS, on, strict=True)),
    )


def allows_everyone(body: bytes) -> bool:
    """Whether a policy document has an Allow for everyone (Principal ``*``): what a
    public access block's BlockPublicPolicy refuses, whether or not it translates."""
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return False
    statements = doc.get("Statement") if isinstance(doc, dict) else None
    if isinstance(statements, dict):
        statements = [statements]
    return any(
        isinstance(stmt, dict)
        and stmt.get("Effect") == "Allow"
        and stmt.get("Principal") in ("*", {"AWS": "*"})
        for stmt in statements or ()
    )


def translate(body: bytes, bucket: str, folder: str) -> tuple[str, list[PolicyRule]]:
    """The document (as kept and given back) and the rules of a PutBucketPolicy's body,
    for the bucket ``bucket`` whose directory is ``folder``; MalformedPolicy if any of it
    cannot be expressed exactly."""
    if len(body) > MAX_SIZE:
        raise _malformed(f"a bucket policy is at most {MAX_SIZE} bytes")
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _malformed(f"the policy is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise _malformed("the policy must be a JSON object")
    unknown = sorted(doc.keys() - {"Version", "Id", "Statement"})
    if unknown:
        raise _malformed(f"unknown element {unknown[0]!r} in the policy")
    if doc.get("Version", "2008-10-17") not in VERSIONS:
        raise _malformed(f"Version must be one of {', '.join(sorted(VERSIONS))}")
    statements = doc.get("Statement")
    if isinstance(statements, dict):
        statements = [statements]
    if not isinstance(statements, list) or not statements:
        raise _malformed("the policy needs a Statement")
    held: dict[tuple[bool, str, str], set[str]] = {}
    for stmt in statements:
        _statement(stmt, bucket, folder, held)
    return body.decode(), _rules(held, folder)
