"""S3 object lock (protocol layer): its XML and headers to the namespace's locks and back.

The lock itself is the namespace's (``namespace.objectlock``): a bucket made with
x-amz-bucket-object-lock-enabled (or given an ObjectLockConfiguration) is versioned for
good and may have a default retention; a version's retention and legal hold are kept in
its tags and enforced by the namespace for every protocol. Here are S3's documents
(ObjectLockConfiguration, Retention, LegalHold) and the x-amz-object-lock-* headers.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime

from ...namespace import objectlock
from ...namespace.objectlock import DAY_S, MODES, Lock
from .errors import S3Error
from .xmlio import child_text, document, el, local, parse

YEAR_S = 365 * DAY_S


def configuration_from_xml(body: bytes) -> dict[str, str]:
    """The directory tags of a PutObjectLockConfiguration's document."""
    root = parse(body)
    if local(root.tag) != "ObjectLockConfiguration":
        raise S3Error("MalformedXML", "the root element must be ObjectLockConfiguration")
    if child_text(root, "ObjectLockEnabled") != "Enabled":
        raise S3Error("MalformedXML", "ObjectLockEnabled must be Enabled")
    tags = {objectlock.ENABLED: "Enabled", objectlock.DEFAULT: ""}
    rule = next((c for c in root if local(c.tag) == "Rule"), None)
    default = next((c for c in rule or () if local(c.tag) == "DefaultRetention"), None)
    if default is None:
        return tags
    mode, days, years = (child_text(default, n) for n in ("Mode", "Days", "Years"))
    if mode not in MODES:
        raise S3Error("MalformedXML", f"a retention Mode is GOVERNANCE or COMPLIANCE, not {mode!r}")
    if (days is None) == (years is None):
        raise S3Error("MalformedXML", "a DefaultRetention has Days or Years, one of them")
    count_text = days if days is not None else years
    assert count_text is not None
    try:
        count = int(count_text)
    except ValueError:
        raise S3Error("MalformedXML", "Days and Years are whole numbers") from None
    if count <= 0:
        raise S3Error("InvalidRetentionPeriod", "the retention period must be positive")
    unit = "days" if days is not None else "years"
    seconds = count * (DAY_S if unit == "days" else YEAR_S)
    tags[objectlock.DEFAULT] = json.dumps({"mode": mode, "seconds": seconds, unit: count})
    return tags


def configuration_xml(tags: Mapping[str, str]) -> bytes:
    default = json.loads(tags[objectlock.DEFAULT]) if tags.get(objectlock.DEFAULT) else None
    rule = None
    if default is not None:
        count = el("Days", default["days"]) if "days" in default else el("Years", default["years"])
        rule = el("Rule", el("DefaultRetention", el("Mode", default["mode"]), count))
    return document("ObjectLockConfiguration", el("ObjectLockEnabled", "Enabled"), rule)


def _when(text: str) -> float:
    try:
        return datetime.fromisoformat(text.strip().replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise S3Error("MalformedXML", f"{text!r} is not an ISO 8601 date") from None


def _iso(when: float) -> str:
    return datetime.fromtimestamp(when, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def retention_from_xml(body: bytes, old: Lock) -> Lock:
    root = parse(body)
    mode, until = child_text(root, "Mode"), child_text(root, "RetainUntilDate")
    if mode is None and until is None:
        return Lock(hold=old.hold)  # an empty Retention removes it
    if mode not in MODES:
        raise S3Error("MalformedXML", f"a retention Mode is GOVERNANCE or COMPLIANCE, not {mode!r}")
    if until is None:
        raise S3Error("MalformedXML", "a Retention needs a RetainUntilDate")
    return Lock(mode, _when(until), old.hold)


def retention_xml(lock: Lock) -> bytes:
    if lock.mode is None or lock.until is None:
        raise S3Error("NoSuchObjectLockConfiguration", "the object has no retention")
    return document("Retention", el("Mode", lock.mode), el("RetainUntilDate", _iso(lock.until)))


def legal_hold_from_xml(body: bytes, old: Lock) -> Lock:
    status = child_text(parse(body), "Status")
    if status not in ("ON", "OFF"):
        raise S3Error("MalformedXML", f"a LegalHold Status is ON or OFF, not {status!r}")
    return Lock(old.mode, old.until, status == "ON")


def legal_hold_xml(lock: Lock) -> bytes:
    return document("LegalHold", el("Status", "ON" if lock.hold else "OFF"))


def asked(headers: Mapping[str, str]) -> Lock | None:
    """The lock a write's x-amz-object-lock-* headers ask for its object; None if none."""
    mode = headers.get("x-amz-object-lock-mode")
    until = headers.get("x-amz-object-lock-retain-until-date")
    hold = headers.get("x-amz-object-lock-legal-hold") == "ON"
    if (mode is None) != (until is None):
        raise S3Error(
            "InvalidArgument",
            "x-amz-object-lock-mode and x-amz-object-lock-retain-until-date come together",
        )
    if mode is not None and until is not None:
        if mode not in MODES:
            raise S3Error("InvalidArgument", f"unknown object lock mode {mode!r}")
        return Lock(mode, _when(until), hold)
    return Lock(hold=True) if hold else None


def with_default(lock: Lock | None, bucket_tags: Mapping[str, str]) -> Lock | None:
    """The lock a new object gets: the one it asked for (``asked``), else the bucket's
    default retention (with the legal hold it asked for); None if none."""
    if lock is not None and lock.mode is not None:
        return lock
    default = objectlock.default_lock(bucket_tags)
    if default is None:
        return lock
    return Lock(default.mode, default.until, lock is not None and lock.hold)


def headers_of(tags: Mapping[str, str]) -> dict[str, str]:
    """The x-amz-object-lock-* headers of an object whose tags are ``tags``."""
    lock = Lock.of(tags)
    out = {"x-amz-object-lock-legal-hold": "ON"} if lock.hold else {}
    if lock.mode is not None and lock.until is not None:
        out["x-amz-object-lock-mode"] = lock.mode
        out["x-amz-object-lock-retain-until-date"] = _iso(lock.until)
    return out
