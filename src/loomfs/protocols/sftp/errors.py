"""SFTP errors (protocol layer): the one table from loomfs errors to SFTP status codes.

asyncssh encodes an ``SFTPError`` as the status reply, and downgrades codes a client's
protocol version does not know (an SFTPv3 client such as OpenSSH's gets FX_FAILURE for
FX_FILE_ALREADY_EXISTS) with the message kept. Anything that is not a loomfs error is a
bug: it is logged with its trace and the client hears only FX_FAILURE.
"""

from __future__ import annotations

import functools
import logging
import re
import time
from collections.abc import Awaitable, Callable
from typing import Concatenate, ParamSpec, Protocol, TypeVar

import asyncssh
from prometheus_client import Counter

from ...core.metrics import REQUEST_SECONDS
from ...errors import (
    AlreadyExists,
    AuthenticationFailed,
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
)

log = logging.getLogger(__name__)

REQUESTS = Counter("loomfs_sftp_requests_total", "SFTP requests", ["op", "status"])

P = ParamSpec("P")
T = TypeVar("T")
S = TypeVar("S", bound="Confined")

# subclasses not listed use their nearest listed base (AuthenticationFailed is listed only
# to say it is deliberate that it reads as a plain permission refusal)
CODES: dict[type[LoomError], int] = {
    NotFound: asyncssh.FX_NO_SUCH_FILE,
    AlreadyExists: asyncssh.FX_FILE_ALREADY_EXISTS,
    NotADirectory: asyncssh.FX_NOT_A_DIRECTORY,
    IsADirectory: asyncssh.FX_FILE_IS_A_DIRECTORY,
    DirectoryNotEmpty: asyncssh.FX_DIR_NOT_EMPTY,
    PermissionDenied: asyncssh.FX_PERMISSION_DENIED,
    AuthenticationFailed: asyncssh.FX_PERMISSION_DENIED,
    InvalidPath: asyncssh.FX_INVALID_FILENAME,
    InvalidArgument: asyncssh.FX_INVALID_PARAMETER,
    NotSupported: asyncssh.FX_OP_UNSUPPORTED,
    InsufficientStorage: asyncssh.FX_NO_SPACE_ON_FILESYSTEM,
    # a rename out of a volume: SFTP has no EXDEV, and a client cannot fall back to a copy
    CrossesVolume: asyncssh.FX_OP_UNSUPPORTED,
    # the file changed under an open handle (or a version precondition failed)
    Conflict: asyncssh.FX_FAILURE,
    CorruptData: asyncssh.FX_FAILURE,
    BackendUnavailable: asyncssh.FX_FAILURE,
    LoomError: asyncssh.FX_FAILURE,
}


# metric labels of the codes this server answers with
_NAMES = {
    code: name.removeprefix("FX_").lower()
    for name, code in vars(asyncssh).items()
    if name.startswith("FX_") and not name.endswith("_END") and isinstance(code, int)
}


def to_sftp(exc: LoomError, root: str = "/") -> asyncssh.SFTPError:
    """The SFTP status for a namespace error. Its message names paths as the client sees
    them, below its ``root``: where that root lies in the namespace is not the client's."""
    code = next(CODES[cls] for cls in type(exc).__mro__ if cls in CODES)
    message = exc.message
    if root != "/":
        # only where a path starts with the root: '/data/database' is '/database' for
        # root '/data', and '/data' alone is '/'
        start = r"(?<![\w./-])" + re.escape(root)
        message = re.sub(start + r"(?=/)", "", message)
        message = re.sub(start + r"(?![\w./-])", "/", message)
    return asyncssh.SFTPError(code, message)


class Confined(Protocol):
    """What ``translated`` needs of the object whose requests it runs."""

    root: str


def translated(
    fn: Callable[Concatenate[S, P], Awaitable[T]],
) -> Callable[Concatenate[S, P], Awaitable[T]]:
    """Run one SFTP request: loomfs errors leave as their SFTP status (through ``CODES``),
    SFTP errors as they are, and anything else as FX_FAILURE, logged with its trace.

    asyncssh would send an OSError's errno-derived status and an unexpected error's text;
    both are bypassed so that the table above is the only translation.
    """

    @functools.wraps(fn)
    async def run(self: S, /, *args: P.args, **kwargs: P.kwargs) -> T:
        status, began = "ok", time.perf_counter()
        try:
            return await fn(self, *args, **kwargs)
        except asyncssh.SFTPError as exc:
            status = _NAMES.get(exc.code, "failure")
            raise
        except LoomError as exc:
            # a miss is routine (clients stat before they put), anything else worth a line
            level = logging.DEBUG if isinstance(exc, NotFound) else logging.INFO
            extra = {"op": fn.__name__, "code": exc.code, "reason": exc.message}
            log.log(level, "sftp request refused", extra=extra)
            error = to_sftp(exc, self.root)
            status = _NAMES.get(error.code, "failure")
            raise error from exc
        except Exception as exc:
            log.exception("unexpected error in an sftp request", extra={"op": fn.__name__})
            status = "internal"
            raise asyncssh.SFTPFailure("internal error, see the server log") from exc
        finally:
            REQUESTS.labels(fn.__name__, status).inc()
            latency.observe(time.perf_counter() - began)

    latency = REQUEST_SECONDS.labels("sftp", fn.__name__)

    return run
