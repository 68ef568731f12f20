"""Metrics by site role (``core.metrics``) and the Grafana dashboard in docs/: every
metric the dashboard names is one a site exports, a hub shows no spoke metric and a spoke
no hub one; a mount's requests timed by op, its errors counted by errno; the console's
history (rates, ratios, gauges of its samples) and its charts (every value drawn inside
the box); a spoke's timed link round trip."""

from __future__ import annotations

import asyncio
import errno
import itertools
import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import Counter, Histogram

import loomfs.protocols.sftp.errors
import loomfs.service  # noqa: F401  (every metric's module, registered)
from loomfs.core import metrics
from loomfs.core.metrics import REQUEST_SECONDS, History, Measure
from loomfs.errors import InvalidArgument
from loomfs.protocols.console.charts import HEIGHT, WIDTH, chart
from loomfs.protocols.console.history import POINTS, SPANS, HistoryStore, span_of
from loomfs.protocols.fuse.session import ERRORS as FUSE_ERRORS
from loomfs.protocols.fuse.session import Session
from loomfs.testing.fabric import fabric

DASHBOARD = Path(__file__).parents[1] / "docs" / "grafana-dashboard.json"
SUFFIXES = {"histogram": ("_bucket", "_count", "_sum"), "summary": ("_count", "_sum")}


def exported(role: metrics.Role) -> set[str]:
    """The sample names ``role``'s /metrics may carry (a labelled metric without a
    sample yet is there by its TYPE line)."""
    names = set()
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", metrics.exposition(role).decode(), re.M):
        names.add(name)
        names.update(name + suffix for suffix in SUFFIXES.get(kind, ()))
    return names


