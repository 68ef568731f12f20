"""Access control (core layer): groups, path-prefix ACL rules and private exports, kept in
the site catalog and decided in memory for every namespace call.

A rule ``(path, subject, permission)`` gives ``user:NAME`` or ``group:NAME`` list, read,
put, write or admin on ``path`` and everything below it (see ``Action``: read includes
list, write includes read and put, admin includes all), and rights along a path add up (a
rule deeper down never takes away what an ancestor's rule gave). Two groups are built in:
``everyone`` holds every caller, the anonymous one too, and ``authenticated`` every caller
but the anonymous one. A path is *open* (anyone, also the anonymous caller, may do
anything) while no rule sits on it or on an ancestor and it is not under a private export:
the embedded default works with no setup. Once a rule governs a path, or it is under a
private export, only what a rule grants is allowed. Group ``admin`` (and so ``SYSTEM``) may
do everything, and so may a spoke acting for itself (``site:NAME`` over the fabric link): a
site that may assert any user (see ``fabric.server``) gains nothing more from that.

Administration (volumes, settling a change) is decided apart (``check_admin``) and is
never open: it needs group ``admin`` or an ``admin`` rule on the path or an ancestor,
whatever the data rules leave open. The anonymous caller never has it, nor a spoke, for
itself or for a user it merely names (a site may assert any user; only credentials the
hub checked make an administrator).

Directories on the way to a path a caller was granted can be stat'ed and listed, showing
only the children that lead there, so a user can walk down to a grant in a private tree.

A bucket policy (``protocols.s3.policy``) adds rules of its own, kept with its document
and replaced together: an allow rule grants as any rule does; a deny rule takes its bits
away on its path and below from the subjects it names, whatever any rule grants (the
bucket owner's admin too, but never the admin right itself, so the owner can always undo
it; group ``admin`` and spokes acting for themselves are above it). A deny alone does not
make an open path governed: it only takes away.

A public access block (``PublicBlock``, S3's) on a path binds it and everything below:
``block_acls`` refuses new rules that grant to ``everyone`` or ``authenticated`` there,
``ignore_acls`` makes such rules grant nothing; ``block_policy`` refuses a bucket policy
that would grant to them, ``restrict_policy`` makes such policy rules grant nothing.

Every change bumps the catalog counter ``acl``; a hub compares it with the generation it
holds at most every ``refresh`` seconds and reloads on a change, so a ``loomfs acl``
command run in another process takes effect within that time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from .. import paths
from ..errors import (
    AlreadyExists,
    AuthenticationFailed,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    UnsupportedScheme,
)
from .catalog.base import Catalog
from .catalog.sql import Cursor, SqlCatalog
from .types import Action, Principal
from .users import _check_name, bump_acl_generation

ADMIN_GROUP = "admin"
ANONYMOUS = "anonymous"  # the user of a caller that presented no credentials
EVERYONE = "everyone"  # built-in group: every caller, the anonymous one too
AUTHENTICATED = "authenticated"  # built-in group: every caller with credentials
BUILT_IN_GROUPS = frozenset({EVERYONE, AUTHENTICATED})
SITE_PREFIX = "site:"  # a spoke acting for itself; user names can't contain ':'
# what a grant holds and what a call needs, as bits: list, content, change, ownership
_LIST, _READ, _WRITE, _ADMIN = 1, 2, 4, 8
_GRANTS = {
    Action.LIST: _LIST,
    Action.READ: _LIST | _READ,
    Action.PUT: _LIST | _WRITE,
    Action.WRITE: _LIST | _READ | _WRITE,
    Action.ADMIN: _LIST | _READ | _WRITE | _ADMIN,
}
_NEEDS = {
    Action.LIST: _LIST,
    Action.READ: _READ,
    Action.PUT: _WRITE,
    Action.WRITE: _WRITE,
    Action.ADMIN: _ADMIN,
}
REFRESH = 2.0
DECISIONS = 1 << 16  # remembered answers per generation of the rules


@dataclass(frozen=True, slots=True)
class Rule:
    path: str
    subject: str
    permission: Action
    created_ns: int


@dataclass(frozen=True, slots=True)
class PolicyRule:
    """A rule a bucket policy made: ``bits`` (``granted`` / ``needed``) given, or taken
    away (``deny``), on ``path`` and below."""

    path: str
    subject: str
    deny: bool
    bits: int


PUBLIC_SUBJECTS = frozenset({f"group:{EVERYONE}", f"group:{AUTHENTICATED}"})


@dataclass(frozen=True, slots=True)
class PublicBlock:
    block_acls: bool = False
    ignore_acls: bool = False
    block_policy: bool = False
    restrict_policy: bool = False

    @property
    def flags(self) -> int:
        return sum(1 << i for i, on in enumerate(self._values()) if on)

    def _values(self) -> tuple[bool, bool, bool, bool]:
        return (self.block_acls, self.ignore_acls, self.block_policy, self.restrict_policy)

    @classmethod
    def of_flags(cls, flags: int) -> PublicBlock:
        return cls(*(bool(flags >> i & 1) for i in range(4)))

    def __or__(self, other: PublicBlock) -> PublicBlock:
        return PublicBlock.of_flags(self.flags | other.flags)


def granted(action: Action) -> int:
    """The bits a grant of ``action`` holds."""
    return _GRANTS[action]


def needed(*actions: Action) -> int:
    """The bits that calls needing ``actions`` need (what a deny of them takes away)."""
    bits = 0
    for action in actions:
        bits |= _NEEDS[action]
    return bits


@dataclass(frozen=True, slots=True)
class Group:
    name: str
    members: tuple[str, ...]
    #: None for a group that exists only through memberships (``user add --group``)
    created_ns: int | None


def parse_subject(subject: str) -> str:
    kind, sep, name = subject.partition(":")
    if not sep or kind not in ("user", "group"):
        raise InvalidArgument(f"a subject is user:NAME or group:NAME, not {subject!r}")
    _check_name(name, f"{kind} name")
    return subject


def parse_permission(permission: str) -> Action:
    try:
        return Action(permission)
    except ValueError:
        raise InvalidArgument(
            f"a permission is list, read, put, write or admin, not {permission!r}"
        ) from None


def is_site(who: Principal) -> bool:
    return who.protocol == "fabric" and who.user.startswith(SITE_PREFIX)


class AclPolicy:
    """One generation of the rules, decided without I/O (a few dict lookups per call)."""

    def __init__(
        self,
        rules: Iterable[Rule] = (),
        private: Iterable[str] = (),
        members: Mapping[str, frozenset[str]] | None = None,
        generation: int = 0,
        policies: Iterable[PolicyRule] = (),
        blocks: Mapping[str, PublicBlock] | None = None,
    ) -> None:
        self.generation = generation
        self.blocks = dict(blocks or {})
        # what rules and policies give everyone / every authenticated caller, kept apart
        # too: a public access block takes them out of the sums in ``_rules``
        self._public: dict[str, dict[str, int]] = {}  # path -> subject -> bits (rules)
        self._public_policy: dict[str, dict[str, int]] = {}  # ... (a policy's allows)
        self.private = frozenset(private)
        self.members = dict(members or {})
        self._rules: dict[str, dict[str, int]] = {}  # path -> subject -> granted bits
        self._granted: dict[str, set[str]] = {}  # subject -> paths it has a rule on
        self.at: dict[str, frozenset[tuple[str, Action]]] = {}  # path -> its own rules
        for rule in rules:
            on_path = self._rules.setdefault(rule.path, {})
            on_path[rule.subject] = on_path.get(rule.subject, 0) | _GRANTS[rule.permission]
            if rule.subject in PUBLIC_SUBJECTS:
                public = self._public.setdefault(rule.path, {})
                public[rule.subject] = public.get(rule.subject, 0) | _GRANTS[rule.permission]
            self._granted.setdefault(rule.subject, set()).add(rule.path)
            self.at[rule.path] = self.at.get(rule.path, frozenset()) | {
                (rule.subject, rule.permission)
            }
        self._denied: dict[str, dict[str, int]] = {}  # path -> subject -> bits taken away
        for made in policies:
            table = self._denied if made.deny else self._rules
            on_path = table.setdefault(made.path, {})
            on_path[made.subject] = on_path.get(made.subject, 0) | made.bits
            if not made.deny:
                self._granted.setdefault(made.subject, set()).add(made.path)
                if made.subject in PUBLIC_SUBJECTS:
                    public = self._public_policy.setdefault(made.path, {})
                    public[made.subject] = public.get(made.subject, 0) | made.bits
        self._governing = frozenset(self._rules) | self.private
        # every path something is decided on: a deny governs nothing, but must be asked
        self._watched = self._governing | frozenset(self._denied)
        self._decided: dict[tuple[str, frozenset[str], str, Action, str], bool] = {}

    def _subjects(self, who: Principal) -> tuple[frozenset[str], list[str]]:
        groups = who.groups
        if who.user != ANONYMOUS:  # the registry's groups of the user, whichever protocol
            groups = groups | self.members.get(who.user, frozenset()) | {AUTHENTICATED}
        groups = groups | {EVERYONE}
        return groups, [f"user:{who.user}", *(f"group:{g}" for g in groups)]

    def _grant(self, subjects: list[str], path: str) -> tuple[bool, int]:
        """(whether anything governs ``path``, the bits the subjects hold there)."""
        governed, best = False, 0
        block = self.block_on(path) if self.blocks else None
        for p in (path, *paths.ancestors(path)):
            if p in self.private:
                governed = True
            on_path = self._rules.get(p)
            if on_path is not None:
                governed = True
                for subject in subjects:
                    if block is not None and subject in PUBLIC_SUBJECTS:
                        best |= self._public_bits(p, subject, block)
                    else:
                        best |= on_path.get(subject, 0)
        return governed, best

    def _public_bits(self, path: str, subject: str, block: PublicBlock) -> int:
        """What ``path``'s rules and policy rules give a public ``subject`` under ``block``."""
        bits = 0 if block.ignore_acls else self._public.get(path, {}).get(subject, 0)
        if not block.restrict_policy:
            bits |= self._public_policy.get(path, {}).get(subject, 0)
        return bits

    def block_on(self, path: str) -> PublicBlock:
        """The public access block binding ``path``: those on it and its ancestors."""
        block = PublicBlock()
        for p in (path, *paths.ancestors(path)):
            found = self.blocks.get(p)
            if found is not None:
                block |= found
        return block

    def _taken(self, subjects: list[str], path: str) -> int:
        """The bits a deny rule takes from the subjects on ``path``."""
        taken = 0
        for p in (path, *paths.ancestors(path)):
            on_path = self._denied.get(p)
            if on_path is not None:
                for subject in subjects:
                    taken |= on_path.get(subject, 0)
        return taken

    def allows(self, who: Principal, action: Action, path: str) -> bool:
        if not self._watched:
            return True  # no rule and no private export anywhere: everything is open
        # the same caller asks about the same paths again and again (stat, open, read):
        # the answer is remembered for as long as this generation of the rules lives
        slot = (who.user, who.groups, who.protocol, action, path)
        known = self._decided.get(slot)
        if known is None:
            if len(self._decided) >= DECISIONS:
                self._decided.clear()
            known = self._decided[slot] = self._decide(who, action, path)
        return known

    def _decide(self, who: Principal, action: Action, path: str) -> bool:
        groups, subjects = self._subjects(who)
        if ADMIN_GROUP in groups or is_site(who):
            return True
        if self._denied and self._taken(subjects, path) & _NEEDS[action]:
            return False
        governed, best = self._grant(subjects, path)
        if not governed or best & _NEEDS[action]:
            return True
        return action is Action.LIST and self._leads_to_grant(subjects, path)

    def _leads_to_grant(self, subjects: list[str], path: str) -> bool:
        if self.blocks:
            block = self.block_on(path)
            if block.ignore_acls or block.restrict_policy:
                # the way down to a public grant is not shown where any is taken away
                subjects = [s for s in subjects if s not in PUBLIC_SUBJECTS]
        return any(
            granted != path and paths.is_within(granted, path)
            for subject in subjects
            for granted in self._granted.get(subject, ())
        )

    def admits(self, who: Principal, path: str) -> bool:
        """Whether ``who`` may administer ``path``: the open default never applies."""
        if who.user == ANONYMOUS or who.user.startswith(SITE_PREFIX) or who.asserted:
            return False
        groups, subjects = self._subjects(who)
        return ADMIN_GROUP in groups or bool(self._grant(subjects, path)[1] & _ADMIN)

    def subtree_open(self, who: Principal, action: Action, path: str) -> bool:
        """Whether ``action`` is allowed on every path at or below ``path``: then a listing
        needs no check per child."""
        if not self._watched:
            return True
        groups, subjects = self._subjects(who)
        if ADMIN_GROUP in groups or is_site(who):
            return True
        if any(paths.is_within(d, path) or paths.is_within(path, d) for d in self._denied):
            return False  # a deny here or below: each child is decided on its own
        governed, best = self._grant(subjects, path)
        if governed:
            return bool(best & _NEEDS[action])
        return not any(paths.is_within(g, path) for g in self._governing)

    def public_within(self, path: str) -> bool:
        """Whether a rule at or below ``path`` grants anything to everyone or to every
        caller with credentials (S3's "public")."""
        return any(
            bits and subject in (f"group:{EVERYONE}", f"group:{AUTHENTICATED}")
            for where, on_path in self._rules.items()
            if paths.is_within(where, path)
            for subject, bits in on_path.items()
        )

    def rules_within(self, path: str) -> bool:
        """Whether a rule or private mark sits at or below ``path``."""
        return any(paths.is_within(g, path) for g in self._watched)

    def governed_below(self, path: str) -> list[str]:
        """The paths strictly below ``path`` that a rule or private mark sits on."""
        return [g for g in self._watched if g != path and paths.is_within(g, path)]


