"""S3 server-side encryption headers and bucket encryption documents (protocol layer).

Only the translation lives here: what a request's ``x-amz-server-side-encryption*``
headers ask for (a ``namespace.sse.Sealing``, a customer's key checked against its MD5),
the headers that describe an object's encryption, and the
``ServerSideEncryptionConfiguration`` document of a bucket's default. Encrypting,
decrypting and refusing a read without its key are the governed namespace's
(``namespace.sse``), so every protocol reads an object alike.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Mapping

from ...namespace.sse import CUSTOMER_MD5_TAG, Kind, Sealed, Sealing
from .errors import S3Error
from .xmlio import Xml, child_text, document, el, local, parse

SSE = "x-amz-server-side-encryption"
KMS_KEY = "x-amz-server-side-encryption-aws-kms-key-id"
CUSTOMER = "x-amz-server-side-encryption-customer-"
COPY_CUSTOMER = "x-amz-copy-source-server-side-encryption-customer-"
AES256 = "AES256"
KMS = "aws:kms"
#: kept with a multipart upload until Complete: how its object is encrypted ("server",
#: "kms ID", "customer MD5"); never the customer's key itself
UPLOAD_TAG = "s3.sse-upload"


def _bad(message: str) -> S3Error:
    return S3Error("InvalidArgument", message)


def customer_key(headers: Mapping[str, str], prefix: str = CUSTOMER) -> Sealing | None:
    """The customer's key the lower-cased ``headers`` bring (SSE-C), checked against its
    MD5; None if they bring none."""
    algorithm = headers.get(prefix + "algorithm")
    key, md5 = headers.get(prefix + "key"), headers.get(prefix + "key-md5")
    if algorithm is None and key is None and md5 is None:
        return None
    if algorithm is None:
        raise _bad("a customer-provided key needs its algorithm header")
    if algorithm != AES256:
        raise _bad(f"the customer-provided key's algorithm must be {AES256}, not {algorithm}")
    if key is None or md5 is None:
        raise _bad("SSE-C needs the key and the key's MD5")
    try:
        raw = base64.b64decode(key, validate=True)
        digest = base64.b64decode(md5, validate=True)
    except binascii.Error:
        raise _bad("the customer-provided key and its MD5 are base64") from None
    if len(raw) != 32:
        raise _bad("the customer-provided key must be 256 bits")
    if hashlib.md5(raw).digest() != digest:
        raise _bad("the customer-provided key's MD5 does not match the key")
    return Sealing.customer(raw)


def asked(headers: Mapping[str, str]) -> Sealing | None:
    """How a write's lower-cased ``headers`` ask its object to be encrypted (None: as the
    bucket's default says)."""
    algorithm, key_id = headers.get(SSE), headers.get(KMS_KEY)
    customer = customer_key(headers)
    if algorithm is not None and customer is not None:
        raise _bad("an object is encrypted with a customer-provided key or by S3, not both")
    if key_id is not None and algorithm != KMS:
        raise _bad(f"{KMS_KEY} needs {SSE}: {KMS}")
    if customer is not None:
        return customer
    if algorithm is None:
        return None
    if algorithm == AES256:
        return Sealing(Kind.SERVER)
    if algorithm == KMS:
        return Sealing(Kind.KMS, key_id or None)
    raise _bad(f"{SSE} must be {AES256} or {KMS}, not {algorithm}")


def read_key(headers: Mapping[str, str]) -> Sealing | None:
    """The customer's key a read brings (GET, HEAD); S3 refuses the write-only headers."""
    if SSE in headers or KMS_KEY in headers:
        raise _bad(f"{SSE} is for writes: a read of an encrypted object needs no such header")
    return customer_key(headers)


def headers_of(tags: Mapping[str, str]) -> dict[str, str]:
    """The headers that say how the object with ``tags`` is encrypted."""
    sealed = Sealed.of(tags)
    if sealed is None:
        return {}
    if sealed.kind is Kind.CUSTOMER:
        return {CUSTOMER + "algorithm": AES256, CUSTOMER + "key-MD5": tags[CUSTOMER_MD5_TAG]}
    if sealed.kind is Kind.KMS:
        return {SSE: KMS, KMS_KEY: sealed.key_id or ""}
    return {SSE: AES256}


def sealing_headers(sealing: Sealing | None) -> dict[str, str]:
    """The headers of a write's answer that say how it encrypted (as ``headers_of``)."""
    if sealing is None:
        return {}
    if sealing.kind is Kind.CUSTOMER:
        return {CUSTOMER + "algorithm": AES256, CUSTOMER + "key-MD5": sealing.customer_md5}
    if sealing.kind is Kind.KMS:
        return {SSE: KMS, **({KMS_KEY: sealing.key_id} if sealing.key_id else {})}
    return {SSE: AES256}


def upload_value(sealing: Sealing) -> str:
    """``UPLOAD_TAG``'s value for an upload's encryption."""
    if sealing.kind is Kind.CUSTOMER:
        return f"customer {sealing.customer_md5}"
    return sealing.as_default()


def upload_sealing(value: str | None, headers: Mapping[str, str]) -> Sealing | None:
    """How an upload with ``UPLOAD_TAG`` ``value`` encrypts, for a part or its Complete
    (``headers`` lower-cased): a customer's key must come again, the same one."""
    key = customer_key(headers)
    if value is None:
        if key is not None:
            raise _bad("this upload was not begun with a customer-provided key")
        return None
    kind, _, rest = value.partition(" ")
    if kind != Kind.CUSTOMER.value:
        return Sealing.of_default(value)
    if key is None:
        raise S3Error("InvalidRequest", "this upload needs its customer-provided key")
    if key.customer_md5 != rest:
        raise S3Error("InvalidRequest", "this upload was begun with another customer key")
    return key


def config_xml(sealing: Sealing) -> bytes:
    algorithm = AES256 if sealing.kind is Kind.SERVER else KMS
    children: list[Xml] = [el("SSEAlgorithm", algorithm)]
    if sealing.key_id is not None:
        children.append(el("KMSMasterKeyID", sealing.key_id))
    return document(
        "ServerSideEncryptionConfiguration",
        el(
            "Rule",
            el("ApplyServerSideEncryptionByDefault", *children),
            el("BucketKeyEnabled", False),
        ),
    )


def config_of(body: bytes) -> Sealing:
    """The default a ``ServerSideEncryptionConfiguration`` document sets."""
    root = parse(body)
    if local(root.tag) != "ServerSideEncryptionConfiguration":
        raise S3Error("MalformedXML", "the root element must be ServerSideEncryptionConfiguration")
    rules = [r for r in root if local(r.tag) == "Rule"]
    if len(rules) != 1:
        raise S3Error("MalformedXML", "a bucket's encryption configuration has one Rule")
    applied = [a for a in rules[0] if local(a.tag) == "ApplyServerSideEncryptionByDefault"]
    if len(applied) != 1:
        raise S3Error("MalformedXML", "the Rule needs ApplyServerSideEncryptionByDefault")
    algorithm = child_text(applied[0], "SSEAlgorithm")
    key_id = child_text(applied[0], "KMSMasterKeyID")
    if algorithm == AES256 and key_id is None:
        return Sealing(Kind.SERVER)
    if algorithm == KMS:
        return Sealing(Kind.KMS, key_id or None)
    raise S3Error("MalformedXML", f"SSEAlgorithm must be {AES256} or {KMS} (a key only with it)")
