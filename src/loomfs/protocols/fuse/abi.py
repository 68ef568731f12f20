"""The FUSE kernel protocol (protocol layer): message layouts, flags and reply types.

loomfs speaks to ``/dev/fuse`` itself (``session.py``) instead of through libfuse: the
libfuse that Debian 12 ships (3.14) cannot negotiate passthrough, where the kernel reads
an open file's bytes straight from a local file, and warm reads through FUSE's own page
cache run at a fifth of the local disk's speed. The layouts follow ``linux/fuse.h``
(protocol 7.40 and later); only what loomfs uses is here.
"""

from __future__ import annotations

import errno
import stat
import struct
from dataclasses import dataclass

ROOT_INODE = 1
KERNEL_MAJOR = 7
#: the minor version loomfs speaks: 7.40 brought passthrough
KERNEL_MINOR = 40

# request header: len, opcode, unique, nodeid, uid, gid, pid, total_extlen, padding
IN_HEADER = struct.Struct("<IIQQIIIHH")
# reply header: len, error (negative errno), unique
OUT_HEADER = struct.Struct("<IiQ")
# ino, size, blocks, atime, mtime, ctime, atimensec, mtimensec, ctimensec, mode, nlink,
# uid, gid, rdev, blksize, flags
ATTR = struct.Struct("<QQQQQQIIIIIIIIII")
# nodeid, generation, entry_valid, attr_valid, entry_valid_nsec, attr_valid_nsec
ENTRY_OUT = struct.Struct("<QQQQII")
# attr_valid, attr_valid_nsec, dummy
ATTR_OUT = struct.Struct("<QII")
# fh, open_flags, backing_id
OPEN_OUT = struct.Struct("<QIi")
INIT_IN = struct.Struct("<IIIII")  # major, minor, max_readahead, flags, flags2
# major, minor, max_readahead, flags, max_background, congestion_threshold, max_write,
# time_gran, max_pages, map_alignment, flags2, max_stack_depth, unused[6]
INIT_OUT = struct.Struct("<IIIIHHIIHHII24x")
# valid, padding, fh, size, lock_owner, atime, mtime, ctime, atimensec, mtimensec,
# ctimensec, mode, unused4, uid, gid, unused5
SETATTR_IN = struct.Struct("<IIQQQQQQIIIIIIII")
MKNOD_IN = struct.Struct("<IIII")  # mode, rdev, umask, padding
MKDIR_IN = struct.Struct("<II")  # mode, umask
RENAME_IN = struct.Struct("<Q")  # newdir
RENAME2_IN = struct.Struct("<QII")  # newdir, flags, padding
LINK_IN = struct.Struct("<Q")  # oldnodeid
OPEN_IN = struct.Struct("<II")  # flags, open_flags
CREATE_IN = struct.Struct("<IIII")  # flags, mode, umask, open_flags
FH_IN = struct.Struct("<Q")  # the fh that leads flush, release and releasedir requests
FSYNC_IN = struct.Struct("<QII")  # fh, fsync_flags, padding
# fh, offset, size, read_flags/write_flags, lock_owner, flags, padding
IO_IN = struct.Struct("<QQIIQII")
WRITE_OUT = struct.Struct("<II")  # size, padding
FORGET_IN = struct.Struct("<Q")  # nlookup
BATCH_FORGET_IN = struct.Struct("<II")  # count, dummy
FORGET_ONE = struct.Struct("<QQ")  # nodeid, nlookup
SETXATTR_IN = struct.Struct("<II")  # size, flags
GETXATTR_IN = struct.Struct("<II")  # size, padding
GETXATTR_OUT = struct.Struct("<II")  # size, padding
# blocks, bfree, bavail, files, ffree, bsize, namelen, frsize, padding, spare[6]
STATFS_OUT = struct.Struct("<QQQQQIIII24x")
DIRENT = struct.Struct("<QQII")  # ino, off, namelen, type
INVAL_INODE_OUT = struct.Struct("<Qqq")  # ino, off, len
INVAL_ENTRY_OUT = struct.Struct("<QII")  # parent, namelen, flags
BACKING_MAP = struct.Struct("<iIQ")  # fd, flags, padding

# opcodes
LOOKUP, FORGET, GETATTR, SETATTR, READLINK, SYMLINK = 1, 2, 3, 4, 5, 6
MKNOD, MKDIR, UNLINK, RMDIR, RENAME, LINK, OPEN, READ, WRITE = 8, 9, 10, 11, 12, 13, 14, 15, 16
STATFS, RELEASE, FSYNC, SETXATTR, GETXATTR, LISTXATTR = 17, 18, 20, 21, 22, 23
REMOVEXATTR, FLUSH, INIT, OPENDIR, READDIR, RELEASEDIR, FSYNCDIR = 24, 25, 26, 27, 28, 29, 30
CREATE, INTERRUPT, DESTROY, BATCH_FORGET, READDIRPLUS, RENAME2 = 35, 36, 38, 42, 44, 45

# init flags (flags2 holds bits 32 and up)
ASYNC_READ = 1 << 0
ATOMIC_O_TRUNC = 1 << 3
BIG_WRITES = 1 << 5
AUTO_INVAL_DATA = 1 << 12
DO_READDIRPLUS = 1 << 13
ASYNC_DIO = 1 << 15
PARALLEL_DIROPS = 1 << 18
MAX_PAGES = 1 << 22
INIT_EXT = 1 << 30
PASSTHROUGH = 1 << 37