def dashboard_metrics() -> set[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    exprs = [t["expr"] for p in panels for t in p.get("targets", ())]
    return {m for e in exprs for m in re.findall(r"\bloomfs_[a-z0-9_]+", e)}


def test_every_metric_the_dashboard_names_is_exported() -> None:
    named = dashboard_metrics()
    assert len(named) > 30
    missing = named - exported("hub") - exported("spoke")
    assert not missing, f"the dashboard names metrics no site exports: {sorted(missing)}"


def test_each_role_shows_its_own_metrics_and_the_shared_ones() -> None:
    hub, spoke = exported("hub"), exported("spoke")
    hub_only, spoke_only = hub - spoke, spoke - hub
    assert {"loomfs_volumes", "loomfs_hub_read_leases", "loomfs_delta_store_bytes"} <= hub_only
    assert {"loomfs_spoke_link_up", "loomfs_cache_capacity_bytes", "loomfs_cache_reads_total",
            "loomfs_spoke_journal_writes", "loomfs_prefetch_jobs"} <= spoke_only  # fmt: skip
    assert not any(n.startswith(("loomfs_spoke_", "loomfs_cache_", "loomfs_prefetch_"))
                   for n in hub)  # fmt: skip
    assert not any(n.startswith(("loomfs_hub_", "loomfs_delta_store_")) for n in spoke)
    shared = {"loomfs_request_seconds_bucket", "loomfs_catalog_seconds_count",
              "loomfs_fuse_errors_total", "loomfs_s3_write_bytes_total",
              "loomfs_transfer_wire_bytes_total", "loomfs_http_requests_total"}  # fmt: skip
    assert shared <= hub & spoke


OPS, ERRNOS = ("lookup", "read", "write"), (0, errno.ENOENT, errno.EACCES, errno.EIO)


def _samples(metric: Counter | Histogram, name: str) -> dict[tuple[str, ...], float]:
    """``metric``'s samples called ``name`` by their labels' values (that metric alone is
    read: the whole registry for each sample would make the test slow)."""
    return {
        tuple(s.labels.values()): s.value
        for family in metric.collect()
        for s in family.samples
        if s.name == name
    }


def _label(error: int) -> str:
    return errno.errorcode[error] if error else "ok"


@settings(max_examples=25, deadline=None)
@given(outcomes=st.lists(st.tuples(st.sampled_from(OPS), st.sampled_from(ERRNOS)), max_size=30))
def test_a_mount_times_each_request_and_counts_its_errors_by_errno(
    outcomes: list[tuple[str, int]],
) -> None:
    session = Session(Path("/nonexistent"), set(), protocol="smb")

    def counts() -> dict[tuple[str, int], float]:
        got = _samples(FUSE_ERRORS, "loomfs_fuse_errors_total")
        return {(op, e): got.get(("smb", op, _label(e)), 0.0) for op in OPS for e in ERRNOS}

    def timed() -> dict[str, float]:
        got = _samples(REQUEST_SECONDS, "loomfs_request_seconds_count")
        return {op: got.get(("smb", op), 0.0) for op in OPS}

    counted, seen = counts(), timed()
    for op, error in outcomes:
        session._measure(op, error, 0.001)
    assert {k: v - counted[k] for k, v in counts().items()} == {
        k: outcomes.count(k) if k[1] else 0
        for k in counted  # a success is no error
    }
    assert {op: v - seen[op] for op, v in timed().items()} == {
        op: sum(1 for o, _ in outcomes if o == op) for op in OPS
    }


_TOTALS = st.lists(
    st.fixed_dictionaries({k: st.floats(0, 1e12) for k in ("a_total", "b_total", "g")}),
    min_size=1,
    max_size=12,
)


@settings(max_examples=50, deadline=None)
@given(samples=_TOTALS, keep=st.integers(1, 8), step=st.floats(0.5, 30))
def test_a_history_keeps_rates_ratios_and_gauges_of_its_samples(
    samples: list[dict[str, float]], keep: int, step: float
) -> None:
    rate = Measure("r", "/s", ("a_total", "b_total"))
    ratio = Measure("q", "ratio", ("a_total",), over=("b_total",), kind="ratio")
    gauge = Measure("g", "count", ("g",), kind="gauge")
    history = History([rate, ratio, gauge], keep=keep)
    for i, now in enumerate(samples):
        history.sample(now, i * step)
    kept = samples[-keep:]
    first = len(samples) - len(kept)
    assert [v for _, v in history.series[gauge]] == [s["g"] for s in kept]
    for j, (at, value) in enumerate(history.series[rate]):
        i = first + j
        assert at == i * step
        if i == 0:
            assert value is None  # no interval yet
            continue
        grown = sum(samples[i][k] - samples[i - 1][k] for k in ("a_total", "b_total"))
        assert value == max(grown, 0.0) / (i * step - (i - 1) * step)
        base = samples[i]["b_total"] - samples[i - 1]["b_total"]
        expected = (samples[i]["a_total"] - samples[i - 1]["a_total"]) / base if base > 0 else None
        assert history.series[ratio][j][1] == expected


@settings(max_examples=50, deadline=None)
@given(
    values=st.lists(st.one_of(st.none(), st.floats(0, 1e15)), max_size=40),
    unit=st.sampled_from(["bytes", "/s", "ratio", "count"]),
)
def test_a_chart_draws_every_value_inside_its_box(values: list[float | None], unit: str) -> None:
    measure = Measure("m", unit, ("m",), kind="gauge")  # type: ignore[arg-type]
    points = [(float(i), v) for i, v in enumerate(values)]
    drawn = chart(measure, points, span_s=30.0)
    coords = [tuple(map(float, p.split(","))) for line in drawn.lines for p in line.split()]
    assert len(coords) == sum(v is not None for v in values)
    assert all(0 <= x <= WIDTH and 0 <= y <= HEIGHT for x, y in coords)
    runs = "".join("x" if v is not None else " " for v in values).split()
    assert len(drawn.lines) == len(runs)
    assert drawn.last == ("-" if not values or values[-1] is None else drawn.last)
    assert (drawn.dot is None) == (not values or values[-1] is None)


@settings(max_examples=40, deadline=None)
@given(
    gaps=st.lists(st.floats(1, 400), min_size=1, max_size=60),
    values=st.lists(st.one_of(st.none(), st.floats(0, 1e9)), min_size=60, max_size=60),
    span=st.sampled_from(sorted(SPANS.values())),
)
def test_the_stored_history_is_each_slices_mean_and_breaks_where_the_site_was_down(
    tmp_path_factory: pytest.TempPathFactory, gaps: list[float], values: list[float | None],
    span: float,
) -> None:  # fmt: skip
    path = tmp_path_factory.mktemp("history") / "h.db"
    every = 5.0
    store = HistoryStore(path, every=every)
    times, at = [], 1_700_000_000.0
    for gap, value in zip(gaps, values, strict=False):
        at += gap
        times.append(at)
        store.add(at, {"m": value, "gone": 1.0})
    store.close()
    now = times[-1]
    # a restart: what the first process sampled is there for the next
    found = HistoryStore(path, every=every).series(["m"], span, now)
    assert set(found) == {"m"}  # a measure not asked for is not drawn
    width = max(span / POINTS, every)
    since = now - span
    slices: dict[int, list[float | None]] = {}
    for t, v in zip(times, values, strict=False):
        if t >= since:
            slices.setdefault(int((t - since) // width), []).append(v)
    drawn = [(t, v) for t, v in found["m"]]
    kept = [
        (t, v)
        for t, v in drawn
        if not (v is None and round((t - since) / width - 0.5) not in slices)
    ]
    assert len(kept) == len(slices)
    for (t, v), part in zip(kept, sorted(slices), strict=True):
        assert t == pytest.approx(since + (part + 0.5) * width)
        known = [x for x in slices[part] if x is not None]
        assert v == (pytest.approx(sum(known) / len(known)) if known else None)
    # a break (None) stands exactly where no sample came for longer than the pauses explain
    breaks = len(drawn) - len(kept)
    parts = sorted(slices)
    gap = max(3 * every, 2 * width)
    expected = sum(
        1 for a, b in itertools.pairwise(parts)
        if (b - a) * width > gap and any(x is not None for x in slices[a])
    )  # fmt: skip
    assert breaks == expected


def test_a_chart_span_is_one_of_the_named_ones() -> None:
    assert span_of(None) == SPANS["10m"] and span_of("24h") == 86_400
    with pytest.raises(InvalidArgument, match="span must be one of"):
        span_of("1y")


async def test_a_spoke_times_its_link_and_exports_the_round_trip(tmp_path: Path) -> None:
    # the emulated link holds each direction 40 ms: no timing of it can come out shorter
    async with fabric(tmp_path, latency=0.04) as env:
        spoke = env.spokes["gpu-west"]
        for _ in range(200):  # timed at start, then every RTT_EVERY seconds
            if spoke.link_rtt is not None:
                break
            await asyncio.sleep(0.05)
        assert spoke.link_rtt is not None and spoke.link_rtt >= 0.08
        assert spoke.status()["link"]["rtt_s"] == spoke.link_rtt
        shown = metrics.totals(metrics.exposition("spoke").decode())
        assert shown["loomfs_spoke_link_rtt_seconds"] == spoke.link_rtt
