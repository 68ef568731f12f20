"""Prometheus registries by site role (core layer): what a hub's ``/metrics`` shows and
what a spoke's does.

A metric that means something at one role only is registered in ``HUB`` or ``SPOKE``
where it is defined; the rest (requests by protocol, transfers, the catalog, the audit
log) in prometheus_client's default registry, which both show. A process that is hub and
spoke at once (the tests') keeps both, and each endpoint still shows its own role's, so a
hub never shows a spoke gauge of 0 that reads as an empty cache, nor a spoke a hub's.
"""

from __future__ import annotations

from typing import Literal

from prometheus_client import REGISTRY, CollectorRegistry, Histogram, generate_latest

Role = Literal["hub", "spoke"]

#: each file protocol's requests (NFS, SFTP, S3, FUSE and SMB through its mount), by op;
#: their outcomes are each protocol's own counter (``loomfs_<protocol>_requests_total``)
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
