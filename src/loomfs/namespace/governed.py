"""Governance in one place (namespace layer): every call of every edge is decided here, on
what it will really touch, and then recorded for audit.

``GovernedNamespace`` wraps the hub's namespace, and every edge gets the wrapped one: the
REST API, the S3 gateway, SFTP, FUSE mounts and the fabric link that spokes reach it by.
None has a second way in; the hub's own machinery (imports, rescans, the change feed)
keeps the inner one. A call is decided in three steps:

1. **Resolve** what it touches, through the inner namespace (``ResolvingNamespace``): a
   read of a symlink reads its final target, so it needs read on the target (POSIX's
   meaning) and is served from the target's entry, not re-resolved by name afterwards; a
   file with hard links is one file under every name, so reading or changing it through
   one name needs the right on each; a rename or removal of a directory takes everything
   below it along, so each authorizer checks the whole tree (``tree=True``).
2. **Ask every authorizer** about each of those objects: ACL rules for users, residency
   for sites (``core.placement``). Device nodes, FIFOs and set-user-ID/set-group-ID bits
   also need an admin right held by name (``AclAuthorizer.check_admin``): they hand
   whoever uses them the hub process's own privileges, so no open default covers them.
3. **Audit once**, with the outcome; a denial is recorded as ``denied`` and raised
   unchanged.

Which action a call needs: stat, list, get_tags and stat_tags need list (metadata), read
and read_entry need read (content); write, mkdir, symlink, mknod, remove, set_attrs (mode,
mtime, atime), set_tags and taking or giving up a write lease need write; a rename needs
write on both paths, and so does a hard link (writes through the new name change the
source in place); changing a file's owner (uid, gid) needs admin. What is not a namespace
call but hands out a path's content (the fabric link's chunk maps) goes through
``audited`` with the action it needs, resolved alike. A read is recorded when its reader
is closed, with the bytes it delivered; a listing when its first entry, its end or its
error arrives (a failure later in a long listing is not recorded).

When every authorizer vouches that the caller may do an action anywhere (an open site,
group admin), step 1 is skipped: nothing it could find would change the answer.

Where the site keeps ACL rules (``rules``), the access rules of a path are part of this
API too, for protocols that let their clients set them (S3 ACLs): ``access`` and
``set_access`` read and replace the rules on one path (admin needed), ``mkdir_owned``
makes a directory private to its creator, and ``forget_access`` drops the rules left on
a path that is gone (write needed, as for making it anew).
"""

from __future__ import annotations

import builtins
import stat
import time
from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Mapping,
    Sequence,
)
from dataclasses import replace
from functools import partial
from typing import NamedTuple, Protocol, TypeVar, runtime_checkable

from .. import paths
from ..core.acl import ANONYMOUS, AclAuthorizer, PolicyRule, PublicBlock, is_site
from ..core.audit import AuditSink
from ..core.types import SYSTEM, Action, Change, ChangeOp, Entry, EntryKind, Feed, Principal
from ..errors import (
    AlreadyExists,
    Conflict,
    InvalidArgument,
    LoomError,
    NotFound,
    NotSupported,
    PermissionDenied,
)
from . import sse
from .base import (
    FeedNamespace,
    Reader,
    ResolvingNamespace,
    Version,
    WriteTagsArg,
    tags_now,
    without_owner,
)
from .objectlock import Lock

T = TypeVar("T")

#: seconds between the decisions a streaming read asks again (the decisions are held in
#: memory: asking again costs a few dict lookups)
RECHECK = 0.5

#: the mode bits that make an executable run with its owner's or group's privileges
SET_ID = stat.S_ISUID | stat.S_ISGID
#: contents whose encryption tags are remembered (they change only with the content's
#: version), and directories whose default encryption is
_SEALS_KEPT = 4096


class Need(NamedTuple):
    """One object a call touches and the action it needs there."""

    action: Action
    path: str
    tree: bool = False


class Authorizer(Protocol):
    async def check(self, who: Principal, action: Action, path: str, *, tree: bool = False) -> None:
        """Return if allowed; raise ``PermissionDenied``, or ``NotFound`` where the path
        must look absent to this caller. ``tree``: the call takes everything below
        ``path`` along, and must be allowed on all of it."""


@runtime_checkable
class SubtreeAuthorizer(Protocol):
    """An optional ability: a cheap, synchronous answer to "is everything below this path
    allowed?", so that listing an open directory costs no check per child."""

    def subtree_open(self, who: Principal, action: Action, path: str) -> bool: ...


class _GovernedReader(Reader):
    """A decided read, kept decided while it streams: the decision is asked again before
    a chunk once ``RECHECK`` seconds have passed since the last time, and before the read
    is verified (a REST body's last byte waits for that, so a consumer of the local file
    region learns it too). A right revoked, or a policy tightened, while a stream is open
    stops it there, with the denial recorded. Its read is recorded when it is closed, with
    the bytes it handed out: those streamed, or its whole range when the consumer took the
    local file region instead."""

    def __init__(
        self,
        reader: Reader,
        decide: Callable[[], Awaitable[None]],
        done: Callable[[int], None] | None,
    ) -> None:
        super().__init__(reader.entry, reader.offset, reader)
        self._decide = decide
        self._decided = time.monotonic()
        self._done = done
        self._sent = 0
        self._streamed = False

    async def _still(self) -> None:
        await self._decide()
        self._decided = time.monotonic()

    async def chunks(self) -> AsyncIterator[bytes]:
        self._streamed = True
        async for chunk in self.source.chunks():
            if time.monotonic() - self._decided >= RECHECK:
                await self._still()
            self._sent += len(chunk)
            yield chunk

    async def verify(self) -> None:
        await self._still()
        await self.source.verify()

    async def aclose(self) -> None:
        done, self._done = self._done, None
        try:
            await self.source.aclose()
        finally:
            if done is not None:
                streamed = self._streamed or self.region is None
                done(self._sent if streamed else self.length)


