"""S3 CORS (protocol layer): a bucket's CORS rules, kept, and the answers browsers get.

A bucket's CORSConfiguration is kept in the namespace's tags of its directory, one tag per
rule under ``PREFIX`` (a rule in compact JSON, so that a rule fits in a tag's value), the way
its tag set is. A browser asks before a cross-origin request (a preflight: OPTIONS with
Origin and Access-Control-Request-Method), and reads the Access-Control-* headers of the
answer to the request itself; both come from the first rule that allows the origin (which
may have one '*' wildcard), the method and every header asked for.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from dataclasses import dataclass

from .errors import S3Error
from .xmlio import child_text, document, el, local, nodes, parse

PREFIX = "s3.cors."
METHODS = frozenset({"GET", "PUT", "POST", "DELETE", "HEAD"})
MAX_RULES = 100
MAX_RULE = 1024  # characters a rule may take in its tag (a namespace tag value's limit)


@dataclass(frozen=True, slots=True)
class Rule:
    origins: tuple[str, ...]
    methods: tuple[str, ...]
    headers: tuple[str, ...] = ()
    expose: tuple[str, ...] = ()
    max_age: int | None = None
    id: str | None = None

    def allows(self, origin: str, method: str, headers: list[str]) -> bool:
        return (
            method in self.methods
            and any(_matches(pattern, origin) for pattern in self.origins)
            and all(any(_matches(p.lower(), h.lower()) for p in self.headers) for h in headers)
        )

    def answer(self, origin: str, requested: list[str]) -> dict[str, str]:
        """The Access-Control-* headers for ``origin`` (requested: the headers asked for)."""
        wildcard = "*" in self.origins
        out = {
            "Access-Control-Allow-Origin": "*" if wildcard else origin,
            "Access-Control-Allow-Methods": ", ".join(self.methods),
            "Vary": "Origin, Access-Control-Request-Headers, Access-Control-Request-Method",
        }
        if not wildcard:
            out["Access-Control-Allow-Credentials"] = "true"
        if requested:
            out["Access-Control-Allow-Headers"] = ", ".join(requested)
        if self.expose:
            out["Access-Control-Expose-Headers"] = ", ".join(self.expose)
        if self.max_age is not None:
            out["Access-Control-Max-Age"] = str(self.max_age)
        return out


def _matches(pattern: str, value: str) -> bool:
    head, star, tail = pattern.partition("*")
    if not star:
        return pattern == value
    return len(value) >= len(head) + len(tail) and value.startswith(head) and value.endswith(tail)


def _texts(node: ET.Element, name: str) -> tuple[str, ...]:
    return tuple((child.text or "").strip() for child in node if local(child.tag) == name)


def from_xml(body: bytes) -> list[Rule]:
    root = parse(body)
    if local(root.tag) != "CORSConfiguration":
        raise S3Error("MalformedXML", "the root element must be CORSConfiguration")
    rules = []
    for node in root:
        if local(node.tag) != "CORSRule":
            continue
        origins, methods = _texts(node, "AllowedOrigin"), _texts(node, "AllowedMethod")
        if not origins or not methods:
            raise S3Error("MalformedXML", "a CORSRule needs an AllowedOrigin and an AllowedMethod")
        if unknown := sorted(set(methods) - METHODS):
            raise S3Error(
                "InvalidRequest",
                f"found unsupported HTTP method in CORS config. Unsupported method is {unknown[0]}",
            )
        age = child_text(node, "MaxAgeSeconds")
        if age is not None and not age.strip().isdigit():
            raise S3Error("MalformedXML", "MaxAgeSeconds must be a whole number")
        rules.append(
            Rule(
                origins,
                methods,
                _texts(node, "AllowedHeader"),
                _texts(node, "ExposeHeader"),
                int(age) if age is not None else None,
                child_text(node, "ID"),
            )
        )
    if not rules or len(rules) > MAX_RULES:
        raise S3Error("MalformedXML", f"a CORS configuration has 1 to {MAX_RULES} rules")
    return rules


def as_tags(rules: list[Rule]) -> dict[str, str]:
    tags = {}
    for number, rule in enumerate(rules):
        kept = json.dumps(
            [rule.origins, rule.methods, rule.headers, rule.expose, rule.max_age, rule.id],
            separators=(",", ":"),
        )
        if len(kept) > MAX_RULE:
            raise S3Error("InvalidRequest", f"a CORS rule is kept in at most {MAX_RULE} characters")
        tags[f"{PREFIX}{number:03d}"] = kept
    return tags


def of(tags: Mapping[str, str]) -> list[Rule]:
    """The rules among a bucket's tags, in order."""
    rules = []
    for name in sorted(n for n in tags if n.startswith(PREFIX)):
        origins, methods, headers, expose, max_age, rule_id = json.loads(tags[name])
        rules.append(
            Rule(tuple(origins), tuple(methods), tuple(headers), tuple(expose), max_age, rule_id)
        )
    return rules


def as_xml(rules: list[Rule]) -> bytes:
    return document(
        "CORSConfiguration",
        nodes(
            el(
                "CORSRule",
                el("ID", rule.id) if rule.id is not None else None,
                nodes(el("AllowedHeader", h) for h in rule.headers),
                nodes(el("AllowedMethod", m) for m in rule.methods),
                nodes(el("AllowedOrigin", o) for o in rule.origins),
                nodes(el("ExposeHeader", h) for h in rule.expose),
                el("MaxAgeSeconds", rule.max_age) if rule.max_age is not None else None,
            )
            for rule in rules
        ),
    )


def requested_headers(value: str | None) -> list[str]:
    return [h.strip() for h in (value or "").split(",") if h.strip()]


def matching(rules: list[Rule], origin: str, method: str, headers: list[str]) -> Rule | None:
    return next((rule for rule in rules if rule.allows(origin, method, headers)), None)
