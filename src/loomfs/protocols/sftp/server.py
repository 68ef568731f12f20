"""The SFTP server (protocol layer): SSH public-key logins, SFTP requests as namespace calls.

A user logs in with an SSH key registered with ``loomfs user add --ssh-key``; password and
keyboard-interactive logins are not offered, and the login name must be the key's owner.
The session then runs as that user's ``Principal`` (protocol "sftp"), so whatever the
namespace decides for that user (authorization, audit) holds here as for every protocol.

Each user sees one namespace directory as '/' (``[sftp] root``, '/' by default, with
'{user}' for per-user homes). Client paths are resolved against it the way a chroot does:
'..' stops at '/', and absolute paths start there, so no spelling reaches above it; the
namespace itself refuses anything that is not a canonical path. Symlinks made over SFTP
are stored relative to the link, so they stay inside the namespace; ``stat`` follows
relative links within the user's root.
"""

from __future__ import annotations

import base64
import logging
import os
import posixpath
import stat as stat_mod
from collections.abc import AsyncIterator
from pathlib import Path

import asyncssh
from prometheus_client import Counter

from ... import paths
from ...core.types import KIND_BITS, Entry, EntryKind, Principal
from ...core.users import UserRegistry
from ...errors import (
    AlreadyExists,
    InvalidArgument,
    InvalidPath,
    IsADirectory,
    LoomError,
    NotADirectory,
    NotFound,
)
from ...namespace.base import Namespace
from .errors import to_sftp, translated
from .files import ReadHandle, WriteHandle

log = logging.getLogger(__name__)

LOGINS = Counter("loomfs_sftp_logins_total", "SFTP login attempts", ["result"])
HOST_KEY_FILE = "ssh_host_ed25519_key"
MAX_LINK_HOPS = 40  # as Linux's MAXSYMLINKS
PRINCIPAL = "loomfs_principal"  # the connection's extra info key for the logged-in user

_KIND_TYPE = {
    EntryKind.FILE: asyncssh.FILEXFER_TYPE_REGULAR,
    EntryKind.DIR: asyncssh.FILEXFER_TYPE_DIRECTORY,
    EntryKind.SYMLINK: asyncssh.FILEXFER_TYPE_SYMLINK,
    EntryKind.FIFO: asyncssh.FILEXFER_TYPE_FIFO,
    EntryKind.CHAR_DEVICE: asyncssh.FILEXFER_TYPE_CHAR_DEVICE,
    EntryKind.BLOCK_DEVICE: asyncssh.FILEXFER_TYPE_BLOCK_DEVICE,
    EntryKind.SOCKET: asyncssh.FILEXFER_TYPE_SOCKET,
}


def attrs_of(entry: Entry, size: int | None = None) -> asyncssh.SFTPAttrs:
    filetype, ifmt = _KIND_TYPE[entry.kind], KIND_BITS[entry.kind]
    seconds, nanos = divmod(entry.mtime_ns, 1_000_000_000)
    return asyncssh.SFTPAttrs(
        type=filetype,
        size=entry.size if size is None else size,
        uid=entry.uid,
        gid=entry.gid,
        permissions=ifmt | (entry.mode & 0o7777),
        atime=seconds,
        atime_ns=nanos,
        mtime=seconds,
        mtime_ns=nanos,
        nlink=1,
    )


def load_host_key(path: Path) -> asyncssh.SSHKey:
    """The server's host key; generated (ed25519, mode 0600) when the file is missing."""
    try:
        return asyncssh.read_private_key(path)
    except FileNotFoundError:
        pass
    except (OSError, asyncssh.KeyImportError) as exc:
        raise InvalidArgument(f"cannot read the SSH host key {path}: {exc}") from exc
    key = asyncssh.generate_private_key("ssh-ed25519", comment="loomfs host key")
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    # O_EXCL: two servers starting at once must not each write half a key
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(key.export_private_key("openssh"))
    path.with_name(path.name + ".pub").write_bytes(key.export_public_key("openssh"))
    log.info("generated an SSH host key", extra={"path": str(path)})
    return key


