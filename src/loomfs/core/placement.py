"""Residency and placement policies (core layer): which sites may hold or receive data.

A policy names path globs (``/datasets/eu/**``) and optionally a tag (``residency=eu``);
it applies to a path that matches one of its globs or carries its tag. It allows sites by
label selectors (``region=eu``; several mean any). A site outside the hub may receive the
data of a path only if every policy that applies to it allows one of the site's labels;
the hub's own users are not restricted by residency (the data is already here). Where a
policy refuses a site, its ``metadata`` setting says whether names and sizes stay visible
(``visible``: data refused) or the path looks absent (``hidden``).

Policies live in the site catalog, so ``loomfs policy`` works from another process; each
change bumps the catalog's ``placement`` counter (the generation), which the hub's
``PlacementAuthorizer`` polls to reload its in-memory copy. Tightening a policy appends
``evict`` changes to the change log for what it now covers, in the same transaction:
spokes drop those cached bytes when they apply the change, and the hub waits for their
acknowledgements (``Leases.settle``) before it reports the change complete.

This module holds every residency decision; the governed namespace asks it through the
authorizer-chain interface (``check``, ``subtree_open``) and the hub's change feed through
``redact``.
"""

from __future__ import annotations

import builtins
import enum
import json
import logging
import re
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace

from prometheus_client import Counter

from .. import paths
from ..errors import InvalidArgument, NotFound, PermissionDenied
from .catalog.base import Catalog
from .catalog.sql import Cursor, SqlCatalog, _join, _Sequencer, _split
from .sites import SiteRegistry, parse_labels
from .types import Action, Change, ChangeOp, Entry, EntryKind, Principal

log = logging.getLogger(__name__)

REFUSED = Counter(
    "loomfs_placement_refusals_total", "Requests refused by a placement policy", ["action"]
)

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
REFRESH = 1.0  # seconds between generation checks: how stale another process's edit may be


class Visibility(enum.StrEnum):
    VISIBLE = "visible"  # names and sizes shown, data refused
    HIDDEN = "hidden"  # the path looks absent


def _glob_regex(glob: str) -> re.Pattern[str]:
    """``**`` spans any number of segments, ``*`` and ``?`` stay inside one; ``/x/**``
    covers x itself and everything below it: a policy on a tree also holds its root, or a
    site it refuses could rename or remove the root and take the tree with it. Any
    character of a name matches, a newline too."""
    out: list[str] = []
    i = 0
    while i < len(glob):
        if glob.startswith("/**", i):
            out.append("(?:/.*)?")
            i += 3
        elif glob[i] == "*":
            out.append("[^/]*")
            i += 1
        elif glob[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(glob[i]))
            i += 1
    return re.compile("".join(out) + r"\Z", re.DOTALL)


def glob_prefix(glob: str) -> str:
    """The deepest directory every match of ``glob`` lies under: what eviction sweeps."""
    literal: list[str] = []
    for part in glob.strip("/").split("/"):
        if any(c in part for c in "*?"):
            break
        literal.append(part)
    return "/" + "/".join(literal)


