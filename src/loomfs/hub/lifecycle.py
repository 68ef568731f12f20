"""The hub's task that applies directories' lifecycle rules (hub layer).

The rules are the namespace's (``namespace.lifecycle``); uploads never completed are an
edge's, expired by the hooks it registers (``Expirer.hooks``).

``Expirer.run_once`` applies every enabled rule once, as the ``LIFECYCLE`` principal,
through the governed namespace: each expiry is a namespace removal (which, in a versioned
directory, leaves a delete marker, as S3 does) or a version removal, decided and audited
as any other. A "day" is ``[hub] lifecycle_day`` seconds (86400; a test shortens it, as
RGW's ``rgw_lc_debug_interval`` does).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections.abc import Awaitable, Callable

from .. import paths
from ..core.catalog.base import Catalog
from ..core.types import Principal
from ..errors import DirectoryNotEmpty, LoomError, NotFound
from ..namespace.base import Namespace, Version
from ..namespace.lifecycle import DAY_S, PREFIX, Rule, of

log = logging.getLogger(__name__)

#: who expires: an administrator of the namespace, named so in the audit log
LIFECYCLE = Principal(user="lifecycle", groups=frozenset({"admin"}), protocol="lifecycle")


#: what an edge that stages uploads does for a directory's rules at a time (epoch s)
Hook = Callable[[str, list[Rule], float], Awaitable[None]]


class Expirer:
    def __init__(
        self,
        namespace: Namespace,
        catalog: Catalog,
        day_s: float = DAY_S,
    ) -> None:
        """``namespace``: the governed one, so every expiry is decided and audited."""
        self.ns = namespace
        self.catalog = catalog
        self.day_s = day_s
        self.hooks: list[Hook] = []

    async def configured(self) -> dict[str, list[Rule]]:
        """Every directory that has lifecycle rules, with them: one catalog query."""
        found = await self.catalog.tagged_with(PREFIX)
        return {folder: of(tags) for folder, tags in found.items()}

    async def run_once(self, now: float) -> int:
        """Apply every enabled rule once at ``now``; how many files and versions went."""
        done = 0
        for folder, rules in (await self.configured()).items():
            enabled = [r for r in rules if r.enabled]
            if not enabled:
                continue
            try:
                done += await self._expire_current(folder, enabled, now)
                done += await self._expire_versions(folder, enabled, now)
                for hook in self.hooks:
                    await hook(folder, enabled, now)
            except LoomError as exc:  # one directory's trouble must not stop the others
                log.warning("lifecycle run failed", extra={"path": folder, "error": str(exc)})
        return done

    async def _expire_current(self, folder: str, rules: list[Rule], now: float) -> int:
        timed = [r for r in rules if r.days is not None or r.date is not None]
        if not timed:
            return 0
        due = []
        async for entry in self.ns.walk(LIFECYCLE, folder):
            if entry.is_dir:
                continue
            key = entry.path[len(folder) + 1 :]
            tags = await self.ns.get_tags(LIFECYCLE, entry.path) if _tagged(timed) else {}
            for rule in timed:
                when = rule.expires_at(entry.mtime_ns, self.day_s)
                if when is not None and now >= when and rule.picks(key, entry.size, tags):
                    due.append(entry.path)
                    break
        for path in due:
            with contextlib.suppress(NotFound):
                await self.ns.remove(LIFECYCLE, path)
                log.info("expired", extra={"path": path})
                await self._prune(folder, paths.split(path)[0])
        return len(due)

    async def _prune(self, folder: str, directory: str) -> None:
        """Remove the untagged directories an expiry left empty, up to ``folder``."""
        while directory != folder and paths.is_within(directory, folder):
            try:
                if await self.ns.get_tags(LIFECYCLE, directory):
                    return  # kept on purpose (an S3 folder marker, say)
                await self.ns.remove(LIFECYCLE, directory)
            except (DirectoryNotEmpty, NotFound):
                return
            directory = paths.split(directory)[0]

    async def _expire_versions(self, folder: str, rules: list[Rule], now: float) -> int:
        wanted = [
            r
            for r in rules
            if r.noncurrent_days is not None
            or r.newer_noncurrent is not None
            or r.expired_markers
            or r.days is not None
            or r.date is not None
        ]
        if not wanted or await self.ns.versioning(LIFECYCLE, folder) is None:
            return 0
        by_path: dict[str, list[Version]] = {}
        for version in await self.ns.versions(LIFECYCLE, folder):
            by_path.setdefault(version.path, []).append(version)
        done = 0
        for path, versions in by_path.items():
            key = path[len(folder) + 1 :]
            gone = self._noncurrent_due(key, versions, wanted, now)
            for version in gone:
                await self.ns.remove_version(LIFECYCLE, path, version.vid)
            left = [v for v in versions if v not in gone]
            if len(left) == 1 and left[0].marker and left[0].latest:
                marker = left[0]
                if any(self._marker_due(r, key, marker, now) for r in wanted):
                    await self.ns.remove_version(LIFECYCLE, path, marker.vid)
                    gone.append(marker)
            done += len(gone)
        return done

    def _noncurrent_due(
        self, key: str, versions: list[Version], rules: list[Rule], now: float
    ) -> list[Version]:
        """The old versions of one path (``versions``: newest first) that are due."""
        due = []
        for rank, (newer, version) in enumerate(itertools.pairwise(versions)):
            since = newer.mtime_ns / 1e9  # it stopped being current when ``newer`` came
            for rule in rules:
                if not rule.picks(key, version.size, version.tags):
                    continue
                if rule.newer_noncurrent is not None and rank < rule.newer_noncurrent:
                    continue
                days = rule.noncurrent_days
                if days is None and rule.newer_noncurrent is None:
                    continue
                if days is None or now >= since + days * self.day_s:
                    due.append(version)
                    break
        return due

    def _marker_due(self, rule: Rule, key: str, marker: Version, now: float) -> bool:
        if not key.startswith(rule.prefix):
            return False
        if rule.expired_markers:
            return True
        when = rule.expires_at(marker.mtime_ns, self.day_s)
        return when is not None and now >= when


def _tagged(rules: list[Rule]) -> bool:
    return any(r.tags for r in rules)
