"""S3 object and bucket tagging (protocol layer): tag sets in and out of S3's forms.

An S3 tag set is kept as the namespace's tags of the object's (or the bucket's) path, one
namespace tag per S3 tag under ``PREFIX``, as x-amz-meta-* is under ``s3.meta.``: what S3
tags, every protocol sees (``loomfs tag``) and residency policies can select on. Here are
S3's limits (10 tags on an object, 50 on a bucket, keys of 1-128 and values of up to 256
characters, no 'aws:' keys) and its two spellings of a tag set: the Tagging XML document
of Put/GetObjectTagging and the URL-encoded x-amz-tagging header of PUT, CopyObject and
CreateMultipartUpload.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from urllib.parse import parse_qsl

from .errors import S3Error
from .xmlio import child_text, document, el, local, nodes, parse

PREFIX = "s3.tag."
MAX_OBJECT_TAGS = 10
MAX_BUCKET_TAGS = 50
MAX_KEY = 128
MAX_VALUE = 256


def checked(pairs: Iterable[tuple[str, str]], limit: int = MAX_OBJECT_TAGS) -> dict[str, str]:
    """The namespace tags for an S3 tag set, refused with InvalidTag where S3 refuses it."""
    tags: dict[str, str] = {}
    for key, value in pairs:
        if not 1 <= len(key) <= MAX_KEY or len(value) > MAX_VALUE:
            raise S3Error(
                "InvalidTag", f"tag keys are 1-{MAX_KEY} characters, values at most {MAX_VALUE}"
            )
        if key.lower().startswith("aws:"):
            raise S3Error("InvalidTag", "system tags (aws:) cannot be added by a requester")
        if PREFIX + key in tags:
            raise S3Error("InvalidTag", "cannot provide multiple tags with the same key")
        tags[PREFIX + key] = value
    if len(tags) > limit:
        raise S3Error("InvalidTag", f"at most {limit} tags are allowed")
    return tags


def from_header(value: str | None) -> dict[str, str]:
    """The namespace tags an x-amz-tagging header ('k1=v1&k2') asks for; none if absent."""
    if not value:
        return {}
    return checked(parse_qsl(value, keep_blank_values=True))


def from_xml(body: bytes, limit: int) -> dict[str, str]:
    root = parse(body)
    tag_set = next((child for child in root if local(child.tag) == "TagSet"), None)
    if local(root.tag) != "Tagging" or tag_set is None:
        raise S3Error("MalformedXML", "the document must be Tagging with a TagSet")
    pairs = []
    for tag in tag_set:
        key, value = child_text(tag, "Key"), child_text(tag, "Value")
        if local(tag.tag) != "Tag" or key is None or value is None:
            raise S3Error("MalformedXML", "each Tag needs a Key and a Value")
        pairs.append((key, value))
    return checked(pairs, limit)


def of(tags: Mapping[str, str]) -> dict[str, str]:
    """The S3 tag set among an entry's namespace tags, by S3 key."""
    return {k[len(PREFIX) :]: v for k, v in tags.items() if k.startswith(PREFIX)}


def as_xml(tags: Mapping[str, str]) -> bytes:
    pairs = sorted(of(tags).items())  # S3 answers them in key order
    rows = nodes(el("Tag", el("Key", k), el("Value", v)) for k, v in pairs)
    return document("Tagging", el("TagSet", rows))