@dataclass(frozen=True, slots=True)
class Policy:
    name: str
    paths: tuple[str, ...]
    allow: tuple[tuple[str, str], ...]  # label selectors, key=value; any one admits a site
    tag: tuple[str, str] | None = None
    metadata: Visibility = Visibility.VISIBLE

    @classmethod
    def build(
        cls,
        name: str,
        globs: Sequence[str],
        allow: Sequence[str],
        tag: str | None = None,
        metadata: str = "visible",
    ) -> Policy:
        """A policy from command-line words, refusing what it can't mean."""
        if not _NAME.match(name):
            raise InvalidArgument(f"invalid policy name {name!r}")
        if not globs:
            raise InvalidArgument("a policy needs at least one --paths GLOB")
        for glob in globs:
            if not glob.startswith("/") or "//" in glob or "\x00" in glob:
                raise InvalidArgument(f"a path glob is absolute, like /datasets/eu/**: {glob!r}")
        if not allow:
            raise InvalidArgument("a policy needs at least one --allow-sites KEY=VALUE")
        tags = parse_labels([tag]) if tag is not None else {}
        try:
            visibility = Visibility(metadata)
        except ValueError:
            raise InvalidArgument(f"metadata is visible or hidden, not {metadata!r}") from None
        return cls(
            name,
            tuple(globs),
            tuple(parse_labels(list(allow)).items()),
            next(iter(tags.items()), None),
            visibility,
        )

    def to_json(self) -> str:
        return json.dumps(
            {
                "paths": list(self.paths),
                "allow": [f"{k}={v}" for k, v in self.allow],
                "tag": None if self.tag is None else f"{self.tag[0]}={self.tag[1]}",
                "metadata": self.metadata.value,
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, name: str, spec: str) -> Policy:
        data = json.loads(spec)
        return cls.build(name, data["paths"], data["allow"], data["tag"], data["metadata"])

    def allows(self, labels: Mapping[str, str]) -> bool:
        return any(labels.get(key) == value for key, value in self.allow)


@dataclass(frozen=True, slots=True)
class _Compiled:
    policy: Policy
    globs: tuple[re.Pattern[str], ...]

    def applies(self, path: str, tags: Collection[tuple[str, str]]) -> bool:
        """``tags``: the (key, value) pairs on the path or any directory above it."""
        if self.policy.tag is not None and self.policy.tag in tags:
            return True
        return any(g.match(path) for g in self.globs)


class PolicyStore:
    """The policies in the site catalog (both engines, same SQL)."""

    def __init__(self, catalog: Catalog) -> None:
        if not isinstance(catalog, SqlCatalog):
            raise InvalidArgument(f"placement policies need a SQL catalog, not {catalog.url}")
        self._cat = catalog

    async def put(self, policy: Policy) -> int:
        """Add or replace a policy, and log an eviction for everything it now covers, in one
        transaction; returns the change-log head to settle on (spokes evict by then)."""

        def fn(cur: Cursor) -> int:
            q = self._cat._q
            q(cur, "DELETE FROM placement_policies WHERE name = ?", (policy.name,))
            q(
                cur,
                "INSERT INTO placement_policies (name, spec, updated_ns) VALUES (?, ?, ?)",
                (policy.name, policy.to_json(), time.time_ns()),
            )
            covered = [glob_prefix(g) for g in policy.paths]
            if policy.tag is not None:
                covered += self._tagged(cur, *policy.tag)
            return self._evict(cur, covered)

        return await self._cat._run(self._cat._write, fn)

    async def evict(self, covered: Sequence[str]) -> int:
        """Log evictions for paths (a re-tag made them restricted); returns the head."""
        return await self._cat._run(self._cat._write, lambda cur: self._evict(cur, covered))

    def _evict(self, cur: Cursor, covered: Sequence[str]) -> int:
        """One ``evict`` change per covered path (none nested in another), and a new
        generation, so every hub process reloads before a spoke can ask again."""
        tops: list[str] = []
        for path in sorted(set(covered), key=len):
            if not any(paths.is_within(path, top) for top in tops):
                tops.append(path)
        seq = _Sequencer(self._cat, cur)
        for top in tops:
            seq.log(seq.next(), ChangeOp.EVICT, Entry(top, EntryKind.DIR, 0, 0, 0, 0, 0, 0))
        seq.flush()
        self._cat._q(cur, "UPDATE counters SET value = value + 1 WHERE name = 'placement'")
        row = self._cat._q(cur, "SELECT value FROM counters WHERE name = 'seq'").fetchone()
        return int(row[0])

    def _tagged(self, cur: Cursor, key: str, value: str) -> list[str]:
        rows = self._cat._q(
            cur,
            "SELECT e.parent, e.name FROM tags t JOIN entries e ON e.id = t.entry_id "
            "WHERE t.key = ? AND t.value = ?",
            (key, value),
        ).fetchall()
        return [_join(r[0], r[1]) for r in rows]

    async def remove(self, name: str) -> None:
        """Drop a policy (a loosening: nothing to evict)."""

        def fn(cur: Cursor) -> None:
            q = self._cat._q
            gone = q(cur, "DELETE FROM placement_policies WHERE name = ? RETURNING name", (name,))
            if not gone.fetchall():
                raise NotFound(f"no placement policy named {name}")
            q(cur, "UPDATE counters SET value = value + 1 WHERE name = 'placement'")

        await self._cat._run(self._cat._write, fn)

    async def list(self) -> list[Policy]:
        rows = await self._cat._run(
            self._cat._read,
            lambda cur: self._cat._q(
                cur, "SELECT name, spec FROM placement_policies ORDER BY name"
            ).fetchall(),
        )
        return [Policy.from_json(r[0], r[1]) for r in rows]

    async def tags_along(self, path: str) -> set[tuple[str, str]]:
        """The tags of ``path`` and of every directory above it: tagging a directory
        covers what is below it."""
        along = [*paths.ancestors(path), path]

        def fn(cur: Cursor) -> set[tuple[str, str]]:
            where = " OR ".join(["(e.parent = ? AND e.name = ?)"] * len(along))
            rows = self._cat._q(
                cur,
                f"SELECT t.key, t.value FROM entries e JOIN tags t ON t.entry_id = e.id "
                f"WHERE {where}",
                [part for p in along for part in _split(p)],
            ).fetchall()
            return {(r[0], r[1]) for r in rows}

        return await self._cat._run(self._cat._read, fn)

    async def tagged_within(self, key: str, value: str, top: str) -> builtins.list[str]:
        """The paths at or below ``top`` that carry the tag ``key=value`` themselves."""
        tagged = await self._cat._run(self._cat._read, lambda cur: self._tagged(cur, key, value))
        return [p for p in tagged if paths.is_within(p, top)]

    async def generation(self) -> int:
        row = await self._cat._run(
            self._cat._read,
            lambda cur: self._cat._q(
                cur, "SELECT value FROM counters WHERE name = 'placement'"
            ).fetchone(),
        )
        return int(row[0])


class PlacementAuthorizer:
    """The residency decision, an authorizer of the governed namespace's chain:
    ``check(who, action, path)`` raises ``PermissionDenied`` (or ``NotFound`` where the
    policy hides metadata) when ``who`` is a remote site the policies keep the data of
    ``path`` from. List asks only about metadata; every other action moves data."""

    def __init__(self, catalog: Catalog, sites: SiteRegistry, *, refresh: float = REFRESH) -> None:
        self.catalog = catalog
        self.store = PolicyStore(catalog)
        self.sites = sites
        self.refresh = refresh
        self._policies: list[_Compiled] = []
        self._labels: dict[str, dict[str, str]] = {}
        self._generation = -1
        self._checked = float("-inf")

    def is_local(self, who: Principal) -> bool:
        # decided by the listener a call came in by, never by a name: whoever comes over
        # the fabric link is remote (the fabric server makes every principal "fabric",
        # whatever the site is called or says), and every other edge is this hub's own
        return who.protocol != "fabric"

    async def reload(self, *, force: bool = False) -> None:
        """Follow edits made by other processes; at most one catalog read per ``refresh``
        seconds on the request path, at once with ``force``."""
        now = time.monotonic()
        if not force and now - self._checked < self.refresh:
            return
        self._checked = now
        generation = await self.store.generation()
        self._labels = {s.name: s.labels for s in await self.sites.list() if s.trusted}
        if generation != self._generation:
            self._policies = [
                _Compiled(p, tuple(_glob_regex(g) for g in p.paths))
                for p in await self.store.list()
            ]
            self._generation = generation
            log.info("placement policies loaded", extra={"policies": len(self._policies)})

    async def _refusing(self, who: Principal, path: str) -> list[Policy]:
        """The policies that apply to ``path`` and refuse ``who``'s site."""
        if self.is_local(who):
            return []
        await self.reload()
        if not self._policies:
            return []
        tags: set[tuple[str, str]] = set()
        if any(c.policy.tag is not None for c in self._policies):
            tags = await self.store.tags_along(path)
        labels = self._labels.get(who.site, {})
        return [
            c.policy
            for c in self._policies
            if c.applies(path, tags) and not c.policy.allows(labels)
        ]

    async def _refusing_below(self, who: Principal, top: str) -> list[Policy]:
        """The refusing policies that may apply to something below ``top``: a glob that
        reaches into it (judged by the glob's literal prefix, so a wildcard counts as a
        match), or a tag carried by an entry below it."""
        labels = self._labels.get(who.site, {})
        out: list[Policy] = []
        for c in self._policies:
            policy = c.policy
            if policy.allows(labels):
                continue
            reaches = any(
                paths.is_within(glob_prefix(g), top) or paths.is_within(top, glob_prefix(g))
                for g in policy.paths
            )
            if reaches or (
                policy.tag is not None and await self.store.tagged_within(*policy.tag, top)
            ):
                out.append(policy)
        return out

    async def check(self, who: Principal, action: Action, path: str, *, tree: bool = False) -> None:
        """``tree``: the call takes everything below ``path`` along (a rename or removal
        of a directory), so a policy on anything below refuses it too."""
        if self.is_local(who):
            return
        await self.reload()
        if not self._policies:
            return
        path = paths.normalize(path)
        refusing = await self._refusing(who, path)
        if tree:
            refusing += await self._refusing_below(who, path)
        if action is Action.LIST:  # names and sizes: refused only where a policy hides them
            refusing = [p for p in refusing if p.metadata is Visibility.HIDDEN]
        if not refusing:
            return
        REFUSED.labels(action.value).inc()
        if any(p.metadata is Visibility.HIDDEN for p in refusing):
            raise NotFound(f"no such file or directory: {path}", path=path)
        raise PermissionDenied(
            f"{action.value} of {path} refused: placement policy {refusing[0].name} does not "
            f"allow site {who.site}",
            path=path,
        )

    def subtree_open(self, who: Principal, action: Action, path: str) -> bool:
        """No policy refuses ``who`` anything (list: no refusing policy hides names), as
        of the policies the last ``check`` loaded."""
        if self.is_local(who) or not self._policies:
            return True
        labels = self._labels.get(who.site, {})
        return all(
            c.policy.allows(labels)
            or (action is Action.LIST and c.policy.metadata is Visibility.VISIBLE)
            for c in self._policies
        )

    async def hidden(self, who: Principal, path: str) -> bool:
        if self.is_local(who):
            return False
        await self.reload()
        if not any(c.policy.metadata is Visibility.HIDDEN for c in self._policies):
            return False  # the common case, asked per feed change
        refusing = await self._refusing(who, paths.normalize(path))
        return any(p.metadata is Visibility.HIDDEN for p in refusing)

    async def _refused_data(self, who: Principal, path: str) -> bool:
        """Whether the data at or below ``path`` may not reach ``who``'s site."""
        return bool(await self._refusing(who, path) or await self._refusing_below(who, path))

    async def redact(self, site: str, changes: list[Change]) -> list[Change]:
        """The change feed as ``site`` may see it: a change to a path hidden from it
        becomes a metadata change of its nearest visible directory (sequence numbers stay
        gap-free, so acknowledgements still settle). Evictions go out to the sites they
        concern (``_redact_eviction``), renames by the names the site may see
        (``_redact_rename``)."""
        who = Principal(user=f"site:{site}", site=site, protocol="fabric")
        if self.is_local(who):
            return changes
        if any(change.op is ChangeOp.EVICT for change in changes):
            # an eviction is logged with the policy that made it, perhaps by another
            # process: judged by the policies of before it, the site it concerns would get
            # a metadata change, acknowledge it, and keep serving what it should drop
            await self.reload(force=True)
        out: list[Change] = []
        for change in changes:
            if change.op is ChangeOp.EVICT:
                out.append(await self._redact_eviction(who, change))
                continue
            if change.op is ChangeOp.RENAME and change.new_path is not None:
                out.append(await self._redact_rename(who, change))
                continue
            if not await self.hidden(who, change.path):
                out.append(change)
                continue
            out.append(await self._nearest_visible(who, change))
        return out

    async def _redact_rename(self, who: Principal, change: Change) -> Change:
        """A rename as ``who`` may learn it. Into a name the site may not see, or whose
        data may not reach it, it is the old name's removal: the site drops what it
        holds (else a move into a restricted tree would leave its bytes cached there).
        Out of a hidden name, it is the new name's creation."""
        assert change.new_path is not None
        old_hidden = await self.hidden(who, change.path)
        new_hidden = await self.hidden(who, change.new_path)
        if old_hidden and new_hidden:
            return await self._nearest_visible(who, change)
        if old_hidden:
            return replace(change, op=ChangeOp.CREATE, path=change.new_path, new_path=None)
        if new_hidden or await self._refused_data(who, change.new_path):
            return replace(change, op=ChangeOp.DELETE, new_path=None)
        return change

    async def _redact_eviction(self, who: Principal, change: Change) -> Change:
        """An eviction for the sites it concerns; a site every policy there allows gets
        a metadata change instead. One naming a path hidden from the site (a move into
        the policy, a name new to it) names the policy's own root instead: the site
        drops what it holds there, and learns no name."""
        if await self.hidden(who, change.path):
            change = replace(change, path=await self._hidden_root(who, change.path))
        if await self._refused_around(who, change.path):
            return change
        return replace(change, op=ChangeOp.META)

    async def _hidden_root(self, who: Principal, path: str) -> str:
        """The deepest literal root of a glob of a policy that hides ``path`` from
        ``who``, or (a tag's policy) the nearest directory above it that is visible."""
        roots = [
            glob_prefix(g)
            for policy in await self._refusing(who, path)
            if policy.metadata is Visibility.HIDDEN
            for g in policy.paths
            if paths.is_within(path, glob_prefix(g))
        ]
        if roots:
            return max(roots, key=len)
        parent = paths.split(path)[0]
        while parent != paths.ROOT and await self.hidden(who, parent):
            parent = paths.split(parent)[0]
        return parent

    async def _nearest_visible(self, who: Principal, change: Change) -> Change:
        """A change to a hidden path, as a metadata change of its nearest visible
        directory (sequence numbers stay gap-free, so acknowledgements still settle)."""
        parent = paths.split(change.path)[0]
        while parent != paths.ROOT and await self.hidden(who, parent):
            parent = paths.split(parent)[0]
        return replace(
            change, op=ChangeOp.META, path=parent, kind=EntryKind.DIR, version=0,
            new_path=None, size=0,
        )  # fmt: skip

    async def _refused_around(self, who: Principal, top: str) -> bool:
        """Whether some policy covering anything at or below ``top`` refuses ``who``."""
        if await self._refusing(who, top):
            return True
        labels = self._labels.get(who.site, {})
        return any(
            not c.policy.allows(labels)
            and any(
                paths.is_within(glob_prefix(g), top) or paths.is_within(top, glob_prefix(g))
                for g in c.policy.paths
            )
            for c in self._policies
        )

    async def covering(self, path: str) -> set[str]:
        """The names of the policies that apply to ``path`` (its glob or a tag along it)."""
        await self.reload()
        if not self._policies:
            return set()
        tags: set[tuple[str, str]] = set()
        if any(c.policy.tag is not None for c in self._policies):
            tags = await self.store.tags_along(paths.normalize(path))
        return {c.policy.name for c in self._policies if c.applies(path, tags)}

    async def tightened(
        self, path: str, before: Mapping[str, str], after: Mapping[str, str]
    ) -> bool:
        """Whether a re-tag brought ``path`` under a policy it was not under."""
        await self.reload()
        return any(
            c.applies(path, set(after.items())) and not c.applies(path, set(before.items()))
            for c in self._policies
        )