class AclStore:
    """The rows behind the policy, in a SQL catalog (both engines, same SQL)."""

    def __init__(self, catalog: Catalog) -> None:
        if not isinstance(catalog, SqlCatalog):
            raise UnsupportedScheme(f"access control needs a SQL catalog, not {catalog.url}")
        self._cat = catalog

    async def _change(self, fn: Callable[[Cursor], None]) -> None:
        def write(cur: Cursor) -> None:
            fn(cur)
            bump_acl_generation(self._cat, cur)

        await self._cat._run(self._cat._write, write)

    # -- groups ----------------------------------------------------------------------------

    async def add_group(self, name: str) -> None:
        _check_name(name, "group name")
        if name in BUILT_IN_GROUPS:
            raise AlreadyExists(f"group {name} is built in")

        def fn(cur: Cursor) -> None:
            q = self._cat._q
            if q(cur, "SELECT 1 FROM acl_groups WHERE name = ?", (name,)).fetchone() is not None:
                raise AlreadyExists(f"group {name} already exists")
            q(
                cur,
                "INSERT INTO acl_groups (name, created_ns) VALUES (?, ?)",
                (name, time.time_ns()),
            )

        await self._change(fn)

    async def remove_group(self, name: str) -> None:
        """Remove a group and its memberships; refused while a rule names it, since the
        rule would silently come back to life with a new group of that name."""

        def fn(cur: Cursor) -> None:
            q = self._cat._q
            named = q(
                cur,
                "SELECT path FROM acl_rules WHERE subject = ? ORDER BY path",
                (f"group:{name}",),
            ).fetchall()
            if named:
                where = ", ".join(r[0] for r in named)
                raise InvalidArgument(
                    f"rules name group {name} (on {where}); `loomfs acl revoke` them first"
                )
            gone = q(cur, "DELETE FROM acl_groups WHERE name = ? RETURNING name", (name,))
            had_row = gone.fetchone() is not None
            members = q(cur, "DELETE FROM user_groups WHERE group_name = ? RETURNING user_name",
                        (name,)).fetchall()  # fmt: skip
            if not had_row and not members:
                raise NotFound(f"no such group: {name}")

        await self._change(fn)

    async def set_member(self, group: str, user: str, *, member: bool) -> None:
        def fn(cur: Cursor) -> None:
            q = self._cat._q
            if q(cur, "SELECT 1 FROM users WHERE name = ?", (user,)).fetchone() is None:
                raise NotFound(f"no such user: {user}")
            known = q(
                cur,
                "SELECT 1 FROM user_groups WHERE user_name = ? AND group_name = ?",
                (user, group),
            ).fetchone()
            if member and known is None:
                _check_name(group, "group name")
                q(cur, "INSERT INTO user_groups (user_name, group_name) VALUES (?, ?)",
                  (user, group))  # fmt: skip
            elif not member and known is not None:
                q(cur, "DELETE FROM user_groups WHERE user_name = ? AND group_name = ?",
                  (user, group))  # fmt: skip
            elif not member:
                raise NotFound(f"user {user} is not in group {group}")

        await self._change(fn)

    async def list_groups(self) -> list[Group]:
        def fn(cur: Cursor) -> list[Group]:
            q = self._cat._q
            made = dict(q(cur, "SELECT name, created_ns FROM acl_groups").fetchall())
            members: dict[str, list[str]] = {name: [] for name in made}
            for user, group in q(
                cur, "SELECT user_name, group_name FROM user_groups ORDER BY user_name"
            ).fetchall():
                members.setdefault(group, []).append(user)
            return [Group(g, tuple(members[g]), made.get(g)) for g in sorted(members)]

        return await self._cat._run(self._cat._read, fn)

    # -- rules -----------------------------------------------------------------------------

    async def resolve(self, subject: str) -> str:
        """user:NAME and group:NAME as given; a bare NAME is the group of that name (a
        built-in one too), or else the user, and an error when neither exists (a typo must
        not become a rule)."""
        if ":" in subject:
            return parse_subject(subject)
        if subject in BUILT_IN_GROUPS:
            return f"group:{subject}"

        def fn(cur: Cursor) -> str:
            q = self._cat._q
            group = q(
                cur,
                "SELECT 1 FROM acl_groups WHERE name = ? UNION "
                "SELECT 1 FROM user_groups WHERE group_name = ?",
                (subject, subject),
            ).fetchone()
            if group is not None:
                return f"group:{subject}"
            if q(cur, "SELECT 1 FROM users WHERE name = ?", (subject,)).fetchone() is not None:
                return f"user:{subject}"
            raise NotFound(
                f"no group or user named {subject!r}; say user:NAME or group:NAME to name "
                "one that does not exist yet"
            )

        return await self._cat._run(self._cat._read, fn)

    async def grant(self, subject: str, permission: str, path: str) -> Rule:
        subject, action, path = (
            parse_subject(subject),
            parse_permission(permission),
            paths.normalize(path),
        )
        now = time.time_ns()

        def fn(cur: Cursor) -> None:
            q = self._cat._q
            exists = q(
                cur,
                "SELECT 1 FROM acl_rules WHERE path = ? AND subject = ? AND permission = ?",
                (path, subject, action.value),
            ).fetchone()
            if exists is None:
                q(cur, "INSERT INTO acl_rules (path, subject, permission, created_ns) "
                  "VALUES (?, ?, ?, ?)", (path, subject, action.value, now))  # fmt: skip

        await self._change(fn)
        return Rule(path, subject, action, now)

    async def revoke(self, subject: str, permission: str, path: str) -> None:
        subject, action, path = (
            parse_subject(subject),
            parse_permission(permission),
            paths.normalize(path),
        )

        def fn(cur: Cursor) -> None:
            gone = self._cat._q(
                cur,
                "DELETE FROM acl_rules WHERE path = ? AND subject = ? AND permission = ? "
                "RETURNING path",
                (path, subject, action.value),
            ).fetchone()
            if gone is None:
                raise NotFound(f"no rule gives {subject} {action.value} on {path}")

        await self._change(fn)

    async def set_private(self, path: str, private: bool) -> None:
        path = paths.normalize(path)

        def fn(cur: Cursor) -> None:
            q = self._cat._q
            if private:
                if q(cur, "SELECT 1 FROM acl_private WHERE path = ?", (path,)).fetchone() is None:
                    q(cur, "INSERT INTO acl_private (path, created_ns) VALUES (?, ?)",
                      (path, time.time_ns()))  # fmt: skip
            elif q(cur, "DELETE FROM acl_private WHERE path = ? RETURNING path",
                   (path,)).fetchone() is None:  # fmt: skip
                raise NotFound(f"{path} is not marked private")

        await self._change(fn)

    async def replace(
        self, path: str, grants: Iterable[tuple[str, Action]], *, private: bool | None = None
    ) -> None:
        """Make ``grants`` the rules on ``path`` itself, in one step (the rules of paths
        above or below it stay); ``private`` marks or unmarks it, None leaves that."""
        path = paths.normalize(path)
        wanted = {(parse_subject(subject), action.value) for subject, action in grants}
        now = time.time_ns()

        def fn(cur: Cursor) -> None:
            q = self._cat._q
            q(cur, "DELETE FROM acl_rules WHERE path = ?", (path,))
            for subject, permission in sorted(wanted):
                q(cur, "INSERT INTO acl_rules (path, subject, permission, created_ns) "
                  "VALUES (?, ?, ?, ?)", (path, subject, permission, now))  # fmt: skip
            if private is not None:
                q(cur, "DELETE FROM acl_private WHERE path = ?", (path,))
                if private:
                    q(cur, "INSERT INTO acl_private (path, created_ns) VALUES (?, ?)",
                      (path, now))  # fmt: skip

        await self._change(fn)

    async def forget(self, path: str) -> None:
        """Drop every rule, private mark and policy at or below ``path`` (a policy's rules
        go with it, not with the paths they are on: removing a key keeps the policy)."""
        path = paths.normalize(path)
        below = path.rstrip("/") + "/"  # compared as a prefix: LIKE would read '_' as any
        where = (
            ("acl_rules", "path"),
            ("acl_private", "path"),
            ("acl_policies", "path"),
            ("acl_policy_rules", "policy"),
            ("acl_public_blocks", "path"),
        )

        def fn(cur: Cursor) -> None:
            q = self._cat._q
            for table, column in where:
                q(cur, f"DELETE FROM {table} WHERE {column} = ? OR substr({column}, 1, ?) = ?",
                  (path, len(below), below))  # fmt: skip

        await self._change(fn)

    async def policy(self, path: str) -> str | None:
        """The document of the bucket policy on ``path``, None if it has none."""
        path = paths.normalize(path)

        def fn(cur: Cursor) -> str | None:
            row = self._cat._q(
                cur, "SELECT document FROM acl_policies WHERE path = ?", (path,)
            ).fetchone()
            return None if row is None else str(row[0])

        return await self._cat._run(self._cat._read, fn)

    async def set_policy(
        self, path: str, document: str | None, rules: Iterable[PolicyRule] = ()
    ) -> None:
        """Make ``document`` and ``rules`` the policy on ``path`` in one step (None: none),
        replacing the whole previous one: a caller sees the old rules or the new ones."""
        path = paths.normalize(path)
        made = sorted(
            {(paths.normalize(r.path), parse_subject(r.subject), int(r.deny), r.bits)
             for r in rules}
        )  # fmt: skip
        now = time.time_ns()

        def fn(cur: Cursor) -> None:
            q = self._cat._q
            q(cur, "DELETE FROM acl_policy_rules WHERE policy = ?", (path,))
            q(cur, "DELETE FROM acl_policies WHERE path = ?", (path,))
            if document is None:
                return
            q(cur, "INSERT INTO acl_policies (path, document, created_ns) VALUES (?, ?, ?)",
              (path, document, now))  # fmt: skip
            for where, subject, deny, bits in made:
                q(cur, "INSERT INTO acl_policy_rules (policy, path, subject, deny, bits) "
                  "VALUES (?, ?, ?, ?, ?)", (path, where, subject, deny, bits))  # fmt: skip

        await self._change(fn)

    async def set_public_block(self, path: str, block: PublicBlock | None) -> None:
        """Make ``block`` the public access block on ``path`` (None: none)."""
        path = paths.normalize(path)

        def fn(cur: Cursor) -> None:
            q = self._cat._q
            q(cur, "DELETE FROM acl_public_blocks WHERE path = ?", (path,))
            if block is not None:
                q(cur, "INSERT INTO acl_public_blocks (path, flags) VALUES (?, ?)",
                  (path, block.flags))  # fmt: skip

        await self._change(fn)

    async def generation(self) -> int:
        return await self._cat._run(self._cat._read, self._generation)

    def _generation(self, cur: Cursor) -> int:
        row = self._cat._q(cur, "SELECT value FROM counters WHERE name = 'acl'").fetchone()
        return int(row[0])

    async def snapshot(self) -> tuple[list[Rule], list[str], AclPolicy]:
        """The rules, the private paths, and the policy they make, read together."""

        def fn(cur: Cursor) -> tuple[list[Rule], list[str], AclPolicy]:
            q = self._cat._q
            generation = self._generation(cur)
            rules = [
                Rule(r[0], r[1], Action(r[2]), r[3])
                for r in q(
                    cur,
                    "SELECT path, subject, permission, created_ns FROM acl_rules "
                    "ORDER BY path, subject, permission",
                ).fetchall()
            ]
            private = [
                r[0] for r in q(cur, "SELECT path FROM acl_private ORDER BY path").fetchall()
            ]
            members: dict[str, set[str]] = {}
            for user, group in q(cur, "SELECT user_name, group_name FROM user_groups").fetchall():
                members.setdefault(user, set()).add(group)
            frozen = {user: frozenset(groups) for user, groups in members.items()}
            policies = [
                PolicyRule(r[0], r[1], bool(r[2]), int(r[3]))
                for r in q(
                    cur, "SELECT path, subject, deny, bits FROM acl_policy_rules ORDER BY path"
                ).fetchall()
            ]
            blocks = {
                str(r[0]): PublicBlock.of_flags(int(r[1]))
                for r in q(cur, "SELECT path, flags FROM acl_public_blocks").fetchall()
            }
            policy = AclPolicy(rules, private, frozen, generation, policies, blocks)
            return rules, private, policy

        return await self._cat._run(self._cat._read, fn)


