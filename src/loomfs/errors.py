"""The one error hierarchy of loomfs (used by every layer).

Each error inherits the builtin that a Python caller would expect (``NotFound`` is a
``FileNotFoundError``), carries a stable ``code`` that protocol edges translate through
their own tables, and says whether retrying can help. Vendor errors (botocore, sqlite,
psycopg, OSError) are translated at the boundary that sees them, with ``__cause__`` kept.
"""

from __future__ import annotations

import errno as _errno


class LoomError(Exception):
    """Base of every loomfs error."""

    code = "InternalError"
    errno = _errno.EIO
    retryable = False

    def __init__(self, message: str, *, path: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.path = path

    def __str__(self) -> str:
        return self.message


class NotFound(LoomError, FileNotFoundError):
    code = "NotFound"
    errno = _errno.ENOENT


class AlreadyExists(LoomError, FileExistsError):
    code = "AlreadyExists"
    errno = _errno.EEXIST


class NotADirectory(LoomError, NotADirectoryError):
    code = "NotADirectory"
    errno = _errno.ENOTDIR


class IsADirectory(LoomError, IsADirectoryError):
    code = "IsADirectory"
    errno = _errno.EISDIR


class DirectoryNotEmpty(LoomError, OSError):
    code = "DirectoryNotEmpty"
    errno = _errno.ENOTEMPTY


class Conflict(LoomError):
    """A version precondition failed, or the content changed while it was being read."""

    code = "Conflict"
    errno = _errno.ESTALE


class PermissionDenied(LoomError, PermissionError):
    code = "PermissionDenied"
    errno = _errno.EACCES


class AuthenticationFailed(PermissionDenied):
    """Credentials were missing, wrong or refused (by a backend or by loomfs itself)."""

    code = "AuthenticationFailed"


class KeyRequired(PermissionDenied):
    """The content is encrypted with a key only its writer holds (S3's SSE-C), and the
    call brought none: it is read only with that key."""

    code = "KeyRequired"


class WrongKey(PermissionDenied):
    """The key a call brought for content encrypted with its writer's key is not that key."""

    code = "WrongKey"


class InvalidPath(LoomError, ValueError):
    code = "InvalidPath"
    errno = _errno.EINVAL


class InvalidArgument(LoomError, ValueError):
    code = "InvalidArgument"
    errno = _errno.EINVAL


class RangeNotSatisfiable(InvalidArgument):
    code = "RangeNotSatisfiable"


class UnsupportedScheme(InvalidArgument):
    code = "UnsupportedScheme"


class ConfigError(LoomError, ValueError):
    code = "ConfigError"
    errno = _errno.EINVAL


class CrossesVolume(LoomError, OSError):
    """A rename between two volumes (or out of a volume) cannot be done in place."""

    code = "CrossesVolume"
    errno = _errno.EXDEV


class NotSupported(LoomError, OSError):
    code = "NotSupported"
    errno = _errno.ENOTSUP


class InsufficientStorage(LoomError, OSError):
    """A disk (a volume's, or the site's data directory) is full. Not retryable: it stays
    full until someone frees space, and a client retrying for seconds only delays the
    error; the message names the disk so that someone knows which."""

    code = "InsufficientStorage"
    errno = _errno.ENOSPC


class BackendUnavailable(LoomError, ConnectionError):
    """A volume's storage or the catalog cannot be reached right now."""

    code = "BackendUnavailable"
    errno = _errno.EIO
    retryable = True


class CorruptData(LoomError):
    """Bytes failed their integrity check (hash mismatch, truncated or malformed frame).

    Retryable: a fresh fetch of the same chunk can succeed where this copy was damaged.
    """

    code = "CorruptData"
    errno = _errno.EIO
    retryable = True


ALL_ERRORS: tuple[type[LoomError], ...] = (
    LoomError,
    NotFound,
    AlreadyExists,
    NotADirectory,
    IsADirectory,
    DirectoryNotEmpty,
    Conflict,
    PermissionDenied,
    AuthenticationFailed,
    KeyRequired,
    WrongKey,
    InvalidPath,
    InvalidArgument,
    RangeNotSatisfiable,
    UnsupportedScheme,
    ConfigError,
    CrossesVolume,
    NotSupported,
    InsufficientStorage,
    BackendUnavailable,
    CorruptData,
)

BY_CODE: dict[str, type[LoomError]] = {cls.code: cls for cls in ALL_ERRORS}


def from_oserror(exc: OSError, path: str | None = None, *, disk: str | None = None) -> LoomError:
    """Translate an OSError from a local file system into the hierarchy, keeping the cause.
    ``disk`` says where ``path`` lies ("volume /srv/data", "data directory /var/lib/x"):
    a full disk is named by it, since the path alone does not tell which disk is full.
    One of ours (several are OSErrors, so an ``except OSError`` meets them) stays itself."""
    ours: object = exc  # mypy holds that no class can be both (their errno attributes differ)
    if isinstance(ours, LoomError):
        return ours
    table: dict[int, type[LoomError]] = {
        _errno.ENOENT: NotFound,
        _errno.EEXIST: AlreadyExists,
        _errno.ENOTDIR: NotADirectory,
        _errno.EISDIR: IsADirectory,
        _errno.ENOTEMPTY: DirectoryNotEmpty,
        _errno.EACCES: PermissionDenied,
        _errno.EPERM: PermissionDenied,
        _errno.ENOSPC: InsufficientStorage,
        _errno.EDQUOT: InsufficientStorage,
        _errno.EXDEV: CrossesVolume,
        _errno.ENAMETOOLONG: InvalidPath,
        _errno.ELOOP: InvalidPath,
        _errno.EROFS: PermissionDenied,
        _errno.EFBIG: InvalidArgument,  # a size or offset past what the file system holds
    }
    cls = table.get(exc.errno or 0, LoomError)
    if cls is InsufficientStorage and disk is not None:
        message = f"{disk} is full ({exc.strerror or exc})" + (f", writing {path}" if path else "")
    else:
        message = f"{exc.strerror or exc}" + (f": {path}" if path else "")
    err = cls(message, path=path)
    err.__cause__ = exc
    return err
