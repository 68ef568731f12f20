"""S3 access control lists, translated to and from the namespace's access rules
(protocol layer).

Who may read or write a path is decided once, in the namespace, for every protocol; this
module only translates. A bucket made by CreateBucket is private to its creator, who holds
admin on it (``GovernedNamespace.mkdir_owned``); an S3 grant becomes a rule on the
bucket's or the object's path, and GetBucketAcl / GetObjectAcl read those rules back:

=========================  ===================================  ==========================
S3                         on a bucket                          on an object
=========================  ===================================  ==========================
READ                       list (see keys and their metadata)   read
WRITE                      put (create, overwrite, delete keys  (nothing: S3 gives object
                           without reading them)                WRITE no meaning)
FULL_CONTROL               admin (everything below it too)      admin
AllUsers group             group:everyone (anonymous callers too)
AuthenticatedUsers group   group:authenticated
CanonicalUser ID           user:ID (IDs are user names here)
=========================  ===================================  ==========================

Canned ACLs are those grants: ``public-read`` is READ for AllUsers, ``public-read-write``
READ and WRITE, ``authenticated-read`` READ for AuthenticatedUsers; ``private`` and the
``bucket-owner-*`` ones add nothing to the bucket owner's admin. What the rules cannot say
(READ_ACP and WRITE_ACP alone, grantees by e-mail, ``aws-exec-read``,
``log-delivery-write``) is answered NotImplemented rather than granted differently. A
canned ACL name S3 does not know is InvalidArgument, as in S3.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping

from ...core.acl import AUTHENTICATED, EVERYONE
from ...core.types import Action
from .errors import S3Error
from .xmlio import Xml, child_text, document, el, local, nodes, parse

# https://docs.aws.amazon.com/AmazonS3/latest/userguide/acl-overview.html#canned-acl
CANNED = frozenset(
    {
        "private",
        "public-read",
        "public-read-write",
        "aws-exec-read",
        "authenticated-read",
        "bucket-owner-read",
        "bucket-owner-full-control",
        "log-delivery-write",
    }
)
GRANT_HEADERS = {
    "x-amz-grant-read": "READ",
    "x-amz-grant-write": "WRITE",
    "x-amz-grant-read-acp": "READ_ACP",
    "x-amz-grant-write-acp": "WRITE_ACP",
    "x-amz-grant-full-control": "FULL_CONTROL",
}
XSI = "http://www.w3.org/2001/XMLSchema-instance"
GROUPS = {
    "http://acs.amazonaws.com/groups/global/AllUsers": f"group:{EVERYONE}",
    "http://acs.amazonaws.com/groups/global/AuthenticatedUsers": f"group:{AUTHENTICATED}",
}
URIS = {subject: uri for uri, subject in GROUPS.items()}
# S3 permission -> the action a rule grants, on a bucket and on an object (None: nothing)
ON_BUCKET: dict[str, Action | None] = {
    "READ": Action.LIST,
    "WRITE": Action.PUT,
    "FULL_CONTROL": Action.ADMIN,
}
ON_OBJECT: dict[str, Action | None] = {
    "READ": Action.READ,
    "WRITE": None,
    "FULL_CONTROL": Action.ADMIN,
}
# a rule's action -> the S3 permissions it shows as
SHOWN_ON_BUCKET = {
    Action.LIST: ("READ",),
    Action.READ: ("READ",),
    Action.PUT: ("WRITE",),
    Action.WRITE: ("READ", "WRITE"),
    Action.ADMIN: ("FULL_CONTROL",),
}
SHOWN_ON_OBJECT = {
    Action.LIST: (),
    Action.READ: ("READ",),
    Action.PUT: ("WRITE",),
    Action.WRITE: ("READ", "WRITE"),
    Action.ADMIN: ("FULL_CONTROL",),
}
CANNED_GRANTS = {
    "private": (),
    "bucket-owner-read": (),
    "bucket-owner-full-control": (),
    "public-read": (("AllUsers", "READ"),),
    "public-read-write": (("AllUsers", "READ"), ("AllUsers", "WRITE")),
    "authenticated-read": (("AuthenticatedUsers", "READ"),),
}
Grants = frozenset[tuple[str, Action]]


def _not_kept(what: str) -> S3Error:
    return S3Error("NotImplemented", f"{what} cannot be expressed as the namespace's access rules")


def check_canned(value: str | None) -> str | None:
    """The x-amz-acl header's canned ACL, refused if S3 has no ACL of that name."""
    if value is not None and value not in CANNED:
        raise S3Error("InvalidArgument", f"{value!r} is not a canned ACL")
    return value


def _rule(subject: str, permission: str, *, bucket: bool) -> tuple[str, Action] | None:
    table = ON_BUCKET if bucket else ON_OBJECT
    if permission not in table:
        raise _not_kept(f"the permission {permission}")
    action = table[permission]
    return None if action is None else (subject, action)