class _Listing:
    """The entries of a governed listing. The first is awaited here: authorization, and
    the outcome recorded once (a missing directory fails there). The rest pass straight
    from the inner listing, with no frame of ours per entry, unless some authorizer can't
    vouch for the whole directory and every child is checked."""

    def __init__(
        self,
        gov: GovernedNamespace,
        who: Principal,
        path: str,
        start_after: str | None,
        limit: int | None,
    ) -> None:
        self._gov, self._who, self._path = gov, who, path
        self._start_after, self._limit = start_after, limit
        self._next: Callable[[], Awaitable[Entry]] = self._first
        self._entries: AsyncIterator[Entry] | None = None

    def __aiter__(self) -> _Listing:
        return self

    def __anext__(self) -> Awaitable[Entry]:
        return self._next()

    async def _first(self) -> Entry:
        gov, who, path = self._gov, self._who, self._path
        await gov.authorize(who, "list", Action.LIST, path)
        entries = gov.inner.list(who, path, start_after=self._start_after, limit=self._limit)
        vouching = gov.vouching
        if vouching is None or not all(a.subtree_open(who, Action.LIST, path) for a in vouching):
            entries = gov._filtered(who, entries)
        self._entries, self._next = entries, entries.__anext__
        try:
            entry = await entries.__anext__()
        except LoomError as exc:
            gov._record(who, "list", path, exc.code, detail=str(exc))
            raise
        except StopAsyncIteration:
            gov._record(who, "list", path, "ok")
            raise
        gov._record(who, "list", path, "ok")
        return entry

    async def aclose(self) -> None:
        """As an async generator's: a consumer that stops early releases the listing."""
        if isinstance(self._entries, AsyncGenerator):
            await self._entries.aclose()


