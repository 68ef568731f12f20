"""Governance in one place (namespace layer): every namespace call of every protocol is
authorized here and then recorded for audit.

``GovernedNamespace`` wraps the hub's namespace. Each call first asks a chain of
authorizers (ACL rules, residency and placement policies) and then records one audit
event with the outcome; a denial is recorded as ``denied`` and raised unchanged. The REST
API, the S3 gateway, the fabric link to spokes, in-process FUSE mounts and SFTP get the
wrapped namespace, so no protocol module makes an authorization decision of its own;
volume administration and the hub's own machinery keep the inner one.

Which action a call needs: stat, list, get_tags and stat_tags need list (metadata), read
and read_entry need read (content); write, mkdir, symlink, mknod, remove, set_attrs (mode,
mtime, atime), set_tags and taking or giving up a write lease need write; a rename needs
write on both paths, and so does a hard link (writes through the new name change the
source in place); changing a file's owner (uid, gid) needs admin. What is not a namespace
call but hands out a path's content (the fabric link's chunk maps) goes through
``audited`` with the action it needs. A read is recorded when its reader is closed, with
the bytes it delivered; a listing when its first entry, its end or its error arrives (a
failure later in a long listing is not recorded).

Where the site keeps ACL rules (``rules``), the access rules of a path are part of this
API too, for protocols that let their clients set them (S3 ACLs): ``access`` and
``set_access`` read and replace the rules on one path (admin needed), ``mkdir_owned``
makes a directory private to its creator, and ``forget_access`` drops the rules left on
a path that is gone (write needed, as for making it anew).
"""

from __future__ import annotations

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
from typing import Protocol, TypeVar, runtime_checkable

from ..core.acl import ANONYMOUS, AclAuthorizer
from ..core.audit import AuditSink
from ..core.types import Action, Entry, Feed, Principal
from ..errors import AlreadyExists, LoomError, NotFound, NotSupported, PermissionDenied
from .base import FeedNamespace, Namespace, Reader

T = TypeVar("T")


class Authorizer(Protocol):
    async def check(self, who: Principal, action: Action, path: str) -> None:
        """Return if allowed; raise ``PermissionDenied``, or ``NotFound`` where the path
        must look absent to this caller."""


@runtime_checkable
class SubtreeAuthorizer(Protocol):
    """An optional ability: a cheap, synchronous answer to "is everything below this path
    allowed?", so that listing an open directory costs no check per child."""

    def subtree_open(self, who: Principal, action: Action, path: str) -> bool: ...


