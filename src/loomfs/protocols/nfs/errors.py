"""NFSv3 status codes (protocol layer): the one table from loomfs errors to ``nfsstat3``.

Subclasses not listed use their nearest listed base. Anything that is not a loomfs error
is a bug: the server logs it with its trace and answers NFS3ERR_SERVERFAULT.
"""

from __future__ import annotations

from ...errors import (
    AlreadyExists,
    BackendUnavailable,
    Conflict,
    CorruptData,
    CrossesVolume,
    DirectoryNotEmpty,
    InsufficientStorage,
    InvalidArgument,
    InvalidPath,
    IsADirectory,
    LoomError,
    NotADirectory,
    NotFound,
    NotSupported,
    PermissionDenied,
    RangeNotSatisfiable,
)

NFS3_OK = 0
NFS3ERR_PERM = 1
NFS3ERR_NOENT = 2
NFS3ERR_IO = 5
NFS3ERR_NXIO = 6
NFS3ERR_ACCES = 13
NFS3ERR_EXIST = 17
NFS3ERR_XDEV = 18
NFS3ERR_NODEV = 19
NFS3ERR_NOTDIR = 20
NFS3ERR_ISDIR = 21
NFS3ERR_INVAL = 22
NFS3ERR_FBIG = 27
NFS3ERR_NOSPC = 28
NFS3ERR_ROFS = 30
NFS3ERR_MLINK = 31
NFS3ERR_NAMETOOLONG = 63
NFS3ERR_NOTEMPTY = 66
NFS3ERR_DQUOT = 69
NFS3ERR_STALE = 70
NFS3ERR_REMOTE = 71
NFS3ERR_BADHANDLE = 10001
NFS3ERR_NOT_SYNC = 10002
NFS3ERR_BAD_COOKIE = 10003
NFS3ERR_NOTSUPP = 10004
NFS3ERR_TOOSMALL = 10005
NFS3ERR_SERVERFAULT = 10006
NFS3ERR_BADTYPE = 10007
NFS3ERR_JUKEBOX = 10008

CODES: dict[type[LoomError], int] = {
    NotFound: NFS3ERR_NOENT,
    AlreadyExists: NFS3ERR_EXIST,
    NotADirectory: NFS3ERR_NOTDIR,
    IsADirectory: NFS3ERR_ISDIR,
    DirectoryNotEmpty: NFS3ERR_NOTEMPTY,
    PermissionDenied: NFS3ERR_ACCES,
    InvalidPath: NFS3ERR_INVAL,
    RangeNotSatisfiable: NFS3ERR_INVAL,
    InvalidArgument: NFS3ERR_INVAL,
    NotSupported: NFS3ERR_NOTSUPP,
    InsufficientStorage: NFS3ERR_NOSPC,
    CrossesVolume: NFS3ERR_XDEV,
    # the hub's storage is away for a moment: JUKEBOX makes the client retry later
    BackendUnavailable: NFS3ERR_JUKEBOX,
    # another site's write lease, or the file changed under a read: the client sees EIO
    Conflict: NFS3ERR_IO,
    CorruptData: NFS3ERR_IO,
    LoomError: NFS3ERR_IO,
}


class NfsError(Exception):
    """A status the server decides itself (a bad handle, a read-only export)."""

    def __init__(self, status: int, message: str = "") -> None:
        super().__init__(message or str(status))
        self.status = status


def to_nfsstat(exc: LoomError) -> int:
    return next(CODES[cls] for cls in type(exc).__mro__ if cls in CODES)