class KeyAuth(asyncssh.SSHServer):
    """One SSH connection's login: public keys from the user registry, nothing else."""

    def __init__(self, users: UserRegistry, site: str) -> None:
        self.users = users
        self.site = site
        self.conn: asyncssh.SSHServerConnection | None = None

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self.conn = conn

    def begin_auth(self, username: str) -> bool:
        return True  # every login must authenticate

    def password_auth_supported(self) -> bool:
        return False

    def kbdint_auth_supported(self) -> bool:
        return False

    def public_key_auth_supported(self) -> bool:
        return True

    async def validate_public_key(self, username: str, key: asyncssh.SSHKey) -> bool:
        # asyncssh calls this for a key offered without a signature too, and checks the
        # signature itself before the login succeeds
        data = base64.b64encode(key.public_data).decode()
        user = await self.users.lookup_ssh_key(key.get_algorithm(), data)
        if user is None or user.name != username:
            LOGINS.labels("refused").inc()
            log.warning(
                "sftp key refused",
                extra={"user": username, "key_type": key.get_algorithm(), "known": bool(user)},
            )
            return False
        assert self.conn is not None
        self.conn.set_extra_info(**{PRINCIPAL: user.principal("sftp", self.site)})
        LOGINS.labels("accepted").inc()
        return True


