"""Lifecycle rules of directories (namespace layer): what they say, and how they are kept.

A directory's lifecycle configuration is a list of rules, kept in the namespace's tags of
the directory (one tag per rule under ``PREFIX``, the rule in compact JSON), so setting or
reading one is a governed tag change or read like any other, over every protocol. A rule
picks the files below the directory by a key prefix, namespace tags and size, and says when
they go: the current file ``days`` after its mtime or at a ``date``; an old version
``noncurrent_days`` after it stopped being current, keeping the ``newer_noncurrent``
newest; a delete marker left as a path's only version; uploads never completed (an edge
that stages them) ``abort_days`` after they began. The hub applies them
(``hub.lifecycle``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime

from ..errors import InvalidArgument

PREFIX = "lifecycle."
DAY_S = 86400.0
MAX_RULE_CHARS = 1024  # a rule's JSON must fit in one tag value (the namespace's limit)


@dataclass(frozen=True, slots=True)
class Rule:
    id: str
    enabled: bool
    prefix: str = ""
    #: namespace tags a file must have (key, value), all of them
    tags: tuple[tuple[str, str], ...] = ()
    size_gt: int | None = None
    size_lt: int | None = None
    days: int | None = None
    date: str | None = None  # ISO 8601, as given (a midnight UTC)
    expired_markers: bool | None = None
    noncurrent_days: int | None = None
    newer_noncurrent: int | None = None
    abort_days: int | None = None
    #: how the configuration named its filter, so that it is given back as it came (an
    #: edge's business: "prefix", "filter", "and" or "none")
    form: str = "prefix"

    def picks(self, key: str, size: int, tags: Mapping[str, str]) -> bool:
        return (
            key.startswith(self.prefix)
            and all(tags.get(k) == v for k, v in self.tags)
            and (self.size_gt is None or size > self.size_gt)
            and (self.size_lt is None or size < self.size_lt)
        )

    def expires_at(self, mtime_ns: int, day_s: float) -> float | None:
        """When a current file last modified at ``mtime_ns`` expires (epoch seconds)."""
        if self.days is not None:
            return mtime_ns / 1e9 + self.days * day_s
        if self.date is not None:
            return parse_date(self.date).timestamp()
        return None

    def to_json(self) -> str:
        values = {k: v for k, v in asdict(self).items() if v not in (None, (), "")}
        return json.dumps(values, separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Rule:
        values = json.loads(text)
        values["tags"] = tuple(tuple(pair) for pair in values.get("tags", ()))
        return cls(**values)


def parse_date(text: str) -> datetime:
    """An expiration date: ISO 8601, as S3 takes it; InvalidArgument if not one."""
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidArgument(f"{text!r} is not an ISO 8601 date") from None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def as_tags(rules: Sequence[Rule]) -> dict[str, str]:
    return {f"{PREFIX}{i:03d}": rule.to_json() for i, rule in enumerate(rules)}


def of(tags: Mapping[str, str]) -> list[Rule]:
    """A directory's rules, in the order they were given."""
    return [Rule.from_json(v) for k, v in sorted(tags.items()) if k.startswith(PREFIX)]
