"""Prometheus registries by site role (core layer): what a hub's ``/metrics`` shows and
what a spoke's does; and the live figures read from them (``Measure``, ``History``) that
``loomfs top`` prints and the web console charts.

A metric that means something at one role only is registered in ``HUB`` or ``SPOKE``
where it is defined; the rest (requests by protocol, transfers, the catalog, the audit
log) in prometheus_client's default registry, which both show. A process that is hub and
spoke at once (the tests') keeps both, and each endpoint still shows its own role's, so a
hub never shows a spoke gauge of 0 that reads as an empty cache, nor a spoke a hub's.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from prometheus_client import REGISTRY, CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

Role = Literal["hub", "spoke"]

#: each file protocol's requests (NFS, SFTP, S3, FUSE and SMB through its mount), by op;
#: their outcomes are each protocol's own counter (``loomfs_<protocol>_requests_total``,
#: FUSE's and SMB's ``loomfs_fuse_errors_total``)
REQUEST_SECONDS = Histogram(
    "loomfs_request_seconds", "Request latency by protocol and operation", ["protocol", "op"]
)

HUB = CollectorRegistry(auto_describe=True)
SPOKE = CollectorRegistry(auto_describe=True)


def _view(own: CollectorRegistry) -> CollectorRegistry:
    view = CollectorRegistry()
    view.register(REGISTRY)
    view.register(own)
    return view


_VIEWS = {"hub": _view(HUB), "spoke": _view(SPOKE)}


def exposition(role: Role) -> bytes:
    """The text format of what ``role``'s ``/metrics`` shows."""
    return generate_latest(_VIEWS[role])


def totals(text: str) -> dict[str, float]:
    """Each sample name's sum over its labels in a text exposition, and the same by each
    single label (``name{label="value"}``), for ``Measure``."""
    summed: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            keys = [sample.name, *(f'{sample.name}{{{k}="{v}"}}' for k, v in sample.labels.items())]
            for key in keys:
                summed[key] = summed.get(key, 0.0) + sample.value
    return summed


def role_of(now: Mapping[str, float]) -> Role:
    """Which part a site plays, from its ``totals``: each role's ``/metrics`` holds its
    own metrics only."""
    return "spoke" if "loomfs_spoke_link_up" in now else "hub"


def size(n: float | None) -> str:
    """Bytes in binary units."""
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class Measure:
    """One figure of a site's live view: a gauge's value, or a rate (per second) of the
    sum of counters, or the ratio of two counters' increases over the same interval."""

    title: str
    unit: Literal["bytes", "bytes/s", "/s", "ratio", "count", "up", "seconds"]
    of: tuple[str, ...]  # the counters (summed) or the gauge
    over: tuple[str, ...] = ()  # a ratio's denominator
    kind: Literal["gauge", "rate", "ratio"] = "rate"

    def value(self, now: Mapping[str, float], before: Mapping[str, float] | None,
              seconds: float) -> float | None:  # fmt: skip
        """Its value from ``now``'s totals and, for a rate or a ratio, those ``seconds``
        ``before``; None where it has none (no interval yet, nothing counted)."""
        if self.kind == "gauge":
            found = [now[n] for n in self.of if n in now]
            return sum(found) if found else None
        if before is None or seconds <= 0:
            return None
        grown = sum(now.get(n, 0.0) - before.get(n, 0.0) for n in self.of)
        if self.kind == "rate":
            return max(grown, 0.0) / seconds  # a restart's counters begin again at 0
        base = sum(now.get(n, 0.0) - before.get(n, 0.0) for n in self.over)
        return grown / base if base > 0 else None

    def shown(self, value: float | None) -> str:
        """A value of it as the console and ``loomfs top`` print it."""
        if value is None:
            return "-"
        match self.unit:
            case "bytes":
                return size(value)
            case "bytes/s":
                return size(value) + "/s"
            case "/s":
                return f"{value:,.1f}/s"
            case "ratio":
                return f"{value:.0%}"
            case "up":
                return "up" if value >= 1 else "down"
            case "seconds":
                return f"{value * 1000:,.1f} ms" if value < 1 else f"{value:,.1f} s"
            case _:
                return f"{value:,.0f}"