class Session(asyncssh.SFTPServer):
    """One SFTP session: every request is one or a few namespace calls as ``who``."""

    def __init__(
        self,
        chan: asyncssh.SSHServerChannel[bytes],
        ns: Namespace,
        who: Principal,
        root: str,
        spool: Path,
        umask: int = 0o022,
    ) -> None:
        super().__init__(chan)
        self.ns = ns
        self.who = who
        self.root = root
        self.spool = spool
        self.umask = umask

    def _created(self, attrs: asyncssh.SFTPAttrs, implied: int) -> int:
        """The mode of something a client creates: what it sent (or ``implied``), less
        the umask."""
        sent = implied if attrs.permissions is None else attrs.permissions & 0o7777
        return sent & ~self.umask

    # -- paths -----------------------------------------------------------------------------

    def _path(self, path: bytes) -> str:
        """The namespace path of a client path, confined to the user's root."""
        try:
            text = path.decode()
        except UnicodeDecodeError:
            raise InvalidPath(f"path is not valid UTF-8: {path!r}") from None
        # relative paths start at the root too (it is the session's working directory);
        # normpath of '/' + path drops '..' at the top, and the namespace checks the rest
        inside = posixpath.normpath("/" + text.lstrip("/"))
        return paths.normalize(paths.join(self.root, inside.lstrip("/")))

    def _client(self, path: str) -> bytes:
        return ("/" + paths.relative(path, self.root)).encode()

    async def _follow(self, path: str) -> Entry:
        """``stat`` of ``path`` through symlinks, each resolved within the user's root."""
        entry = await self.ns.stat(self.who, path)
        for _ in range(MAX_LINK_HOPS):
            if entry.kind is not EntryKind.SYMLINK:
                return entry
            target = entry.link_target or ""
            if target.startswith("/"):
                # an absolute target names a place outside loomfs (another tool made it)
                raise NotFound(f"symlink points outside the namespace: {target}", path=path)
            parent = self._client(paths.split(entry.path)[0]).decode()
            path = self._path(posixpath.join(parent, target).encode())
            entry = await self.ns.stat(self.who, path)
        raise InvalidPath(f"too many levels of symlinks: {path}", path=path)

    # -- files -----------------------------------------------------------------------------

    @translated
    async def open(self, path: bytes, pflags: int, attrs: asyncssh.SFTPAttrs) -> object:
        target = self._path(path)
        writing = bool(pflags & (asyncssh.FXF_WRITE | asyncssh.FXF_APPEND))
        try:
            existing: Entry | None = await self._follow(target)
        except NotFound:
            existing = None
        if existing is not None and existing.is_dir:
            raise IsADirectory(f"is a directory: {target}", path=target)
        if not writing:
            if existing is None:
                raise NotFound(f"no such file: {target}", path=target)
            return ReadHandle(self.ns, self.who, existing)
        if existing is None and not pflags & asyncssh.FXF_CREAT:
            raise NotFound(f"no such file: {target}", path=target)
        if existing is None and not (await self.ns.stat(self.who, paths.split(target)[0])).is_dir:
            # refused at open, as a local file system does, not only when the commit fails
            raise NotADirectory(f"not a directory: {paths.split(target)[0]}", path=target)
        if existing is not None and pflags & asyncssh.FXF_EXCL:
            raise AlreadyExists(f"already exists: {target}", path=target)
        return await WriteHandle.open(
            self.ns,
            self.who,
            existing.path if existing is not None else target,
            self.spool,
            existing=existing,
            truncate=bool(pflags & asyncssh.FXF_TRUNC),
            exclusive=bool(pflags & asyncssh.FXF_EXCL),
            append=bool(pflags & asyncssh.FXF_APPEND),
            mode=self._created(attrs, 0o666) if existing is None else None,
        )

    @translated
    async def read(self, file_obj: object, offset: int, size: int) -> bytes:
        assert isinstance(file_obj, ReadHandle | WriteHandle)
        return await file_obj.read(offset, size)

    @translated
    async def write(self, file_obj: object, offset: int, data: bytes) -> int:
        if not isinstance(file_obj, WriteHandle):
            raise asyncssh.SFTPPermissionDenied("the file is open for reading only")
        return await file_obj.write(offset, data)

    @translated
    async def close(self, file_obj: object) -> None:
        assert isinstance(file_obj, ReadHandle | WriteHandle)
        if isinstance(file_obj, WriteHandle) and self.channel.is_closing():
            # asyncssh closes what a vanished client left open: an upload cut short is
            # dropped, not committed half-written
            await file_obj.discard()
            log.warning("sftp upload abandoned", extra={"path": file_obj.path})
            return
        await file_obj.close()

    @translated
    async def fstat(self, file_obj: object) -> asyncssh.SFTPAttrs:
        if isinstance(file_obj, ReadHandle):
            return attrs_of(file_obj.entry)
        assert isinstance(file_obj, WriteHandle)
        if file_obj.base is not None:
            return attrs_of(file_obj.base, file_obj.size())
        return asyncssh.SFTPAttrs(
            type=asyncssh.FILEXFER_TYPE_REGULAR,
            size=file_obj.size(),
            permissions=stat_mod.S_IFREG | (file_obj.mode or 0o644),
        )

    @translated
    async def fsetstat(self, file_obj: object, attrs: asyncssh.SFTPAttrs) -> None:
        if not isinstance(file_obj, WriteHandle):
            assert isinstance(file_obj, ReadHandle)
            await self._setstat(file_obj.entry.path, attrs)
            return
        # applied on close, after the content they belong to is committed
        if attrs.size is not None:
            await file_obj.truncate(attrs.size)
        pending = file_obj.pending
        if attrs.permissions is not None:
            pending.mode = attrs.permissions & 0o7777
        if attrs.uid is not None:
            pending.uid, pending.gid = attrs.uid, attrs.gid
        if attrs.mtime is not None:
            pending.mtime_ns = _mtime_ns(attrs)

    # -- metadata --------------------------------------------------------------------------

    @translated
    async def stat(self, path: bytes) -> asyncssh.SFTPAttrs:
        return attrs_of(await self._follow(self._path(path)))

    @translated
    async def lstat(self, path: bytes) -> asyncssh.SFTPAttrs:
        return attrs_of(await self.ns.stat(self.who, self._path(path)))

    @translated
    async def setstat(self, path: bytes, attrs: asyncssh.SFTPAttrs) -> None:
        await self._setstat((await self._follow(self._path(path))).path, attrs)

    async def _setstat(self, path: str, attrs: asyncssh.SFTPAttrs) -> None:
        if attrs.size is not None:
            await self._truncate(path, attrs.size)
        mode = attrs.permissions & 0o7777 if attrs.permissions is not None else None
        mtime_ns = _mtime_ns(attrs) if attrs.mtime is not None else None
        if (mode, attrs.uid, attrs.gid, mtime_ns) != (None, None, None, None):
            await self.ns.set_attrs(
                self.who, path, mode=mode, uid=attrs.uid, gid=attrs.gid, mtime_ns=mtime_ns
            )

    async def _truncate(self, path: str, size: int) -> None:
        """Set a file's length through a handle's spool: one namespace write, as a close."""
        entry = await self.ns.stat(self.who, path)
        if entry.is_dir:
            raise IsADirectory(f"is a directory: {path}", path=path)
        if entry.size == size:
            return
        handle = await WriteHandle.open(
            self.ns, self.who, path, self.spool, existing=entry, truncate=False,
            exclusive=False, append=False, mode=None,
        )  # fmt: skip
        await handle.truncate(size)
        await handle.close()

    @translated
    async def realpath(self, path: bytes) -> bytes:
        return self._client(self._path(path))

    @translated
    async def readlink(self, path: bytes) -> bytes:
        entry = await self.ns.stat(self.who, self._path(path))
        if entry.kind is not EntryKind.SYMLINK or entry.link_target is None:
            raise InvalidArgument(f"not a symlink: {entry.path}", path=entry.path)
        return entry.link_target.encode()

    @translated
    async def symlink(self, oldpath: bytes, newpath: bytes) -> None:
        link = self._path(newpath)
        # stored relative to the link's directory, so it names the same file over every
        # protocol and cannot point out of the volume or the user's root
        parent = self._client(paths.split(link)[0]).decode()
        target = self._path(posixpath.join(parent, oldpath.decode()).encode())
        relative = posixpath.relpath(target, paths.split(link)[0])
        await self.ns.symlink(self.who, link, relative)

    # -- directories -----------------------------------------------------------------------

    async def scandir(self, path: bytes) -> AsyncIterator[asyncssh.SFTPName]:
        # asyncssh pulls this generator page by page on READDIR; the namespace lists page by
        # page too, so a huge directory never sits in memory whole
        try:
            target = await self._follow(self._path(path))
            # the root's '..' is the root itself, as in a chroot: nothing above it shows
            above = paths.split(target.path)[0]
            parent = target if target.path == self.root else await self.ns.stat(self.who, above)
            for name, entry in ((b".", target), (b"..", parent)):
                yield asyncssh.SFTPName(name, attrs=attrs_of(entry))
            async for child in self.ns.list(self.who, target.path, limit=None):
                yield asyncssh.SFTPName(child.name.encode(), attrs=attrs_of(child))
        except LoomError as exc:
            raise to_sftp(exc, self.root) from exc

    @translated
    async def mkdir(self, path: bytes, attrs: asyncssh.SFTPAttrs) -> None:
        target = self._path(path)
        entry = await self.ns.mkdir(self.who, target)
        mode = self._created(attrs, 0o777)
        if entry.mode & 0o7777 != mode:  # the namespace's mkdir takes no mode
            await self.ns.set_attrs(self.who, target, mode=mode)

    @translated
    async def rmdir(self, path: bytes) -> None:
        target = self._path(path)
        entry = await self.ns.stat(self.who, target)
        if not entry.is_dir:
            raise asyncssh.SFTPNoSuchFile(f"not a directory: {self._client(target).decode()}")
        await self.ns.remove(self.who, target, if_version=entry.version)

    @translated
    async def remove(self, path: bytes) -> None:
        target = self._path(path)
        entry = await self.ns.stat(self.who, target)
        if entry.is_dir:
            raise IsADirectory(f"is a directory (use rmdir): {target}", path=target)
        await self.ns.remove(self.who, target, if_version=entry.version)

    @translated
    async def rename(self, oldpath: bytes, newpath: bytes) -> None:
        # SFTPv3 rename must not replace an existing target (posix-rename does)
        await self.ns.rename(self.who, self._path(oldpath), self._path(newpath))

    @translated
    async def posix_rename(self, oldpath: bytes, newpath: bytes) -> None:
        await self.ns.rename(self.who, self._path(oldpath), self._path(newpath), overwrite=True)

    async def fsync(self, file_obj: object) -> None:
        # durability comes with the commit on close; the spool needs none before that
        return None

    def format_user(self, uid: int | None) -> str:
        return "" if uid is None else str(uid)

    def format_group(self, gid: int | None) -> str:
        return "" if gid is None else str(gid)


