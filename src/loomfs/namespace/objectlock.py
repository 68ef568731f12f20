"""Object lock (namespace layer): retention and legal hold of a file's versions, as S3's.

A version's lock is kept in its tags (``lock.mode``, ``lock.until``, ``lock.hold``): the
file's own tags while it is current, and the tags its old version keeps after. A directory
with object lock enabled (``lock.enabled`` on it) is versioned for good (its versioning
cannot be suspended), and may give new files a default retention (``lock.default``).

What a lock means is enforced by the namespace, for every protocol: a version under
retention (until ``lock.until``) or on legal hold cannot be removed for good; a removal of
the file only hides it behind a delete marker, as it always does in a versioned directory.
A GOVERNANCE retention may be shortened or removed, and its version removed, by a caller
that asks to bypass it (``bypass``, S3's x-amz-bypass-governance-retention); a COMPLIANCE
retention by nobody, only lengthened. A lock's tags change only through ``set_lock``, or
with a new version's content in the write that makes it (``check_new``): a crash between
the two cannot leave the version unlocked.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from ..errors import InvalidArgument, PermissionDenied

PREFIX = "lock."
MODE, UNTIL, HOLD = "lock.mode", "lock.until", "lock.hold"
ENABLED, DEFAULT = "lock.enabled", "lock.default"
VERSION_KEYS = (MODE, UNTIL, HOLD)
MODES = ("GOVERNANCE", "COMPLIANCE")
DAY_S = 86400


@dataclass(frozen=True, slots=True)
class Lock:
    mode: str | None = None
    until: float | None = None  # epoch seconds
    hold: bool = False

    @classmethod
    def of(cls, tags: Mapping[str, str]) -> Lock:
        until = tags.get(UNTIL)
        return cls(tags.get(MODE), None if until is None else float(until), tags.get(HOLD) == "ON")

    def retained(self, now: float) -> bool:
        return self.mode is not None and self.until is not None and now < self.until

    def as_tags(self) -> dict[str, str]:
        tags = {HOLD: "ON"} if self.hold else {}
        if self.mode is not None and self.until is not None:
            tags |= {MODE: self.mode, UNTIL: repr(self.until)}
        return tags


def touches(keys: Iterable[str]) -> bool:
    """Whether a tag change names a version's lock tags (only ``set_lock`` may)."""
    return any(k in VERSION_KEYS for k in keys)


def check_new(path: str, tags: Mapping[str, str], versioning: str | None) -> None:
    """InvalidArgument unless the tags a write gives a new version set a valid lock, in a
    versioned (Enabled) directory, if they set one at all."""
    if not touches(tags):
        return
    if versioning != "Enabled":
        raise InvalidArgument(f"object lock needs {path} to be versioned (Enabled)", path=path)
    try:
        lock = Lock.of(tags)
    except ValueError:
        raise InvalidArgument(f"{UNTIL} is seconds since the epoch", path=path) from None
    if (lock.mode is None) != (lock.until is None) or (HOLD in tags and not lock.hold):
        raise InvalidArgument(f"{MODE} and {UNTIL} come together, {HOLD} is ON", path=path)
    check_change(path, Lock(), lock, bypass=False, now=0.0)


def check_removal(path: str, tags: Mapping[str, str], *, bypass: bool, now: float) -> None:
    """PermissionDenied unless the version with ``tags`` may be removed for good."""
    lock = Lock.of(tags)
    if lock.hold:
        raise PermissionDenied(f"{path} is on legal hold", path=path)
    if lock.retained(now) and not (bypass and lock.mode == "GOVERNANCE"):
        until = datetime.fromtimestamp(lock.until or 0, UTC).isoformat()
        raise PermissionDenied(f"{path} is under {lock.mode} retention until {until}", path=path)


def check_change(path: str, old: Lock, new: Lock, *, bypass: bool, now: float) -> None:
    """PermissionDenied unless a version's retention may go from ``old`` to ``new``."""
    if new.mode is not None and new.mode not in MODES:
        raise InvalidArgument(f"a retention mode is GOVERNANCE or COMPLIANCE, not {new.mode}")
    if not old.retained(now):
        return
    kept = new.mode == old.mode and (new.until or 0) >= (old.until or 0)
    if kept or (old.mode == "GOVERNANCE" and bypass):
        return
    raise PermissionDenied(
        f"{path} is under {old.mode} retention: it may only be lengthened"
        + (" (or changed bypassing governance)" if old.mode == "GOVERNANCE" else ""),
        path=path,
    )


def default_of(tags: Mapping[str, str]) -> tuple[str, int] | None:
    """A lock-enabled directory's default retention: (mode, seconds), None if none."""
    text = tags.get(DEFAULT)
    if not text:
        return None
    value = json.loads(text)
    return str(value["mode"]), int(value["seconds"])


def default_lock(tags: Mapping[str, str], now: float | None = None) -> Lock | None:
    """The lock a new file below a directory with ``tags`` gets, None if none."""
    found = default_of(tags)
    if found is None:
        return None
    mode, seconds = found
    return Lock(mode, (time.time() if now is None else now) + seconds)