class _AuditedReader(Reader):
    """A reader that records its read when closed, with the bytes it handed out: those
    streamed, or its whole range when the consumer took the local file region instead."""

    def __init__(self, reader: Reader, done: Callable[[int], None]) -> None:
        super().__init__(reader.entry, reader.offset, reader)
        self._done: Callable[[int], None] | None = done
        self._sent = 0
        self._streamed = False

    async def chunks(self) -> AsyncIterator[bytes]:
        self._streamed = True
        async for chunk in self.source.chunks():
            self._sent += len(chunk)
            yield chunk

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
        inner: Namespace,
        authorizers: Sequence[Authorizer],
        *,
        audit: AuditSink | None = None,
        rules: AclAuthorizer | None = None,
    ) -> None:
        self.inner = inner
        self.authorizers = list(authorizers)
        self.audit = audit
        #: where the access rules of paths are kept (and decided by one of the authorizers)
        self.rules = rules
        # the authorizers, when every one can vouch for a subtree (a protocol isinstance
        # check is slow: it is made once, here)
        subtree = [a for a in self.authorizers if isinstance(a, SubtreeAuthorizer)]
        self.vouching = subtree if len(subtree) == len(self.authorizers) else None

    # -- the two steps of every call -------------------------------------------------------

    def _record(
        self, who: Principal, op: str, path: str, result: str, *, nbytes: int = 0, detail: str = ""
    ) -> None:
        if self.audit is not None:
            self.audit.record(who, op, path, result, nbytes=nbytes, detail=detail)

    async def authorize(self, who: Principal, op: str, action: Action, *targets: str) -> None:
        """Ask the authorizers about ``op`` on each target (recording a denial): for what
        is not a namespace call, such as volume administration over REST."""
        for path in targets:
            try:
                for authorizer in self.authorizers:
                    await authorizer.check(who, action, path)
            except (PermissionDenied, NotFound) as exc:
                self._record(who, op, path, "denied", detail=str(exc))
                raise

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

    async def visible(self, who: Principal, path: str) -> bool:
        """Whether ``who`` may see ``path`` (listings and feeds leave the rest out)."""
        try:
            for authorizer in self.authorizers:
                await authorizer.check(who, Action.LIST, path)
        except (PermissionDenied, NotFound):
            return False
        return True

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
        maps and chunked commits) as the namespace's own calls are: authorized, run, its
        outcome recorded."""
        return await self._governed(who, op, action, path, call, detail=detail, nbytes=nbytes)

    async def _governed(
        self,
        who: Principal,
        op: str,
        action: Action,
        path: str,
        call: Callable[[], Awaitable[T]],
        *,
        also: str | None = None,
        detail: str = "",
        nbytes: Callable[[T], int] | None = None,
    ) -> T:
        """Authorize ``op`` on ``path`` (and ``also``), run it, record the outcome."""
        await self.authorize(who, op, action, path, *([also] if also else []))
        try:
            result = await call()
        except LoomError as exc:
            self._record(who, op, path, exc.code, detail=str(exc))
            raise
        self._record(who, op, path, "ok", nbytes=nbytes(result) if nbytes else 0, detail=detail)
        return result

    # -- the namespace API -----------------------------------------------------------------

    async def stat(self, who: Principal, path: str) -> Entry:
        return await self._governed(
            who, "stat", Action.LIST, path, lambda: self.inner.stat(who, path)
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
    ) -> Reader:
        return await self._read(
            who, path, lambda: self.inner.read(who, path, offset, length, if_version=if_version)
        )

    async def read_entry(
        self, who: Principal, entry: Entry, offset: int = 0, length: int | None = None
    ) -> Reader:
        return await self._read(
            who, entry.path, lambda: self.inner.read_entry(who, entry, offset, length)
        )

    async def _read(
        self, who: Principal, path: str, open_: Callable[[], Awaitable[Reader]]
    ) -> Reader:
        await self.authorize(who, "read", Action.READ, path)
        try:
            reader = await open_()
        except LoomError as exc:
            self._record(who, "read", path, exc.code, detail=str(exc))
            raise
        if self.audit is None:
            return reader
        return _AuditedReader(reader, lambda n: self._record(who, "read", path, "ok", nbytes=n))

    async def write(
        self,
        who: Principal,
        path: str,
        data: AsyncIterable[bytes],
        *,
        if_version: int | None = None,
        exclusive: bool = False,
        mode: int | None = None,
    ) -> Entry:
        return await self._governed(
            who, "write", Action.WRITE, path,
            lambda: self.inner.write(
                who, path, data, if_version=if_version, exclusive=exclusive, mode=mode
            ),
            nbytes=lambda entry: entry.size,
        )  # fmt: skip

    async def mkdir(
        self, who: Principal, path: str, *, parents: bool = False, exist_ok: bool = False
    ) -> Entry:
        return await self._governed(
            who, "mkdir", Action.WRITE, path,
            lambda: self.inner.mkdir(who, path, parents=parents, exist_ok=exist_ok),
        )  # fmt: skip

    async def symlink(self, who: Principal, path: str, target: str) -> Entry:
        return await self._governed(
            who, "symlink", Action.WRITE, path,
            lambda: self.inner.symlink(who, path, target), detail=f"-> {target}",
        )  # fmt: skip

    async def mknod(self, who: Principal, path: str, mode: int, rdev: int = 0) -> Entry:
        return await self._governed(
            who, "mknod", Action.WRITE, path,
            lambda: self.inner.mknod(who, path, mode, rdev), detail=f"mode {mode:o}",
        )  # fmt: skip

    async def link(self, who: Principal, src: str, dst: str) -> Entry:
        # write of the new name, and write (not only read) of the source: both names are
        # one file, written in place through either, so a grant on the new name would
        # otherwise be a grant on the source (Linux's protected_hardlinks asks the same)
        return await self._governed(
            who, "link", Action.WRITE, src,
            lambda: self.inner.link(who, src, dst), also=dst, detail=f"-> {dst}",
        )  # fmt: skip

    async def rename(self, who: Principal, src: str, dst: str, *, overwrite: bool = False) -> Entry:
        return await self._governed(
            who, "rename", Action.WRITE, src,
            lambda: self.inner.rename(who, src, dst, overwrite=overwrite),
            also=dst, detail=f"-> {dst}",
        )  # fmt: skip

    async def remove(
        self, who: Principal, path: str, *, recursive: bool = False, if_version: int | None = None
    ) -> None:
        await self._governed(
            who, "remove", Action.WRITE, path,
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
        chown = uid is not None or gid is not None
        return await self._governed(
            who, "set_attrs", Action.ADMIN if chown else Action.WRITE, path,
            lambda: self.inner.set_attrs(
                who, path, mode=mode, uid=uid, gid=gid, mtime_ns=mtime_ns, atime_ns=atime_ns
            ),
        )  # fmt: skip

    async def get_tags(self, who: Principal, path: str) -> dict[str, str]:
        return await self._governed(
            who, "get_tags", Action.LIST, path, lambda: self.inner.get_tags(who, path)
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
        return await self._governed(
            who, "set_tags", Action.WRITE, path,
            lambda: self.inner.set_tags(who, path, set_, remove),
        )  # fmt: skip

    async def lease_write(self, who: Principal, path: str) -> float:
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
        return await self._governed(
            who, "get_access", Action.ADMIN, path, lambda: rules.rules_at(path)
        )

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
            if now != wanted or (private is not None and private != marked):
                await rules.store.replace(path, wanted, private=private)
                await rules.reload()

        detail = ", ".join(sorted(f"{s} {a.value}" for s, a in wanted))
        await self._governed(who, "set_access", Action.ADMIN, path, change, detail=detail)

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