_REQUESTS = Measure(
    "Requests", "/s", ("loomfs_request_seconds_count", "loomfs_http_requests_total")
)
_LINK = Measure("Link bytes", "bytes/s", ("loomfs_transfer_wire_bytes_total",))
_LINK_UP = Measure("Link up", "up", ("loomfs_spoke_link_up",), kind="gauge")
_LINK_RTT = Measure("Link round trip", "seconds", ("loomfs_spoke_link_rtt_seconds",), kind="gauge")
_HIT_RATIO = Measure(
    "Cache hit ratio",
    "ratio",
    ('loomfs_cache_reads_total{hit="true"}',),
    over=("loomfs_cache_reads_total",),
    kind="ratio",
)
MEASURES: dict[Role, tuple[Measure, ...]] = {
    "hub": (
        _REQUESTS,
        _LINK,
        Measure("Catalog calls", "/s", ("loomfs_catalog_seconds_count",)),
        Measure("Audit records", "/s", ("loomfs_audit_records_total",)),
        Measure("Read leases", "count", ("loomfs_hub_read_leases",), kind="gauge"),
    ),
    "spoke": (
        _LINK_UP,
        _LINK_RTT,
        _LINK,
        _REQUESTS,
        _HIT_RATIO,
        Measure("Cache used", "bytes", ("loomfs_cache_used_bytes",), kind="gauge"),
        Measure("Write-back backlog", "count", ("loomfs_spoke_journal_writes",), kind="gauge"),
    ),
}
"""What ``loomfs top`` shows and the console charts, by role."""

SNAPSHOT: dict[Role, tuple[Measure, ...]] = {
    "hub": (
        Measure("Volumes", "count", ("loomfs_volumes",), kind="gauge"),
        Measure("Change log head", "count", ("loomfs_change_log_head",), kind="gauge"),
        Measure("Read leases", "count", ("loomfs_hub_read_leases",), kind="gauge"),
        Measure("Write leases", "count", ("loomfs_hub_write_leases",), kind="gauge"),
        Measure("Audit records waiting", "count", ("loomfs_audit_buffer_depth",), kind="gauge"),
    ),
    "spoke": (
        _LINK_UP,
        _LINK_RTT,
        Measure("Change feed at", "count", ("loomfs_spoke_feed_seq",), kind="gauge"),
        Measure("Cache used", "bytes", ("loomfs_cache_used_bytes",), kind="gauge"),
        Measure("Cache capacity", "bytes", ("loomfs_cache_capacity_bytes",), kind="gauge"),
        _HIT_RATIO,
        Measure("Write-back backlog", "count", ("loomfs_spoke_journal_writes",), kind="gauge"),
        Measure("Write-back bytes", "bytes", ("loomfs_spoke_journal_bytes",), kind="gauge"),
        Measure(
            "Oldest write-back", "seconds", ("loomfs_spoke_journal_oldest_seconds",), kind="gauge"
        ),
        Measure(
            "Writes the hub refuses",
            "count",
            ("loomfs_spoke_journal_refused_writes",),
            kind="gauge",
        ),
        Measure("Prefetch jobs", "count", ("loomfs_prefetch_jobs",), kind="gauge"),
    ),
}
"""What ``loomfs status`` shows, by role: each a gauge, or a ratio since the site started."""


class History:
    """The last ``keep`` samples of each of ``measures``, taken every ``every`` seconds
    from the totals a site's metrics give: what the console's charts draw, kept in
    memory only (a restart begins it again)."""

    def __init__(self, measures: Sequence[Measure], *, keep: int = 120) -> None:
        self.measures = tuple(measures)
        self.series: dict[Measure, deque[tuple[float, float | None]]] = {
            m: deque(maxlen=keep) for m in self.measures
        }
        self._last: tuple[float, dict[str, float]] | None = None

    def sample(self, now: Mapping[str, float], at: float) -> None:
        """Add the values of ``now``'s totals, taken at ``at`` (seconds, monotonic)."""
        before, seconds = None, 0.0
        if self._last is not None:
            seconds, before = at - self._last[0], self._last[1]
        for measure in self.measures:
            self.series[measure].append((at, measure.value(now, before, seconds)))
        self._last = (at, dict(now))
