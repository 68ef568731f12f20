"""Administration's own safeguards (core layer): where posix volumes may come from, and the
site's local administrator.

Who may administer is the ACL's decision (``AclAuthorizer.check_admin``); this module
holds what administration may do whoever asks, and how a fresh site gets its first
administrator.

*Volume roots*: a posix volume hands every file below its directory to whoever may read
the mount, with the hub process's rights. It may be added only at or under one of
``[hub] volume_roots``, judged on its real path (``..`` and symlinks resolved), and it is
recorded under that real path, so no link swapped in later leads it elsewhere. With no
root configured, no posix volume can be added. Other schemes (S3) name no local files.

*The local administrator*: the first time a hub serves with no administrator in its
registry, it makes user ``admin`` in group ``admin`` and writes its access key to
``<data_dir>/admin.key`` (mode 0600, whole or not at all). The CLI, given no credentials
of its own, uses that key for administration commands sent to the hub of its own data
directory, the one that records its URL in ``<data_dir>/serving.json`` while it serves:
the trust is the file's permission on the hub's machine, as PostgreSQL's peer
authentication trusts the local account. More administrators are users in group
``admin`` (``loomfs user add NAME --group admin``).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from urllib.parse import quote, urlsplit

from ..errors import AlreadyExists, PermissionDenied
from .acl import ADMIN_GROUP
from .audit import AuditSink
from .backends.posix import PosixBackend
from .types import Principal
from .users import UserRegistry

ADMIN_USER = "admin"
KEY_FILE = "admin.key"
SERVING_FILE = "serving.json"


def check_volume_url(url: str, roots: Sequence[Path]) -> str:
    """The URL a volume is added under: a posix one as its real path, if that lies at or
    under one of ``roots`` (else ``PermissionDenied``); any other URL as it is."""
    if urlsplit(url).scheme != "posix":
        return url
    real = PosixBackend.from_url(url).root  # what the backend itself resolves the URL to
    allowed = [os.path.realpath(root) for root in roots]
    if not any(real == root or real.startswith(root.rstrip("/") + "/") for root in allowed):
        shown = ", ".join(allowed) if allowed else "none is set"
        raise PermissionDenied(
            f"posix volume {real} is not under [hub] volume_roots ({shown}): add a directory "
            "at or above it there to allow assimilating it",
            path=real,
        )
    return f"posix://{quote(real)}"


class LocalAdmin:
    """The local administrator's key file and the hub's record of where it serves, in a
    site's data directory."""

    def __init__(self, data_dir: Path) -> None:
        self.key_file = data_dir / KEY_FILE
        self.serving_file = data_dir / SERVING_FILE

    async def bootstrap(
        self, users: UserRegistry, audit: AuditSink | None, site: str
    ) -> str | None:
        """Make the site's first administrator, once: while no user is in group admin
        and no key file is there. Returns the new access key id, None if none was made."""
        if self.key_file.exists() or any(ADMIN_GROUP in u.groups for u in await users.list_users()):
            return None
        try:
            await users.add_user(ADMIN_USER, frozenset({ADMIN_GROUP}))
        except AlreadyExists:
            return None  # a hub sharing the catalog made it first, or an operator's user
        key = await users.add_access_key(ADMIN_USER)
        self.key_file.parent.mkdir(parents=True, exist_ok=True)
        _write_new(
            self.key_file,
            json.dumps({"user": ADMIN_USER, "access_key": key.access_key, "secret": key.secret}),
        )
        if audit is not None:
            audit.record(
                Principal("system", site=site, protocol="internal"),
                "bootstrap_admin",
                "/",
                "ok",
                detail=f"user {ADMIN_USER}, access key {key.access_key} in {self.key_file}",
            )
        return key.access_key

    def credentials(self) -> tuple[str, str] | None:
        """(access key id, secret) from the key file; None where it is absent or not
        readable by this account."""
        try:
            data = json.loads(self.key_file.read_text())
            return str(data["access_key"]), str(data["secret"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def credentials_for(self, url: str) -> tuple[str, str] | None:
        """The key, for ``url`` only if it is the REST URL the hub of this data directory
        serves at: never sent to another server."""
        try:
            serving = json.loads(self.serving_file.read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(serving, dict) or serving.get("url") != url.rstrip("/"):
            return None
        return self.credentials()

    def record_serving(self, urls: Mapping[str, str]) -> None:
        """Say where the hub serves (its ``url``: the REST API), until ``stopped``."""
        partial = self.serving_file.with_name(f".{SERVING_FILE}.{os.getpid()}")
        partial.write_text(json.dumps(dict(urls)))
        partial.replace(self.serving_file)

    def stopped(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.serving_file.unlink()


def _write_new(path: Path, text: str) -> None:
    """Create ``path`` readable by its owner only, whole or not at all, never over an
    existing file."""
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.link(partial, path)  # fails if it exists: two hubs never swap each other's key
    finally:
        partial.unlink()
