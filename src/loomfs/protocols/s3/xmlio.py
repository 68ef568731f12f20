"""S3's XML (protocol layer): small request documents in, response documents out.

Request documents (DeleteObjects, CompleteMultipartUpload) are bounded in size and may
not declare a DTD, so entity expansion cannot be used against the gateway.
"""

from __future__ import annotations

import functools
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from email.utils import formatdate
from urllib.parse import quote
from xml.sax.saxutils import escape

from .errors import S3Error

S3_NS = "http://s3.amazonaws.com/doc/2006-03-01/"
HEADER = '<?xml version="1.0" encoding="UTF-8"?>\n'
MAX_DOCUMENT = 2 << 20


class Xml(str):
    """Encoded XML: inserted into a parent as it is, where plain text is escaped."""


Child = str | int | bool | None


def el(name: str, *children: Child) -> Xml:
    """``<name>children</name>``; None children are left out."""
    parts: list[str] = []
    for child in children:
        if child is None:
            continue
        if isinstance(child, Xml):
            parts.append(child)
        elif isinstance(child, bool):
            parts.append("true" if child else "false")
        else:
            parts.append(escape(str(child)))
    return Xml(f"<{name}>{''.join(parts)}</{name}>")


def nodes(items: Iterable[Xml]) -> Xml:
    return Xml("".join(items))


def document(root: str, *children: Child) -> bytes:
    inner = el(root, *children)[len(root) + 2 :]
    return f'{HEADER}<{root} xmlns="{S3_NS}">{inner}'.encode()


def iso_time(ns: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ns // 1_000_000_000)) + (
        f".{(ns // 1_000_000) % 1000:03d}Z"
    )


@functools.lru_cache(maxsize=4096)
def http_time(ns: int) -> str:
    # every GET and HEAD formats its object's mtime; the same objects are asked for again
    return formatdate(ns // 1_000_000_000, usegmt=True)


def url_encode(value: str, encode: bool) -> str:
    """Keys in listings when the client asked for ``encoding-type=url``."""
    return quote(value, safe="/") if encode else value


def parse(body: bytes) -> ET.Element:
    if len(body) > MAX_DOCUMENT:
        raise S3Error("MalformedXML", "the XML document is too large")
    if b"<!DOCTYPE" in body or b"<!ENTITY" in body:
        raise S3Error("MalformedXML", "DTDs and entities are not allowed")
    try:
        return ET.fromstring(body)
    except ET.ParseError as exc:
        raise S3Error("MalformedXML", f"the XML is not well-formed: {exc}") from None


def local(tag: str) -> str:
    """A tag without its namespace ('{ns}Key' -> 'Key')."""
    return tag.rsplit("}", 1)[-1]


def child_text(element: ET.Element, name: str) -> str | None:
    for child in element:
        if local(child.tag) == name:
            return child.text or ""
    return None
