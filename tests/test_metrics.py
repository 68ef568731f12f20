"""Metrics by site role (``core.metrics``) and the Grafana dashboard in docs/: every
metric the dashboard names is one a site exports, a hub shows no spoke metric and a spoke
no hub one."""

from __future__ import annotations

import errno
import json
import re
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY

import loomfs.protocols.sftp.errors
import loomfs.service  # noqa: F401  (every metric's module, registered)
from loomfs.core import metrics
from loomfs.protocols.fuse.session import Session

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
              "loomfs_fuse_requests_total", "loomfs_s3_write_bytes_total",
              "loomfs_transfer_wire_bytes_total", "loomfs_http_requests_total"}  # fmt: skip
    assert shared <= hub & spoke


OPS, ERRORS = ("lookup", "read", "write"), (0, errno.ENOENT, errno.EACCES, errno.EIO)


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def _label(error: int) -> str:
    return errno.errorcode[error] if error else "ok"


@settings(max_examples=25, deadline=None)
@given(outcomes=st.lists(st.tuples(st.sampled_from(OPS), st.sampled_from(ERRORS)), max_size=30))
def test_a_mount_counts_each_request_by_op_and_errno(outcomes: list[tuple[str, int]]) -> None:
    session = Session(Path("/nonexistent"), set(), protocol="smb")

    def counts() -> dict[tuple[str, int], float]:
        return {
            (op, e): _sample("loomfs_fuse_requests_total", protocol="smb", op=op, errno=_label(e))
            for op in OPS
            for e in ERRORS
        }

    def timed() -> dict[str, float]:
        return {op: _sample("loomfs_request_seconds_count", protocol="smb", op=op) for op in OPS}

    counted, seen = counts(), timed()
    for op, error in outcomes:
        session._measure(op, error, 0.001)
    assert {k: v - counted[k] for k, v in counts().items()} == {
        k: outcomes.count(k) for k in counted
    }
    assert {op: v - seen[op] for op, v in timed().items()} == {
        op: sum(1 for o, _ in outcomes if o == op) for op in OPS
    }