def _mtime_ns(attrs: asyncssh.SFTPAttrs) -> int:
    assert attrs.mtime is not None
    return attrs.mtime * 1_000_000_000 + (attrs.mtime_ns or 0)


class SftpServer:
    """The SFTP listener of a site: ``start`` binds it, ``stop`` closes it and its sessions."""

    def __init__(
        self,
        namespace: Namespace,
        users: UserRegistry,
        host_key: Path,
        *,
        spool: Path,
        root: str = "/",
        umask: int = 0o022,
        site: str = "hub",
    ) -> None:
        self.ns = namespace
        self.users = users
        self.host_key = host_key
        self.spool = spool
        self.root = root
        self.umask = umask
        self.site = site
        self._acceptor: asyncssh.SSHAcceptor | None = None

    def _session(self, chan: asyncssh.SSHServerChannel[bytes]) -> Session:
        who: Principal = chan.get_connection().get_extra_info(PRINCIPAL)
        root = paths.normalize(self.root.replace("{user}", who.user))
        log.info("sftp session", extra={"user": who.user, "root": root})
        return Session(chan, self.ns, who, root, self.spool, self.umask)

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (0: a free port); the bound port."""
        key = load_host_key(self.host_key)
        self._acceptor = await asyncssh.listen(
            host,
            port,
            server_factory=lambda: KeyAuth(self.users, self.site),
            server_host_keys=[key],
            sftp_factory=self._session,
            allow_scp=False,
            # no shell, exec or forwarding: this server speaks SFTP and nothing else
            agent_forwarding=False,
            x11_forwarding=False,
            allow_pty=False,
        )
        return int(self._acceptor.get_port())

    async def stop(self) -> None:
        if self._acceptor is not None:
            self._acceptor.close()
            await self._acceptor.wait_closed()
            self._acceptor = None
