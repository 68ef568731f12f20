"""S3 bucket lifecycle configurations (protocol layer): S3's XML to the hub's rules and back.

A LifecycleConfiguration becomes the hub's lifecycle rules (``namespace.lifecycle.Rule``) on the
bucket's directory, which the hub's expiry task applies: expiration of current objects
(Days, Date), of old versions (NoncurrentVersionExpiration), of delete markers left alone
(ExpiredObjectDeleteMarker), and of incomplete multipart uploads (AbortIncompleteMultipart
Upload, done by ``S3Gateway.expire_uploads``). An S3 tag filter is the namespace tag the
S3 tag is kept as (``tagging.PREFIX``). Transitions are refused: there is one storage
class here. A rule is given back as it came (its Prefix at the top, or in a Filter, or in
a Filter's And); a rule sent without an ID gets one, as S3 gives.
"""

from __future__ import annotations

import math
import secrets
import xml.etree.ElementTree as ET

from ...errors import InvalidArgument
from ...namespace.lifecycle import DAY_S, MAX_RULE_CHARS, Rule, parse_date
from . import tagging
from .errors import S3Error
from .xmlio import child_text, document, el, http_time, local, nodes, parse

MAX_RULES = 1000
MAX_ID = 255
STATUSES = ("Enabled", "Disabled")


def _child(node: ET.Element, name: str) -> ET.Element | None:
    return next((c for c in node if local(c.tag) == name), None)


def _int(node: ET.Element | None, name: str) -> int | None:
    text = None if node is None else child_text(node, name)
    if text is None:
        return None
    if not text.strip().isdigit():
        raise S3Error("InvalidArgument", f"{name} must be a whole number")
    return int(text)


def _filter(
    node: ET.Element,
) -> tuple[str, str, tuple[tuple[str, str], ...], int | None, int | None]:
    """(form, prefix, tags, size_gt, size_lt) of a rule."""
    top = child_text(node, "Prefix")
    found = _child(node, "Filter")
    if found is None:
        return "prefix", top or "", (), None, None
    if top is not None:
        raise S3Error("MalformedXML", "a rule has a Prefix or a Filter, not both")
    form, where = "filter", found
    both = _child(found, "And")
    if both is not None:
        form, where = "and", both
    elif not len(found):
        form = "none"
    tags = tuple(
        (tagging.PREFIX + (child_text(t, "Key") or ""), child_text(t, "Value") or "")
        for t in where
        if local(t.tag) == "Tag"
    )
    return (
        form,
        child_text(where, "Prefix") or "",
        tags,
        _int(where, "ObjectSizeGreaterThan"),
        _int(where, "ObjectSizeLessThan"),
    )


def _rule(node: ET.Element) -> Rule:
    rule_id = child_text(node, "ID") or secrets.token_hex(16)
    if len(rule_id) > MAX_ID:
        raise S3Error("InvalidArgument", f"a rule's ID is at most {MAX_ID} characters")
    status = child_text(node, "Status")
    if status not in STATUSES:
        raise S3Error("MalformedXML", f"a rule's Status is Enabled or Disabled, not {status!r}")
    if _child(node, "Transition") is not None or _child(node, "NoncurrentVersionTransition"):
        raise S3Error("InvalidStorageClass", "transitions need storage classes; there is one here")
    form, prefix, tags, size_gt, size_lt = _filter(node)
    expiration = _child(node, "Expiration")
    date = None if expiration is None else child_text(expiration, "Date")
    if date is not None:
        try:
            when = parse_date(date)
        except InvalidArgument:
            raise S3Error("InvalidArgument", f"{date!r} is not an ISO 8601 date") from None
        if (when.hour, when.minute, when.second, when.microsecond) != (0, 0, 0, 0):
            raise S3Error("InvalidArgument", "an expiration date must be a midnight UTC")
    marker = None if expiration is None else child_text(expiration, "ExpiredObjectDeleteMarker")
    noncurrent = _child(node, "NoncurrentVersionExpiration")
    rule = Rule(
        rule_id,
        status == "Enabled",
        prefix,
        tags,
        size_gt,
        size_lt,
        days=_int(expiration, "Days"),
        date=date,
        expired_markers=None if marker is None else marker.strip() == "true",
        noncurrent_days=_int(noncurrent, "NoncurrentDays"),
        newer_noncurrent=_int(noncurrent, "NewerNoncurrentVersions"),
        abort_days=_int(_child(node, "AbortIncompleteMultipartUpload"), "DaysAfterInitiation"),
        form=form,
    )
    if rule.days is not None and rule.days < 1 and rule.date is None:
        raise S3Error("InvalidArgument", "Days in an Expiration must be a positive integer")
    if len(rule.to_json()) > MAX_RULE_CHARS:
        raise S3Error("InvalidRequest", f"a rule is kept in at most {MAX_RULE_CHARS} characters")
    return rule