class AclAuthorizer:
    """The ``Authorizer`` of ACL rules: in-memory decisions, following the catalog."""

    def __init__(self, catalog: Catalog, *, refresh: float = REFRESH) -> None:
        self.store = AclStore(catalog)
        self.refresh = refresh
        self.policy = AclPolicy(generation=-1)  # not loaded yet: nothing is decided on it
        self._checked = float("-inf")
        self._loading = asyncio.Lock()

    async def reload(self) -> None:
        """Take the catalog's rules now (after a change made in this process)."""
        self._checked = time.monotonic()
        self.policy = (await self.store.snapshot())[2]

    async def _current(self) -> AclPolicy:
        if self.policy.generation < 0:
            async with self._loading:
                if self.policy.generation < 0:
                    await self.reload()
        elif time.monotonic() - self._checked >= self.refresh:
            await self.catch_up()  # one caller asks; concurrent ones decide on what they have
        return self.policy

    async def catch_up(self) -> None:
        """Decide by the catalog's rules as they are now, reading them only if they moved
        (after administration here: a grant is in force at the next call, not ``refresh``
        later)."""
        self._checked = time.monotonic()
        if await self.store.generation() != self.policy.generation:
            self.policy = (await self.store.snapshot())[2]

    async def check(self, who: Principal, action: Action, path: str, *, tree: bool = False) -> None:
        """``tree``: the call takes everything below ``path`` along (a rename or removal
        of a directory), so each governed path below must allow it too: a private
        directory inside an open one would otherwise leave with its parent's move."""
        policy = self.policy
        if policy.generation < 0 or time.monotonic() - self._checked >= self.refresh:
            policy = await self._current()  # only then: the common call awaits nothing
        below = policy.governed_below(path) if tree else ()
        for where in (path, *below):
            if not policy.allows(who, action, where):
                raise PermissionDenied(f"{who.user} may not {action.value} {where}", path=where)

    async def check_admin(self, who: Principal, path: str) -> None:
        """Return if ``who`` may administer ``path`` (see ``AclPolicy.admits``); raise
        ``AuthenticationFailed`` for the anonymous caller, ``PermissionDenied`` else."""
        path = paths.normalize(path)
        if (await self._current()).admits(who, path):
            return
        if who.user == ANONYMOUS:
            raise AuthenticationFailed(
                f"administering {path} needs the credentials of an administrator (a user in "
                f"group {ADMIN_GROUP}, or granted admin there)",
                path=path,
            )
        raise PermissionDenied(
            f"{who.user} may not administer {path}: that needs group {ADMIN_GROUP} or an "
            "admin grant on it (`loomfs acl grant NAME admin PATH`)",
            path=path,
        )

    def subtree_open(self, who: Principal, action: Action, path: str) -> bool:
        return self.policy.subtree_open(who, action, path)

    async def rules_at(self, path: str) -> tuple[frozenset[tuple[str, Action]], bool]:
        """The rules on ``path`` itself (subject, permission) and whether it is private,
        as of the current generation."""
        policy, path = await self._current(), paths.normalize(path)
        return policy.at.get(path, frozenset()), path in policy.private

    async def rules_within(self, path: str) -> bool:
        return (await self._current()).rules_within(paths.normalize(path))

    async def public_within(self, path: str) -> bool:
        return (await self._current()).public_within(paths.normalize(path))

    async def public_block(self, path: str) -> PublicBlock | None:
        """The public access block set on ``path`` itself, None if none."""
        return (await self._current()).blocks.get(paths.normalize(path))

    async def check_public(self, path: str, subjects: Iterable[str], what: str) -> None:
        """PermissionDenied if the public access block on ``path`` refuses giving anything
        to ``subjects`` by ``what`` ("acl" rules or a "policy")."""
        path = paths.normalize(path)
        block = (await self._current()).block_on(path)
        refused = block.block_acls if what == "acl" else block.block_policy
        public = sorted(PUBLIC_SUBJECTS.intersection(subjects))
        if refused and public:
            raise PermissionDenied(
                f"the public access block on {path} refuses a {what} that grants to {public[0]}",
                path=path,
            )

    def groups_of(self, user: str) -> frozenset[str]:
        """The registry's groups of ``user``, as of the rules in memory."""
        return self.policy.members.get(user, frozenset())