# open reply flags
FOPEN_KEEP_CACHE = 1 << 1
FOPEN_NOFLUSH = 1 << 5
FOPEN_PASSTHROUGH = 1 << 7

# setattr valid bits
FATTR_MODE, FATTR_UID, FATTR_GID, FATTR_SIZE = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FATTR_ATIME, FATTR_MTIME, FATTR_FH = 1 << 4, 1 << 5, 1 << 6
FATTR_ATIME_NOW, FATTR_MTIME_NOW = 1 << 7, 1 << 8

NOTIFY_INVAL_INODE = 2
NOTIFY_INVAL_ENTRY = 3

#: ioctls on /dev/fuse: _IOW(229, 1, struct fuse_backing_map) and _IOW(229, 2, uint32_t)
BACKING_OPEN = (1 << 30) | (BACKING_MAP.size << 16) | (229 << 8) | 1
BACKING_CLOSE = (1 << 30) | (4 << 16) | (229 << 8) | 2

RENAME_NOREPLACE = 1 << 0
RENAME_EXCHANGE = 1 << 1
ENOATTR = errno.ENODATA


class FUSEError(Exception):
    """A request fails with this errno."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.errno = code


@dataclass(slots=True)
class Context:
    """Who sent a request; ``umask`` only for the requests that make a name."""

    uid: int
    gid: int
    pid: int
    umask: int = 0


@dataclass(slots=True)
class EntryAttributes:
    st_ino: int = 0
    st_mode: int = 0
    st_nlink: int = 0
    st_uid: int = 0
    st_gid: int = 0
    st_rdev: int = 0
    st_size: int = 0
    st_blksize: int = 0
    st_blocks: int = 0
    st_atime_ns: int = 0
    st_mtime_ns: int = 0
    st_ctime_ns: int = 0
    generation: int = 0
    #: seconds the kernel may keep the name, and the attributes
    entry_timeout: float = 0.0
    attr_timeout: float = 0.0

    def pack_attr(self) -> bytes:
        asec, ansec = divmod(self.st_atime_ns, 1_000_000_000)
        msec, mnsec = divmod(self.st_mtime_ns, 1_000_000_000)
        csec, cnsec = divmod(self.st_ctime_ns, 1_000_000_000)
        return ATTR.pack(
            self.st_ino, self.st_size, self.st_blocks, asec, msec, csec, ansec, mnsec, cnsec,
            self.st_mode, self.st_nlink, self.st_uid, self.st_gid, self.st_rdev,
            self.st_blksize, 0,
        )  # fmt: skip

    def pack_entry(self) -> bytes:
        entry_s, entry_ns = _seconds(self.entry_timeout)
        attr_s, attr_ns = _seconds(self.attr_timeout)
        return (
            ENTRY_OUT.pack(self.st_ino, self.generation, entry_s, attr_s, entry_ns, attr_ns)
            + self.pack_attr()
        )

    def pack_attr_out(self) -> bytes:
        attr_s, attr_ns = _seconds(self.attr_timeout)
        return ATTR_OUT.pack(attr_s, attr_ns, 0) + self.pack_attr()


def _seconds(timeout: float) -> tuple[int, int]:
    whole = int(timeout)
    return whole, int((timeout - whole) * 1e9)


@dataclass(slots=True)
class SetattrFields:
    update_mode: bool = False
    update_uid: bool = False
    update_gid: bool = False
    update_size: bool = False
    update_atime: bool = False
    update_mtime: bool = False


@dataclass(slots=True)
class FileInfo:
    """An open's reply. ``backing_id``: a backing file registered with the session
    (``Session.open_backing``) that the kernel reads the file from itself (passthrough).
    ``noflush``: the kernel sends no FLUSH when the handle is closed."""

    fh: int
    keep_cache: bool = False
    backing_id: int | None = None
    noflush: bool = False


@dataclass(slots=True)
class StatvfsData:
    f_bsize: int = 0
    f_frsize: int = 0
    f_blocks: int = 0
    f_bfree: int = 0
    f_bavail: int = 0
    f_files: int = 0
    f_ffree: int = 0
    f_favail: int = 0
    f_namemax: int = 0

    def pack(self) -> bytes:
        return STATFS_OUT.pack(
            self.f_blocks, self.f_bfree, self.f_bavail, self.f_files, self.f_ffree,
            self.f_bsize, self.f_namemax, self.f_frsize, 0,
        )  # fmt: skip


class ReaddirToken:
    """The reply buffer of one readdir(plus) request, filled by ``readdir_reply``."""

    __slots__ = ("buffer", "limit", "plus")

    def __init__(self, limit: int, plus: bool) -> None:
        self.buffer = bytearray()
        self.limit = limit
        self.plus = plus


def readdir_reply(token: ReaddirToken, name: bytes, attrs: EntryAttributes, next_id: int) -> bool:
    """Add one entry; False (and nothing added) when the kernel's buffer is full."""
    dirent = DIRENT.pack(attrs.st_ino, next_id, len(name), stat.S_IFMT(attrs.st_mode) >> 12)
    record = dirent + name + b"\0" * (-(DIRENT.size + len(name)) % 8)
    if token.plus:
        record = attrs.pack_entry() + record
    if len(token.buffer) + len(record) > token.limit:
        return False
    token.buffer += record
    return True