def from_xml(body: bytes) -> list[Rule]:
    root = parse(body)
    if local(root.tag) != "LifecycleConfiguration":
        raise S3Error("MalformedXML", "the root element must be LifecycleConfiguration")
    rules = [_rule(node) for node in root if local(node.tag) == "Rule"]
    if not 1 <= len(rules) <= MAX_RULES:
        raise S3Error("MalformedXML", f"a lifecycle configuration has 1 to {MAX_RULES} rules")
    if len({r.id for r in rules}) != len(rules):
        raise S3Error("InvalidArgument", "rule IDs must be unique")
    return rules


def _filter_xml(rule: Rule) -> tuple[str | None, ...]:
    s3_tags = [el("Tag", el("Key", k[len(tagging.PREFIX) :]), el("Value", v)) for k, v in rule.tags]
    conditions = (
        el("Prefix", rule.prefix) if rule.prefix or rule.form == "filter" else None,
        nodes(s3_tags),
        el("ObjectSizeGreaterThan", rule.size_gt) if rule.size_gt is not None else None,
        el("ObjectSizeLessThan", rule.size_lt) if rule.size_lt is not None else None,
    )
    if rule.form == "prefix":
        return (el("Prefix", rule.prefix),)
    if rule.form == "and":
        return (el("Filter", el("And", *conditions)),)
    return (el("Filter", *conditions),)


def as_xml(rules: list[Rule]) -> bytes:
    return document(
        "LifecycleConfiguration",
        nodes(el("Rule", *_rule_xml(rule)) for rule in rules),
    )


def _rule_xml(rule: Rule) -> tuple[str | None, ...]:
    expiration = (
        el(
            "Expiration",
            el("Days", rule.days) if rule.days is not None else None,
            el("Date", rule.date) if rule.date is not None else None,
            el("ExpiredObjectDeleteMarker", rule.expired_markers)
            if rule.expired_markers is not None
            else None,
        )
        if rule.days is not None or rule.date is not None or rule.expired_markers is not None
        else None
    )
    noncurrent = (
        el(
            "NoncurrentVersionExpiration",
            el("NoncurrentDays", rule.noncurrent_days)
            if rule.noncurrent_days is not None
            else None,
            el("NewerNoncurrentVersions", rule.newer_noncurrent)
            if rule.newer_noncurrent is not None
            else None,
        )
        if rule.noncurrent_days is not None or rule.newer_noncurrent is not None
        else None
    )
    abort = (
        el("AbortIncompleteMultipartUpload", el("DaysAfterInitiation", rule.abort_days))
        if rule.abort_days is not None
        else None
    )
    return (
        el("ID", rule.id),
        *_filter_xml(rule),
        el("Status", "Enabled" if rule.enabled else "Disabled"),
        expiration,
        noncurrent,
        abort,
    )


def expiration_header(
    rules: list[Rule], key: str, size: int, tags: dict[str, str], mtime_ns: int
) -> str | None:
    """x-amz-expiration for a current object: the day the first enabled rule that picks
    it expires it, S3's way (its mtime plus the days, rounded up to a midnight UTC: the
    hub may expire it up to a day sooner)."""
    for rule in rules:
        if not rule.enabled or not rule.picks(key, size, tags):
            continue
        when = rule.expires_at(mtime_ns, DAY_S)
        if when is not None:
            midnight = math.ceil(when / DAY_S) * DAY_S
            return f'expiry-date="{http_time(int(midnight * 1e9))}", rule-id="{rule.id}"'
    return None