class GovernedNamespace(FeedNamespace):
    def __init__(
        self,
        inner: ResolvingNamespace,
        authorizers: Sequence[Authorizer],
        *,
        audit: AuditSink | None = None,
        rules: AclAuthorizer | None = None,
        keys: sse.KeyStore | None = None,
    ) -> None:
        self.inner = inner
        #: the site's keys for SSE-S3 and SSE-KMS (None: only customers' keys encrypt)
        self.keys = keys
        # (path, version) -> the content's encryption tags; directory -> its default
        self._seals: dict[tuple[str, int], dict[str, str]] = {}
        self._defaults: dict[str, sse.Sealing | None] = {}
        self.authorizers = list(authorizers)
        self.audit = audit
        #: where the access rules of paths are kept (and decided by one of the authorizers)
        self.rules = rules
        # the authorizers, when every one can vouch for a subtree (a protocol isinstance
        # check is slow: it is made once, here)
        subtree = [a for a in self.authorizers if isinstance(a, SubtreeAuthorizer)]
        self.vouching = subtree if len(subtree) == len(self.authorizers) else None

    # -- the steps of every call -----------------------------------------------------------

    def _record(
        self, who: Principal, op: str, path: str, result: str, *, nbytes: int = 0, detail: str = ""
    ) -> None:
        if self.audit is not None:
            self.audit.record(who, op, path, result, nbytes=nbytes, detail=detail)

    async def _ask(self, who: Principal, needs: Iterable[Need]) -> None:
        for need in needs:
            for authorizer in self.authorizers:
                await authorizer.check(who, need.action, need.path, tree=need.tree)

    async def _decide(self, who: Principal, op: str, needs: Iterable[Need]) -> None:
        """Ask the authorizers about every need, recording a denial as ``op`` of the
        path that was refused."""
        for need in needs:
            try:
                await self._ask(who, [need])
            except (PermissionDenied, NotFound) as exc:
                self._record(who, op, need.path, "denied", detail=str(exc))
                raise

    async def authorize(self, who: Principal, op: str, action: Action, *targets: str) -> None:
        """Ask the authorizers about ``op`` on each target (recording a denial): for what
        is not a namespace call, such as volume administration over REST."""
        await self._decide(who, op, [Need(action, path) for path in targets])

    def _open_to(self, who: Principal, action: Action) -> bool:
        """Whether every authorizer lets ``who`` do ``action`` anywhere: resolution could
        change no answer then, and is skipped."""
        vouching = self.vouching
        return vouching is not None and all(
            a.subtree_open(who, action, paths.ROOT) for a in vouching
        )

    async def _names(self, who: Principal, action: Action, entry: Entry) -> list[Need]:
        """``action`` on each other name of ``entry``'s file: through any of them, it is
        the same bytes and attributes."""
        if entry.nlink < 2:
            return []
        return [Need(action, other) for other in await self.inner.other_names(entry)]

    async def _reading(self, who: Principal, op: str, path: str) -> tuple[Entry | None, list[Need]]:
        """Decide a read of ``path``: read on the name, then on what the name resolves to
        (a symlink's target) and on every other name of that file. Returns the entry
        whose bytes are read (None when the caller may read anything: nothing was
        resolved) and every need decided, for the stream to ask again."""
        needs = [Need(Action.READ, path)]
        await self._decide(who, op, needs)
        if self._open_to(who, Action.READ):
            return None, needs
        try:
            target, beyond = (await self._beyond_the_name(who, path))[1:]
        except LoomError as exc:
            self._record(who, op, path, exc.code, detail=str(exc))
            raise
        await self._decide(who, op, beyond)
        return target, needs + beyond

    async def _beyond_the_name(self, who: Principal, path: str) -> tuple[Entry, Entry, list[Need]]:
        """What a read of ``path`` needs besides read on the name: read on the target a
        symlink resolves to and on every other name of that file; with the entry at
        ``path`` and the target's."""
        entry, target = await self.inner.resolved(path)
        needs = await self._names(who, Action.READ, target)
        if target.path != entry.path:
            needs.insert(0, Need(Action.READ, target.path))
        return entry, target, needs

    async def _changing(
        self, who: Principal, op: str, path: str, action: Action, *, attrs: bool = False
    ) -> Entry | None:
        """Decide a change of the object at ``path`` (not resolved: a change of a symlink
        changes the link): ``action`` on it, on everything below a directory, and on the
        other names of a file whose content or attributes (``attrs``) it changes in
        place. Returns the entry at ``path``; None where there is none yet, or when the
        caller may do ``action`` anywhere (nothing was looked up)."""
        await self._decide(who, op, [Need(action, path)])
        if self._open_to(who, action):
            return None
        try:
            entry = (await self.inner.resolved(path))[0]
        except (NotFound, Conflict):
            return None  # made anew (or a symlink's target changing meanwhile: not followed)
        needs = [Need(action, path, tree=True)] if entry.is_dir else []
        if attrs or entry.kind is EntryKind.FILE:
            needs += await self._names(who, action, entry)
        await self._decide(who, op, needs)
        return entry

    async def _privileged(self, who: Principal, op: str, path: str, what: str) -> None:
        """Refuse ``what`` unless ``who`` may administer ``path`` (an admin right by name,
        never the open default), recording the refusal."""
        try:
            await self.authorize_admin(who, op, path)
        except PermissionDenied as exc:
            raise type(exc)(f"{what} at {path}: {exc}", path=path) from None

    async def authorize_admin(self, who: Principal, op: str, path: str) -> None:
        """Administration of ``path`` (volumes, settling): an explicit admin right, never
        the open default of the data rules (``AclAuthorizer.check_admin``); a denial is
        recorded. Without access rules to decide by, nobody administers."""
        try:
            if self.rules is None:
                raise PermissionDenied("this server keeps no access rules: nobody administers")
            await self.rules.check_admin(who, path)
        except PermissionDenied as exc:
            self._record(who, op, path, "denied", detail=str(exc))
            raise

    async def administered(
        self,
        who: Principal,
        op: str,
        path: str,
        call: Callable[[], Awaitable[T]],
        *,
        detail: str = "",
    ) -> T:
        """Administration that is not a namespace call (users, groups, rules, sites,
        policies over the admin API): an explicit admin right on ``path``, then the call,
        its outcome recorded; ``detail`` says what was done (never a secret). What it
        changed of users, groups and rules is in force for the next call."""
        await self.authorize_admin(who, op, path)
        try:
            return await self._run(who, op, path, call, detail=detail)
        finally:
            if self.rules is not None:
                await self.rules.catch_up()

    async def visible(self, who: Principal, path: str) -> bool:
        """Whether ``who`` may see ``path`` (listings and feeds leave the rest out)."""
        try:
            await self._ask(who, [Need(Action.LIST, path)])
        except (PermissionDenied, NotFound):
            return False
        return True

    async def visible_changes(self, who: Principal, changes: Sequence[Change]) -> list[Change]:
        """The changes of what ``who`` may see. A rename is shown by the names it may
        see: into a hidden name it is the old name's removal, out of one the new name's
        creation, so neither name leaks. A site's feed comes as it is: the hub redacted it
        for that site already, keeping its sequence gap-free (``PlacementAuthorizer``)."""
        if is_site(who):
            return list(changes)
        out: list[Change] = []
        for change in changes:
            shown: Change | None = change if await self.visible(who, change.path) else None
            if change.op is ChangeOp.RENAME and change.new_path is not None:
                arrived = await self.visible(who, change.new_path)
                if shown is not None and not arrived:
                    shown = replace(change, op=ChangeOp.DELETE, new_path=None)
                elif shown is None and arrived:
                    shown = replace(change, op=ChangeOp.CREATE, path=change.new_path, new_path=None)
            if shown is not None:
                out.append(shown)
        return out

    async def audited(
        self,
        who: Principal,
        op: str,
        action: Action,
        path: str,
        call: Callable[[], Awaitable[T]],
        *,
        detail: str = "",
        nbytes: Callable[[T], int] | None = None,
    ) -> T:
        """Govern a call that is not part of the namespace API (the fabric link's chunk
        maps and chunked commits) as the namespace's own calls are: decided on what it
        touches (a read as ``read`` resolves it), run, its outcome recorded."""
        if action is Action.READ:
            await self._reading(who, op, path)
        else:
            await self._changing(who, op, path, action)
        return await self._run(who, op, path, call, detail=detail, nbytes=nbytes)

    async def _run(
        self,
        who: Principal,
        op: str,
        path: str,
        call: Callable[[], Awaitable[T]],
        *,
        detail: str = "",
        nbytes: Callable[[T], int] | None = None,
    ) -> T:
        """Run a decided call and record its outcome."""
        try:
            result = await call()
        except LoomError as exc:
            self._record(who, op, path, exc.code, detail=str(exc))
            raise
        self._record(who, op, path, "ok", nbytes=nbytes(result) if nbytes else 0, detail=detail)
        return result

    async def _governed(
        self,
        who: Principal,
        op: str,
        action: Action,
        path: str,
        call: Callable[[], Awaitable[T]],
        *,
        detail: str = "",
        nbytes: Callable[[T], int] | None = None,
    ) -> T:
        """Decide ``op`` on ``path`` by its name alone (metadata calls), run, record."""
        await self._decide(who, op, [Need(action, path)])
        return await self._run(who, op, path, call, detail=detail, nbytes=nbytes)

    # -- the chunk service's gate (``hub.chunks.ChunkGate``) -------------------------------

    async def guarded(self, who: Principal) -> bool:
        """Whether some authorizer could refuse ``who`` the bytes of some file."""
        return not self._open_to(who, Action.READ)

    async def check_read(self, who: Principal, path: str) -> None:
        """Refuse ``who`` the bytes of ``path`` as a read of it would (through a symlink,
        the bytes are its target's; through a hard link, every name's)."""
        needs = (await self._beyond_the_name(who, path))[2]
        await self._ask(who, [Need(Action.READ, path), *needs])

    async def check_write(self, who: Principal, path: str) -> None:
        await self._ask(who, [Need(Action.WRITE, path)])

    async def other_names(self, entry: Entry) -> builtins.list[str]:
        """The other names of ``entry``'s file (hard links): for an edge that must give
        one file one identity (an NFS handle) whichever name reached it. Nothing is
        decided: the caller reveals no name, each is decided when it is looked up."""
        return await self.inner.other_names(entry)

    # -- the namespace API -----------------------------------------------------------------

    async def stat(self, who: Principal, path: str) -> Entry:
        return await self._governed(
            who, "stat", Action.LIST, path, lambda: self.inner.stat(who, path)
        )

    async def locate(self, who: Principal, entry_id: int) -> Entry:
        # where it is decides nothing; looking at it there is a stat, decided and audited
        return await self.stat(who, (await self.inner.locate(who, entry_id)).path)

    async def stat_for_read(self, who: Principal, path: str) -> Entry:
        # recorded as a stat: no byte moves, but the decision is the read's
        await self._reading(who, "stat", path)
        return await self._run(
            who, "stat", path, lambda: self.inner.stat_for_read(who, path), detail="for read"
        )

    def list(
        self, who: Principal, path: str, *, start_after: str | None = None, limit: int | None = None
    ) -> AsyncIterator[Entry]:
        return _Listing(self, who, path, start_after, limit)

    async def _filtered(
        self, who: Principal, entries: AsyncIterator[Entry]
    ) -> AsyncIterator[Entry]:
        async for entry in entries:
            if await self.visible(who, entry.path):
                yield entry

    async def read(
        self,
        who: Principal,
        path: str,
        offset: int = 0,
        length: int | None = None,
        *,
        if_version: int | None = None,
        key: sse.Sealing | None = None,
    ) -> Reader:
        """``key``: the customer's key of content encrypted with one (S3's SSE-C); content
        encrypted so is refused without it (``KeyRequired``), whatever the protocol."""
        target, needs = await self._reading(who, "read", path)
        if target is None:
            return await self._opened(
                who,
                path,
                lambda: self.inner.read(who, path, offset, length, if_version=if_version),
                needs,
                key,
            )
        if if_version is not None and target.version != if_version:
            conflict = Conflict(f"{path} is at version {target.version}, not {if_version}")
            self._record(who, "read", path, conflict.code, detail=str(conflict))
            raise conflict
        # the decided object itself is opened, by its own name: a link changed since is
        # not followed again
        return await self._opened(
            who, path, lambda: self.inner.read_entry(who, target, offset, length), needs, key
        )

    async def read_entry(
        self,
        who: Principal,
        entry: Entry,
        offset: int = 0,
        length: int | None = None,
        *,
        key: sse.Sealing | None = None,
    ) -> Reader:
        if entry.kind is EntryKind.SYMLINK:  # the bytes are its target's: read resolves
            return await self.read(who, entry.path, offset, length, key=key)
        needs = [Need(Action.READ, entry.path)]
        await self._decide(who, "read", needs)
        if not self._open_to(who, Action.READ):
            beyond = await self._names(who, Action.READ, entry)
            await self._decide(who, "read", beyond)
            needs += beyond
        return await self._opened(
            who,
            entry.path,
            lambda: self.inner.read_entry(who, entry, offset, length),
            needs,
            key,
        )

    async def _opened(
        self,
        who: Principal,
        path: str,
        open_: Callable[[], Awaitable[Reader]],
        needs: Sequence[Need],
        key: sse.Sealing | None,
    ) -> Reader:
        """Open a decided read, kept decided while it streams (``_GovernedReader``) and
        decrypted if its content is encrypted; its bytes are recorded when it is closed."""
        try:
            reader = await self._decrypted(who, await open_(), key, None)
        except LoomError as exc:
            self._record(who, "read", path, exc.code, detail=str(exc))
            raise
        done = None
        if self.audit is not None:
            done = partial(self._done_reading, who, path)
        return _GovernedReader(reader, partial(self._decide, who, "read", needs), done)

    async def _decrypted(
        self,
        who: Principal,
        reader: Reader,
        key: sse.Sealing | None,
        tags: Mapping[str, str] | None,
    ) -> Reader:
        """``reader`` as its content reads: decrypted with what its encryption tags (those
        of its version, ``tags`` or asked) unwrap, or refused (and closed)."""
        try:
            if tags is None:
                tags = await self._seal_tags(who, reader.entry)
            cipherer = sse.unseal(tags, self.keys, key, reader.entry.path)
        except BaseException:
            await reader.aclose()
            raise
        return reader if cipherer is None else sse.DecryptedReader(reader, cipherer)

    async def _seal_tags(self, who: Principal, entry: Entry) -> dict[str, str]:
        """The encryption tags of ``entry``'s content: they change only with its version,
        so those of a version are remembered (most files have none: an empty dict)."""
        hit = self._seals.get((entry.path, entry.version))
        if hit is not None:
            return hit
        now, tags = await self.inner.stat_tags(who, entry.path)
        if now.version != entry.version:
            raise Conflict(f"{entry.path} changed while it was opened", path=entry.path)
        sealed = {k: v for k, v in tags.items() if k.startswith(sse.PREFIX)}
        if len(self._seals) >= _SEALS_KEPT:
            self._seals.clear()
        self._seals[(entry.path, entry.version)] = sealed
        return sealed

    async def _default_sealing(self, who: Principal, path: str) -> sse.Sealing | None:
        """How a write to ``path`` that asks for no encryption is encrypted: as the
        nearest directory above it with a default says (S3's bucket default encryption).
        Each directory's own default is remembered; every ancestor of a remembered one
        is remembered too, so forgetting a tree (``_forget_defaults``) is one lookup."""
        chain: list[str] = []
        directory = paths.split(paths.normalize(path))[0]
        while directory not in self._defaults:
            chain.append(directory)
            if directory == paths.ROOT:
                break
            directory = paths.split(directory)[0]
        if len(self._defaults) + len(chain) > _SEALS_KEPT:
            self._defaults.clear()
        for missing in reversed(chain):  # the root first: ancestors are remembered first
            try:
                value = (await self.inner.get_tags(who, missing)).get(sse.DEFAULT_TAG)
            except NotFound:
                return None  # the write fails as it should; nothing to remember
            self._defaults[missing] = None if value is None else sse.Sealing.of_default(value)
        for directory in reversed(paths.ancestors(paths.normalize(path))):
            if (found := self._defaults.get(directory)) is not None:
                return found
        return None

    def _forget_defaults(self, *tops: str) -> None:
        """Forget the defaults remembered at and below ``tops`` (moved or removed)."""
        for top in map(paths.normalize, tops):
            if top in self._defaults:
                for directory in [d for d in self._defaults if paths.is_within(d, top)]:
                    del self._defaults[directory]

    def _done_reading(self, who: Principal, path: str, nbytes: int) -> None:
        self._record(who, "read", path, "ok", nbytes=nbytes)

    async def write(
        self,
        who: Principal,
        path: str,
        data: AsyncIterable[bytes],
        *,
        if_version: int | None = None,
        exclusive: bool = False,
        mode: int | None = None,
        write_id: str | None = None,
        tags: WriteTagsArg = None,
        sealing: sse.Sealing | None = None,
    ) -> Entry:
        """``sealing``: how the content is encrypted on its volume; None: as the nearest
        directory's default says, or not at all. Either way the tags of the content it
        replaces' encryption go with that content."""
        # the tags need no decision of their own: setting them is a write, as set_tags is
        if mode is not None and mode & SET_ID:
            await self._privileged(who, "write", path, "a set-user-ID or set-group-ID file")
        await self._changing(who, "write", path, Action.WRITE)
        body, sealed = await self._sealed(who, path, data, sealing)
        return await self._run(
            who, "write", path,
            lambda: self.inner.write(
                who, path, body, if_version=if_version, exclusive=exclusive, mode=mode,
                write_id=write_id, tags=lambda: sse.write_tags(tags_now(tags), sealed),
            ),
            nbytes=lambda entry: entry.size,
        )  # fmt: skip

    async def _sealed(
        self, who: Principal, path: str, data: AsyncIterable[bytes], sealing: sse.Sealing | None
    ) -> tuple[AsyncIterable[bytes], dict[str, str]]:
        """A write's body as its volume keeps it (encrypted as ``sealing`` or the nearest
        directory's default says, else as sent), and the encryption's tags for it."""
        chosen = sealing if sealing is not None else await self._default_sealing(who, path)
        if chosen is None:
            return data, {}
        try:
            cipherer, sealed = sse.seal(chosen, self.keys)
        except LoomError as exc:
            self._record(who, "write", path, exc.code, detail=str(exc))
            raise
        return cipherer.through(data), sealed

    def writes_attrs(self, path: str) -> bool:
        return self.inner.writes_attrs(path)

    async def write_with_attrs(
        self,
        who: Principal,
        path: str,
        data: AsyncIterable[bytes],
        *,
        if_version: int | None,
        attrs: Mapping[str, int],
        owner_optional: bool = False,
        tags: WriteTagsArg = None,
        exclusive: bool = False,
    ) -> Entry:
        # both decided before either is made, each recorded as its own call would be
        await self._changing(who, "write", path, Action.WRITE)
        try:
            await self._attrs_decided(who, path, attrs)
        except PermissionDenied:
            rest = without_owner(attrs)
            if not owner_optional or rest == attrs:
                raise
            attrs = rest
            await self._attrs_decided(who, path, attrs)
        # encrypted as a plain write would be, and rid of the old content's encryption
        body, sealed = await self._sealed(who, path, data, None)
        entry = await self._run(
            who, "write", path,
            lambda: self.inner.write_with_attrs(
                who, path, body, if_version=if_version, attrs=attrs, exclusive=exclusive,
                tags=lambda: sse.write_tags(tags_now(tags), sealed),
            ),
            nbytes=lambda entry: entry.size,
        )  # fmt: skip
        self._record(who, "set_attrs", path, "ok")
        return entry

    async def authorize_create(self, who: Principal, path: str, mode: int) -> None:
        # what ``write`` decides of a new name; nothing is there yet to resolve
        if mode & SET_ID:
            await self._privileged(who, "write", path, "a set-user-ID or set-group-ID file")
        await self._decide(who, "write", [Need(Action.WRITE, path)])

    async def mkdir(
        self, who: Principal, path: str, *, parents: bool = False, exist_ok: bool = False
    ) -> Entry:
        return await self._governed(
            who, "mkdir", Action.WRITE, path,
            lambda: self.inner.mkdir(who, path, parents=parents, exist_ok=exist_ok),
        )  # fmt: skip

    async def symlink(self, who: Principal, path: str, target: str) -> Entry:
        # the link is a name; reading through it is decided on what it resolves to
        return await self._governed(
            who, "symlink", Action.WRITE, path,
            lambda: self.inner.symlink(who, path, target), detail=f"-> {target}",
        )  # fmt: skip

    async def mknod(self, who: Principal, path: str, mode: int, rdev: int = 0) -> Entry:
        await self._privileged(who, "mknod", path, "a special file (device, FIFO, socket)")
        return await self._governed(
            who, "mknod", Action.WRITE, path,
            lambda: self.inner.mknod(who, path, mode, rdev), detail=f"mode {mode:o}",
        )  # fmt: skip

    async def link(self, who: Principal, src: str, dst: str) -> Entry:
        # write of the new name, and write (not only read) of the source and its other
        # names: all are one file, written in place through any, so a grant on the new
        # name would otherwise be a grant on the source (Linux's protected_hardlinks asks
        # the same)
        await self._changing(who, "link", src, Action.WRITE, attrs=True)
        await self._decide(who, "link", [Need(Action.WRITE, dst)])
        if any(k.startswith(sse.PREFIX) for k in await self.inner.get_tags(who, src)):
            # its encryption is tags of the name it was written by
            refused = NotSupported(f"{src} is encrypted: it has no second name", path=src)
            self._record(who, "link", src, refused.code, detail=str(refused))
            raise refused
        return await self._run(
            who, "link", src, lambda: self.inner.link(who, src, dst), detail=f"-> {dst}"
        )

    async def rename(self, who: Principal, src: str, dst: str, *, overwrite: bool = False) -> Entry:
        # out of a restricted path is an escape, into one a write of its data: both names,
        # and for a directory all that it holds, under both
        entry = await self._changing(who, "rename", src, Action.WRITE)
        tree = entry is not None and entry.is_dir
        await self._decide(who, "rename", [Need(Action.WRITE, dst, tree=tree)])
        self._forget_defaults(src, dst)
        return await self._run(
            who, "rename", src,
            lambda: self.inner.rename(who, src, dst, overwrite=overwrite), detail=f"-> {dst}",
        )  # fmt: skip

    async def remove(
        self, who: Principal, path: str, *, recursive: bool = False, if_version: int | None = None
    ) -> None:
        await self._changing(who, "remove", path, Action.WRITE)
        self._forget_defaults(path)
        await self._run(
            who, "remove", path,
            lambda: self.inner.remove(who, path, recursive=recursive, if_version=if_version),
        )  # fmt: skip

    async def set_attrs(
        self,
        who: Principal,
        path: str,
        *,
        mode: int | None = None,
        uid: int | None = None,
        gid: int | None = None,
        mtime_ns: int | None = None,
        atime_ns: int | None = None,
    ) -> Entry:
        attrs = {"mode": mode, "uid": uid, "gid": gid}
        await self._attrs_decided(who, path, {k: v for k, v in attrs.items() if v is not None})
        return await self._run(
            who, "set_attrs", path,
            lambda: self.inner.set_attrs(
                who, path, mode=mode, uid=uid, gid=gid, mtime_ns=mtime_ns, atime_ns=atime_ns
            ),
        )  # fmt: skip

    async def _attrs_decided(self, who: Principal, path: str, attrs: Mapping[str, int]) -> None:
        """Decide ``set_attrs(**attrs)``: a change of owner is an administrator's, a
        set-ID bit the file has not got needs admin by name; the rest is a write. (Keeping
        or clearing one is not giving it: a write by another than the owner clears the
        set-user-ID bit and keeps the set-group-ID one of a file its group can't run.)"""
        mode = attrs.get("mode")
        if mode is not None and mode & SET_ID and mode & SET_ID & ~await self._set_id(path):
            await self._privileged(who, "set_attrs", path, "a set-user-ID or set-group-ID bit")
        action = Action.ADMIN if "uid" in attrs or "gid" in attrs else Action.WRITE
        await self._changing(who, "set_attrs", path, action, attrs=True)

    async def _set_id(self, path: str) -> int:
        """The set-ID bits the file at ``path`` has now (none where there is no file)."""
        try:
            return (await self.inner.stat(SYSTEM, path)).mode & SET_ID
        except NotFound:
            return 0

    async def get_tags(self, who: Principal, path: str) -> dict[str, str]:
        return await self._governed(
            who, "get_tags", Action.LIST, path, lambda: self.inner.get_tags(who, path)
        )

    async def children_tags(self, who: Principal, path: str) -> dict[str, dict[str, str]] | None:
        # what the directory's listing shows (list): one decision and record for them all
        return await self._governed(
            who, "get_tags", Action.LIST, path, lambda: self.inner.children_tags(who, path)
        )

    async def stat_tags(self, who: Principal, path: str) -> tuple[Entry, dict[str, str]]:
        # both need list; one decision and one audit record (a stat) for the pair
        return await self._governed(
            who, "stat", Action.LIST, path, lambda: self.inner.stat_tags(who, path)
        )

    async def set_tags(
        self,
        who: Principal,
        path: str,
        set_: Mapping[str, str],
        remove: Sequence[str] = (),
    ) -> dict[str, str]:
        # a site the data may not reach may not untag it out of its policy either
        if any(k.startswith(sse.PREFIX) for k in [*set_, *remove]):
            refused = InvalidArgument(
                f"the {sse.PREFIX}* tags say how the content is encrypted: they are set "
                "by its writes (and a directory's default by set_default_sealing)",
                path=path,
            )
            self._record(who, "set_tags", path, refused.code, detail=str(refused))
            raise refused
        return await self._governed(
            who, "set_tags", Action.WRITE, path,
            lambda: self.inner.set_tags(who, path, set_, remove),
        )  # fmt: skip

    # -- versions: an old version is the path's content, decided and audited as a read ---

    async def set_versioning(self, who: Principal, path: str, state: str) -> None:
        await self._governed(
            who, "set_versioning", Action.WRITE, path,
            lambda: self.inner.set_versioning(who, path, state), detail=state,
        )  # fmt: skip

    async def versioning(self, who: Principal, path: str) -> str | None:
        return await self._governed(
            who, "versioning", Action.LIST, path, lambda: self.inner.versioning(who, path)
        )

    async def versions(self, who: Principal, path: str) -> builtins.list[Version]:
        found = await self._governed(
            who, "versions", Action.LIST, path, lambda: self.inner.versions(who, path)
        )
        return [v for v in found if await self.visible(who, v.path)]

    async def read_version(
        self,
        who: Principal,
        path: str,
        vid: str,
        offset: int = 0,
        length: int | None = None,
        *,
        key: sse.Sealing | None = None,
    ) -> Reader:
        async def open_() -> Reader:
            reader = await self.inner.read_version(who, path, vid, offset, length)
            try:  # the version's own encryption tags, kept with it
                name = paths.normalize(path)
                found = [v for v in await self.inner.versions(who, name) if v.path == name]
                tags = next((v.tags for v in found if v.vid == vid), {})
            except BaseException:
                await reader.aclose()
                raise
            return await self._decrypted(who, reader, key, tags)

        return await self._governed(
            who, "read_version", Action.READ, path, open_,
            detail=vid, nbytes=lambda reader: reader.length,
        )  # fmt: skip

    async def check_key(self, who: Principal, entry: Entry, key: sse.Sealing | None) -> None:
        """Refuse ``key`` as a read of file ``entry``'s content with it would be (an edge
        that describes the content without reading it: S3's GetObjectAttributes)."""
        sse.unseal(await self._seal_tags(who, entry), self.keys, key, entry.path)

    async def encrypted(self, who: Principal, entry: Entry) -> bool:
        """Whether the content of file ``entry`` (at its version) is stored encrypted:
        what cuts a volume's bytes into chunks must not hand those out as the content."""
        if entry.kind is not EntryKind.FILE:
            return False
        return bool(await self._seal_tags(who, entry))

    async def sealing_for(self, who: Principal, path: str) -> sse.Sealing | None:
        """How a write to ``path`` that asks for no encryption is encrypted (its
        directories' default; None: not at all), for an edge that answers how."""
        return await self._default_sealing(who, path)

    async def default_sealing(self, who: Principal, path: str) -> sse.Sealing | None:
        """Directory ``path``'s own default encryption (S3's GetBucketEncryption)."""
        tags = await self.get_tags(who, path)
        value = tags.get(sse.DEFAULT_TAG)
        return None if value is None else sse.Sealing.of_default(value)

    async def set_default_sealing(
        self, who: Principal, path: str, sealing: sse.Sealing | None
    ) -> None:
        """Make ``sealing`` how files written below directory ``path`` that ask for no
        encryption are encrypted (None: not at all); a KMS key must exist."""
        if sealing is not None:
            value = sealing.as_default()
            if sealing.kind is not sse.Kind.CUSTOMER and sealing.key_id is not None:
                if self.keys is None:
                    raise NotSupported("this site keeps no encryption keys", path=path)
                self.keys.key(sealing.kind, sealing.key_id)

        async def change() -> None:
            if sealing is None:
                await self.inner.set_tags(who, path, {}, [sse.DEFAULT_TAG])
            else:
                await self.inner.set_tags(who, path, {sse.DEFAULT_TAG: value})
            self._forget_defaults(path)

        await self._governed(
            who, "set_default_sealing", Action.WRITE, path, change,
            detail="none" if sealing is None else value,
        )  # fmt: skip

    async def remove_version(
        self, who: Principal, path: str, vid: str, *, bypass: bool = False
    ) -> Version | None:
        if bypass:  # past a retention: its administrator's (S3's BypassGovernanceRetention)
            await self.authorize_admin(who, "bypass_retention", path)
        return await self._governed(
            who, "remove_version", Action.WRITE, path,
            lambda: self.inner.remove_version(who, path, vid, bypass=bypass),
            detail=vid + (" bypassing governance" if bypass else ""),
        )  # fmt: skip

    async def mark_removed(self, who: Principal, path: str) -> str | None:
        return await self._governed(
            who, "mark_removed", Action.WRITE, path, lambda: self.inner.mark_removed(who, path)
        )

    async def set_lock(
        self, who: Principal, path: str, vid: str | None, lock: Lock, *, bypass: bool = False
    ) -> None:
        if bypass:
            await self.authorize_admin(who, "bypass_retention", path)
        await self._governed(
            who, "set_lock", Action.WRITE, path,
            lambda: self.inner.set_lock(who, path, vid, lock, bypass=bypass),
            detail=f"{vid or 'current'}: {lock}" + (" bypassing governance" if bypass else ""),
        )  # fmt: skip

    async def lease_write(self, who: Principal, path: str) -> float:
        # a site that may not write the path may not hold others off it either
        return await self._governed(
            who, "lease_write", Action.WRITE, path, lambda: self.inner.lease_write(who, path)
        )

    async def release_write(self, who: Principal, path: str) -> None:
        await self._governed(
            who, "release_write", Action.WRITE, path, lambda: self.inner.release_write(who, path)
        )

    async def persist(self, who: Principal, path: str) -> None:
        # neither authorized nor audited: it changes nothing, and the caller holds the
        # file open already
        await self.inner.persist(who, path)

    # -- access rules ---------------------------------------------------------------------

    def _rules(self) -> AclAuthorizer:
        if self.rules is None:
            raise NotSupported("this namespace keeps no access rules")
        return self.rules

    async def access(self, who: Principal, path: str) -> tuple[frozenset[tuple[str, Action]], bool]:
        """The rules on ``path`` itself, as (subject, permission), and whether it is private."""
        rules = self._rules()
        return await self.administered(who, "get_access", path, lambda: rules.rules_at(path))

    async def set_access(
        self,
        who: Principal,
        path: str,
        grants: Iterable[tuple[str, Action]],
        *,
        private: bool | None = None,
    ) -> None:
        """Make ``grants`` the rules on ``path`` itself (those above and below it stay)."""
        rules, wanted = self._rules(), frozenset(grants)

        async def change() -> None:
            now, marked = await rules.rules_at(path)
            await rules.check_public(path, {s for s, _ in wanted - now}, "acl")
            if now != wanted or (private is not None and private != marked):
                await rules.store.replace(path, wanted, private=private)
                await rules.reload()

        detail = ", ".join(sorted(f"{s} {a.value}" for s, a in wanted))
        await self.administered(who, "set_access", path, change, detail=detail)

    async def bucket_policy(self, who: Principal, path: str) -> str | None:
        """The document of the bucket policy on ``path`` (None: none); an admin's to read."""
        rules = self._rules()
        return await self.administered(who, "get_policy", path, lambda: rules.store.policy(path))

    async def bucket_public(self, who: Principal, path: str) -> bool:
        """Whether a rule at or below ``path`` (an ACL's or a policy's) grants anything to
        everyone or to every authenticated caller; an admin's to ask."""
        rules = self._rules()
        return await self.administered(
            who, "get_policy_status", path, lambda: rules.public_within(path)
        )

    async def set_bucket_policy(
        self, who: Principal, path: str, document: str | None, made: Iterable[PolicyRule] = ()
    ) -> None:
        """Make ``document`` (None: none) and the rules it translates to the policy on
        ``path``, replacing the previous one whole."""
        rules, made = self._rules(), tuple(made)

        async def change() -> None:
            allowed = {r.subject for r in made if not r.deny and r.bits}
            await rules.check_public(path, allowed, "policy")
            await rules.store.set_policy(path, document, made)
            await rules.reload()

        detail = "removed" if document is None else f"{len(made)} rules: {document}"
        op = "delete_policy" if document is None else "set_policy"
        await self.administered(who, op, path, change, detail=detail[:4096])

    async def public_block(self, who: Principal, path: str) -> PublicBlock | None:
        """The public access block set on ``path`` (None: none); an admin's to read."""
        rules = self._rules()
        return await self.administered(
            who, "get_public_block", path, lambda: rules.public_block(path)
        )

    async def set_public_block(self, who: Principal, path: str, block: PublicBlock | None) -> None:
        """Make ``block`` (None: none) the public access block on ``path`` and below."""
        rules = self._rules()

        async def change() -> None:
            await rules.store.set_public_block(path, block)
            await rules.reload()

        op = "delete_public_block" if block is None else "set_public_block"
        await self.administered(who, op, path, change, detail=str(block or ""))

    async def check_public_grants(
        self, path: str, subjects: Iterable[str], what: str = "acl"
    ) -> None:
        """PermissionDenied if the public access block binding ``path`` refuses ``what``
        ("acl" rules, a "policy") granting to ``subjects`` (asked before a write that would
        set them, so that the write is not done, or before a policy is translated)."""
        await self._rules().check_public(path, subjects, what)

    async def mkdir_owned(self, who: Principal, path: str) -> Entry:
        """Make the directory ``path`` (write needed, as for mkdir) private to its maker,
        who gets admin on it; the anonymous caller can own nothing. That the path is
        taken is told to anyone (AlreadyExists): owned directories are names everyone
        competes for, as S3's buckets are."""
        rules = self._rules()
        if await self.inner.exists(who, path):
            self._record(who, "mkdir_owned", path, AlreadyExists.code)
            raise AlreadyExists(f"{path} exists", path=path)

        async def make() -> Entry:
            if who.user == ANONYMOUS:
                raise PermissionDenied("the anonymous caller can own nothing", path=path)
            entry = await self.inner.mkdir(who, path)
            if await rules.rules_within(path):  # left by an earlier one of that name
                await rules.store.forget(path)
            await rules.store.replace(path, [(f"user:{who.user}", Action.ADMIN)], private=True)
            await rules.reload()
            return entry

        return await self._governed(who, "mkdir_owned", Action.WRITE, path, make)

    async def forget_access(self, who: Principal, path: str) -> None:
        """Drop the rules and private marks at and below ``path``, which must be gone:
        whoever may make it anew may clear what is left of the old one's rules."""
        rules = self._rules()
        if not await rules.rules_within(path):
            return  # the common case (every S3 delete asks): nothing to change, nothing to record

        async def forget() -> None:
            if await self.inner.exists(who, path):
                raise AlreadyExists(f"{path} exists: its rules are changed with set_access")
            await rules.store.forget(path)
            await rules.reload()

        await self._governed(who, "forget_access", Action.WRITE, path, forget)

    async def changes(
        self, since: int = 0, limit: int = 1000, *, wait: float = 0.0, ack: int = 0
    ) -> Feed:
        # the feed belongs to the fabric link (spokes are authenticated sites), not to a
        # user's call; a hub serves it from its catalog, not through the namespace
        if not isinstance(self.inner, FeedNamespace):
            raise NotSupported("this namespace has no change feed; spokes follow the hub's")
        return await self.inner.changes(since, limit, wait=wait, ack=ack)

    async def close(self) -> None:
        await self.inner.close()
