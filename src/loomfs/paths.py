"""Namespace path rules (core layer), checked once for every protocol.

A namespace path is absolute, '/'-separated, has no empty, '.' or '..' components, no NUL
bytes, and stays within the name and path length limits of Linux. Anything else is refused
with ``InvalidPath`` before it reaches a catalog or a volume, so traversal can't be spelled.
"""

from __future__ import annotations

from .errors import InvalidPath

MAX_NAME_BYTES = 255
#: Linux's PATH_MAX: the longest path one system call takes, and a symlink's longest target
PATH_MAX = 4096
#: A namespace path is a mount prefix and a path inside a volume. Linux clients reach
#: files deeper than PATH_MAX through relative paths (no system call ever names them
#: whole), so the inside alone may be as long as PATH_MAX.
MAX_PATH_BYTES = 2 * PATH_MAX
ROOT = "/"


def normalize(path: str) -> str:
    """Return the canonical form of ``path`` or raise ``InvalidPath``.

    Repeated and trailing slashes are folded ('/a//b/' is '/a/b'); everything else that is
    not canonical is an error rather than silently rewritten, since a rewrite of '..' is how
    traversal slips through.
    """
    if not isinstance(path, str):
        raise InvalidPath(f"path must be a string, not {type(path).__name__}")
    if not path.startswith("/"):
        raise InvalidPath(f"path must be absolute: {path!r}", path=path)
    if "\x00" in path:
        raise InvalidPath("path contains a NUL byte", path=path)
    try:
        encoded_len = len(path.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidPath(f"path is not valid UTF-8: {path!r}", path=path) from exc
    if encoded_len > MAX_PATH_BYTES:
        raise InvalidPath(f"path is longer than {MAX_PATH_BYTES} bytes", path=path)
    parts = [p for p in path.split("/") if p]
    for part in parts:
        if part in (".", ".."):
            raise InvalidPath(f"path may not contain '.' or '..': {path!r}", path=path)
        if len(part.encode("utf-8")) > MAX_NAME_BYTES:
            raise InvalidPath(f"name is longer than {MAX_NAME_BYTES} bytes", path=path)
    return "/" + "/".join(parts)


def split(path: str) -> tuple[str, str]:
    """Split a normalized path into (parent, name); the root's parent is itself."""
    if path == ROOT:
        return ROOT, ""
    parent, _, name = path.rpartition("/")
    return parent or ROOT, name


def join(parent: str, name: str) -> str:
    return f"{parent.rstrip('/')}/{name}"


def is_within(path: str, top: str) -> bool:
    """True when ``path`` is ``top`` or lies below it (both normalized)."""
    return top in (ROOT, path) or path.startswith(top + "/")


def relative(path: str, top: str) -> str:
    """The part of ``path`` below ``top``, '' for ``top`` itself (both normalized)."""
    if path == top:
        return ""
    if top == ROOT:
        return path[1:]
    if not path.startswith(top + "/"):
        raise InvalidPath(f"{path} is not within {top}", path=path)
    return path[len(top) + 1 :]


def ancestors(path: str) -> list[str]:
    """The proper ancestors of ``path``, root first ('/a/b/c' -> ['/', '/a', '/a/b'])."""
    out = [ROOT]
    parts = [p for p in path.split("/") if p]
    for i in range(1, len(parts)):
        out.append("/" + "/".join(parts[:i]))
    return out if path != ROOT else []
