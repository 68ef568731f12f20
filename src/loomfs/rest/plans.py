"""The prefetcher's REST routes at a spoke (protocol layer): data loaders publish their
plans, report progress, and end them; anyone can read how prefetching is going.

Plans arrive as JSON with base64 blobs: ``plan`` is ``prefetch.plan.Plan.encode()`` over the
dataset's sample ids, ``files`` the dataset's paths (zlib of newline-joined UTF-8), and
``sizes`` their sizes in bytes, so the spoke needs no stat per file to budget its fetches.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any, Protocol

from aiohttp import web

from ..core.types import Principal
from ..errors import InvalidArgument
from ..prefetch.plan import Plan
from . import wire
from .server import WHO, _body, _json

PLANS = f"{wire.API}/plans"


class Plans(Protocol):
    """What the routes call: a spoke's prefetcher (``spoke.prefetcher.Prefetcher``)."""

    def publish(
        self, blob: bytes, files: bytes, sizes: list[int] | None = None, who: Principal = ...
    ) -> Plan: ...

    def heartbeat(self, job_id: str, position: int) -> None: ...

    def end(self, job_id: str) -> None: ...

    def report(self) -> dict[str, Any]: ...


def _blob(body: dict[str, Any], name: str) -> bytes:
    value = body.get(name)
    if not isinstance(value, str):
        raise InvalidArgument(f"a plan needs '{name}' as base64")
    try:
        return base64.b64decode(value, validate=True)
    except binascii.Error as exc:
        raise InvalidArgument(f"'{name}' is not base64: {exc}") from None


def _job(body: dict[str, Any]) -> str:
    job = body.get("job")
    if not isinstance(job, str) or not job:
        raise InvalidArgument("'job' must be a non-empty string")
    return job


def routes(prefetcher: Plans) -> list[web.RouteDef]:
    async def publish(request: web.Request) -> web.Response:
        body = await _body(request)
        sizes = body.get("sizes")
        if sizes is not None and (
            not isinstance(sizes, list) or not all(type(s) is int and s >= 0 for s in sizes)
        ):
            raise InvalidArgument("'sizes' must be a list of non-negative integers")
        who = request[WHO]  # its files are fetched as the caller: the hub decides for them
        plan = prefetcher.publish(_blob(body, "plan"), _blob(body, "files"), sizes, who)
        return _json({"job": plan.job_id, "start": plan.start, "reads": len(plan.keys)}, 201)

    async def heartbeat(request: web.Request) -> web.Response:
        body = await _body(request)
        position = body.get("position")
        if type(position) is not int or position < 0:
            raise InvalidArgument("'position' must be a non-negative integer")
        prefetcher.heartbeat(_job(body), position)
        return web.Response(status=204)

    async def end(request: web.Request) -> web.Response:
        prefetcher.end(_job(await _body(request)))
        return web.Response(status=204)

    async def report(request: web.Request) -> web.Response:
        return _json(prefetcher.report())

    return [
        web.post(PLANS, publish),
        web.get(PLANS, report),
        web.post(f"{PLANS}/heartbeat", heartbeat),
        web.post(f"{PLANS}/end", end),
    ]