def _rules(pairs: Iterable[tuple[str, str]], owner: str, *, bucket: bool) -> Grants:
    out = set()
    for subject, permission in pairs:
        if subject == f"user:{owner}":
            continue  # the owner's admin is implied (and cannot be given away)
        rule = _rule(subject, permission, bucket=bucket)
        if rule is not None:
            out.add(rule)
    return frozenset(out)


def canned(name: str, *, bucket: bool) -> Grants:
    """The rules of a canned ACL (on top of the bucket owner's admin)."""
    if name not in CANNED_GRANTS:
        raise _not_kept(f"the canned ACL {name}")
    group = {"AllUsers": f"group:{EVERYONE}", "AuthenticatedUsers": f"group:{AUTHENTICATED}"}
    return _rules(((group[g], p) for g, p in CANNED_GRANTS[name]), "", bucket=bucket)


def _header_grantee(item: str) -> str:
    kind, _, value = item.strip().partition("=")
    value = value.strip().strip('"')
    if kind == "id" and value:
        return f"user:{value}"
    if kind == "uri" and value in GROUPS:
        return GROUPS[value]
    raise _not_kept(f"the grantee {item.strip()!r}")


def _xml_grantee(node: ET.Element) -> str:
    kind = next((v for k, v in node.attrib.items() if local(k) == "type"), "")
    uri, user = child_text(node, "URI"), child_text(node, "ID")
    if kind == "Group" or (uri and not user):
        if uri in GROUPS:
            return GROUPS[uri]
        raise _not_kept(f"the group {uri!r}")
    if user:
        return f"user:{user}"
    raise _not_kept("a grantee by e-mail address")


def requested(headers: Mapping[str, str], body: bytes, owner: str, *, bucket: bool) -> Grants:
    """The rules a PutBucketAcl / PutObjectAcl asks for (``headers`` lower-cased): from
    its canned ACL, its grant headers or its AccessControlPolicy, exactly one of them."""
    name = check_canned(headers.get("x-amz-acl"))
    granted = [h for h in GRANT_HEADERS if h in headers]
    if name is not None and (granted or body.strip()):
        raise S3Error("InvalidRequest", "give a canned ACL, grant headers or a policy, not several")
    if name is not None:
        return canned(name, bucket=bucket)
    if granted:
        pairs = [
            (_header_grantee(item), GRANT_HEADERS[h])
            for h in granted
            for item in headers[h].split(",")
            if item.strip()
        ]
        return _rules(pairs, owner, bucket=bucket)
    if not body.strip():
        raise S3Error("MalformedACLError", "give a canned ACL, grant headers or a policy")
    root = parse(body)
    if local(root.tag) != "AccessControlPolicy":
        raise S3Error("MalformedACLError", "the root element must be AccessControlPolicy")
    pairs = []
    for node in root.iter():
        if local(node.tag) != "Grant":
            continue
        grantee = next((g for g in node if local(g.tag) == "Grantee"), None)
        permission = child_text(node, "Permission")
        if grantee is None or permission is None:
            raise S3Error("MalformedACLError", "each Grant needs a Grantee and a Permission")
        pairs.append((_xml_grantee(grantee), permission))
    return _rules(pairs, owner, bucket=bucket)


def _grant(subject: str, permission: str) -> Xml | None:
    if subject in URIS:
        inner = f'<Grantee xmlns:xsi="{XSI}" xsi:type="Group">{el("URI", URIS[subject])}'
    elif subject.startswith("user:"):
        name = subject.removeprefix("user:")
        inner = (
            f'<Grantee xmlns:xsi="{XSI}" xsi:type="CanonicalUser">'
            f"{el('ID', name)}{el('DisplayName', name)}"
        )
    else:
        return None  # a group of the registry: S3 has no grantee for it
    return el("Grant", Xml(inner + "</Grantee>"), el("Permission", permission))


def policy_xml(owner: str, rules: Iterable[tuple[str, Action]] = (), *, bucket: bool) -> bytes:
    """The AccessControlPolicy: the owner's FULL_CONTROL and the rules on the path."""
    shown = SHOWN_ON_BUCKET if bucket else SHOWN_ON_OBJECT
    grants = [_grant(f"user:{owner}", "FULL_CONTROL")]
    seen = {(f"user:{owner}", "FULL_CONTROL")}
    for subject, action in sorted(rules):
        for permission in shown[action]:
            if (subject, permission) not in seen:
                seen.add((subject, permission))
                grants.append(_grant(subject, permission))
    return document(
        "AccessControlPolicy",
        el("Owner", el("ID", owner), el("DisplayName", owner)),
        el("AccessControlList", nodes(g for g in grants if g is not None)),
    )
