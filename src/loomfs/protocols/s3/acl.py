"""S3 access control lists as the gateway shows them (protocol layer).

Who may read or write a path is decided once, in the namespace, for every protocol; the
S3 edge stores no grants of its own. What S3 clients see of that is the default every
S3 bucket and object starts with: the owner holds FULL_CONTROL and nobody else holds
anything. GetBucketAcl and GetObjectAcl answer that; PutBucketAcl and PutObjectAcl
accept what restates it (the canned ACL ``private``, or a policy whose only grant is the
owner's FULL_CONTROL) and answer NotImplemented for any other grant, rather than
accepting a grant they would not enforce. A canned ACL name that S3 does not know is
InvalidArgument, as in S3. A known canned ACL given with PutObject, CopyObject, CreateBucket
or CreateMultipartUpload is not applied (the object is created as the owner's alone) rather
than failing the upload; that is the one place where a grant is dropped, and it errs on
the side of less access.
"""

from __future__ import annotations

from .errors import S3Error
from .xmlio import Xml, child_text, document, el, local, parse

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
GRANT_HEADERS = (
    "x-amz-grant-read",
    "x-amz-grant-write",
    "x-amz-grant-read-acp",
    "x-amz-grant-write-acp",
    "x-amz-grant-full-control",
)
XSI = "http://www.w3.org/2001/XMLSchema-instance"
NOT_STORED = (
    "grants beyond the owner's FULL_CONTROL are not kept as S3 ACLs here: "
    "access is governed by the namespace's access rules"
)


def check_canned(value: str | None) -> str | None:
    """The x-amz-acl header's canned ACL, refused if S3 has no ACL of that name."""
    if value is not None and value not in CANNED:
        raise S3Error("InvalidArgument", f"{value!r} is not a canned ACL")
    return value


def _owner(owner: str) -> Xml:
    return el("Owner", el("ID", owner), el("DisplayName", owner))


def policy_xml(owner: str) -> bytes:
    """The AccessControlPolicy of a bucket or object: its owner's FULL_CONTROL."""
    grantee = Xml(
        f'<Grantee xmlns:xsi="{XSI}" xsi:type="CanonicalUser">'
        f"{el('ID', owner)}{el('DisplayName', owner)}</Grantee>"
    )
    grant = el("Grant", grantee, el("Permission", "FULL_CONTROL"))
    return document("AccessControlPolicy", _owner(owner), el("AccessControlList", grant))


def check_put(headers: dict[str, str], body: bytes, owner: str) -> None:
    """Accept a PutBucketAcl / PutObjectAcl that restates the owner-only default.

    ``headers`` are lower-cased. Raises InvalidArgument or MalformedXML for bad input and
    NotImplemented for any grant to someone other than the owner.
    """
    canned = check_canned(headers.get("x-amz-acl"))
    grants = [h for h in GRANT_HEADERS if h in headers]
    if canned is not None and (grants or body.strip()):
        raise S3Error("InvalidRequest", "give a canned ACL, grant headers or a policy, not several")
    if canned is not None:
        if canned != "private":
            raise S3Error("NotImplemented", NOT_STORED)
        return
    if grants:
        if grants != ["x-amz-grant-full-control"] or headers[grants[0]].strip() != f"id={owner}":
            raise S3Error("NotImplemented", NOT_STORED)
        return
    if not body.strip():
        raise S3Error("MalformedACLError", "give a canned ACL, grant headers or a policy")
    root = parse(body)
    if local(root.tag) != "AccessControlPolicy":
        raise S3Error("MalformedACLError", "the root element must be AccessControlPolicy")
    for node in root.iter():
        if local(node.tag) != "Grant":
            continue
        who = next((g for g in node if local(g.tag) == "Grantee"), None)
        if (
            who is None
            or child_text(who, "ID") != owner
            or child_text(node, "Permission") != "FULL_CONTROL"
        ):
            raise S3Error("NotImplemented", NOT_STORED)
