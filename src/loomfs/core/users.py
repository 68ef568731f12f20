"""The user registry (core layer): users, their groups, S3 access keys, SSH public keys and
SMB passwords.

Every protocol authenticates against this one registry (S3 by access key, SFTP by public
key, SMB by the NT hash of a password that Samba checks) and turns the result into a
``Principal``, so a user is the same user everywhere. The
rows live in the site catalog (both engines, same SQL), reached through the catalog's own
connection thread. An S3 secret must be stored as it is, since SigV4 verification needs
it as the HMAC key; it is shown once when created and never logged or listed.
"""

from __future__ import annotations

import base64
import hashlib
import re
import secrets
import time
from dataclasses import dataclass, field

from ..errors import AlreadyExists, InvalidArgument, NotFound, UnsupportedScheme
from .catalog.base import Catalog
from .catalog.sql import Cursor, SqlCatalog
from .types import Principal

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")
_ACCESS_KEY = re.compile(r"^[A-Za-z0-9]{16,128}$")
# the caller without credentials and loomfs itself (see core.acl): no one may log in as them
RESERVED_USERS = frozenset({"anonymous", "system"})
MAX_REMEMBERED = 10000  # access keys a registry remembers at most (see ``remember``)
#: the local uids SMB sessions run as (``SmbLogin.uid``): above any distribution's users
SMB_UID_BASE = 70001
_NT_HASH = re.compile(r"^[0-9A-F]{32}$")
_KEY_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"  # as AWS key ids: upper case and digits
SSH_KEY_TYPES = (
    "ssh-ed25519",
    "ssh-rsa",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "sk-ssh-ed25519@openssh.com",
    "sk-ecdsa-sha2-nistp256@openssh.com",
)


@dataclass(frozen=True, slots=True)
class AccessKey:
    access_key: str
    user: str
    created_ns: int
    secret: str = field(repr=False)  # never in a repr, so never in a log line by accident


@dataclass(frozen=True, slots=True)
class SshKey:
    user: str
    key_type: str
    key_data: str  # base64 blob as in authorized_keys
    comment: str
    created_ns: int

    @property
    def line(self) -> str:
        return f"{self.key_type} {self.key_data} {self.comment}".rstrip()

    @property
    def fingerprint(self) -> str:
        """As ``ssh-keygen -l`` shows it: SHA256 of the key blob, unpadded base64."""
        digest = hashlib.sha256(base64.b64decode(self.key_data)).digest()
        return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


@dataclass(frozen=True, slots=True)
class SmbLogin:
    """What Samba needs to log ``user`` in and run her session: her NT hash and the
    local uid it runs as."""

    user: str
    uid: int
    nt_hash: str = field(repr=False)  # a password equivalent for NTLM: never in a log
    changed_ns: int = 0


@dataclass(frozen=True, slots=True)
class User:
    name: str
    groups: frozenset[str]
    created_ns: int
    access_keys: tuple[str, ...] = ()
    ssh_keys: tuple[SshKey, ...] = ()

    def principal(self, protocol: str, site: str = "local") -> Principal:
        return Principal(user=self.name, groups=self.groups, site=site, protocol=protocol)


def _check_name(name: str, what: str) -> str:
    if not _NAME.match(name):
        raise InvalidArgument(
            f"invalid {what} {name!r}: 1-64 letters, digits, '.', '_', '@' or '-', "
            "starting with a letter or digit"
        )
    return name


def parse_ssh_key(line: str) -> tuple[str, str, str]:
    """(type, base64 data, comment) of one authorized_keys style line (no options)."""
    parts = line.strip().split(None, 2)
    if len(parts) < 2 or parts[0] not in SSH_KEY_TYPES:
        raise InvalidArgument(
            "not an OpenSSH public key (expected 'TYPE BASE64 [comment]' with TYPE one of "
            + ", ".join(SSH_KEY_TYPES)
            + ")"
        )
    if not re.fullmatch(r"[A-Za-z0-9+/]+={0,2}", parts[1]):
        raise InvalidArgument("the public key's data is not base64")
    return parts[0], parts[1], parts[2] if len(parts) > 2 else ""


def bump_acl_generation(catalog: SqlCatalog, cur: Cursor) -> None:
    """Group memberships are part of access control: running hubs reload on this."""
    catalog._q(cur, "UPDATE counters SET value = value + 1 WHERE name = 'acl'")


def new_access_key() -> tuple[str, str]:
    """A fresh (access key id, secret) pair shaped like AWS's (20 and 40 characters)."""
    key_id = "LK" + "".join(secrets.choice(_KEY_ALPHABET) for _ in range(18))
    return key_id, secrets.token_urlsafe(30)[:40]


class UserRegistry:
    """Async registry API over a SQL catalog (``SqliteCatalog`` or ``PostgresCatalog``).

    With ``remember`` (seconds), a found access key is remembered that long: a server
    that looks one up per request (S3) saves a catalog round trip per request, and a key
    removed by another process stops working within that time, as a changed ACL rule
    does (``acl.REFRESH``); removed through this registry, at once.
    """

    def __init__(self, catalog: Catalog, *, remember: float = 0.0) -> None:
        if not isinstance(catalog, SqlCatalog):
            raise UnsupportedScheme(f"the user registry needs a SQL catalog, not {catalog.url}")
        self._cat = catalog
        self._remember = remember
        # access key -> (user, secret, until); the secret stays in memory as in the catalog
        self._found: dict[str, tuple[User, str, float]] = {}

    # -- users -----------------------------------------------------------------------------

    async def add_user(self, name: str, groups: frozenset[str] = frozenset()) -> User:
        _check_name(name, "user name")
        if name in RESERVED_USERS:
            raise InvalidArgument(f"{name!r} is reserved for loomfs's own callers")
        for group in groups:
            _check_name(group, "group name")
        now = time.time_ns()

        def fn(cur: Cursor) -> None:
            q = self._cat._q
            if q(cur, "SELECT 1 FROM users WHERE name = ?", (name,)).fetchone() is not None:
                raise AlreadyExists(f"user {name} already exists")
            q(cur, "INSERT INTO users (name, created_ns) VALUES (?, ?)", (name, now))
            cur.executemany(
                self._cat._sql("INSERT INTO user_groups (user_name, group_name) VALUES (?, ?)"),
                [(name, g) for g in sorted(groups)],
            )
            bump_acl_generation(self._cat, cur)

        await self._cat._run(self._cat._write, fn)
        return User(name, frozenset(groups), now)

    async def remove_user(self, name: str) -> None:
        """Remove a user with their groups and keys (the rows cascade)."""

        def fn(cur: Cursor) -> None:
            self._user_row(cur, name)
            self._cat._q(cur, "DELETE FROM users WHERE name = ?", (name,))
            bump_acl_generation(self._cat, cur)

        await self._cat._run(self._cat._write, fn)
        self._found.clear()

    def _user_row(self, cur: Cursor, name: str) -> int:
        row = self._cat._q(cur, "SELECT created_ns FROM users WHERE name = ?", (name,)).fetchone()
        if row is None:
            raise NotFound(f"no such user: {name}")
        return int(row[0])

    def _load(self, cur: Cursor, name: str) -> User:
        created = self._user_row(cur, name)
        q = self._cat._q
        groups = q(cur, "SELECT group_name FROM user_groups WHERE user_name = ?", (name,))
        group_names = frozenset(r[0] for r in groups.fetchall())
        keys = q(
            cur,
            "SELECT access_key FROM access_keys WHERE user_name = ? ORDER BY created_ns",
            (name,),
        ).fetchall()
        ssh = q(
            cur,
            "SELECT key_type, key_data, comment, created_ns FROM ssh_keys WHERE user_name = ? "
            "ORDER BY created_ns",
            (name,),
        ).fetchall()
        return User(
            name,
            group_names,
            created,
            tuple(r[0] for r in keys),
            tuple(SshKey(name, r[0], r[1], r[2], r[3]) for r in ssh),
        )

    async def get_user(self, name: str) -> User:
        return await self._cat._run(self._cat._read, lambda cur: self._load(cur, name))

    async def list_users(self) -> list[User]:
        def fn(cur: Cursor) -> list[User]:
            names = self._cat._q(cur, "SELECT name FROM users ORDER BY name").fetchall()
            return [self._load(cur, r[0]) for r in names]

        return await self._cat._run(self._cat._read, fn)

    # -- S3 access keys --------------------------------------------------------------------

    async def add_access_key(self, user: str, imported: tuple[str, str] | None = None) -> AccessKey:
        """A new key pair for ``user``; the caller shows the secret once. ``imported``
        is an existing (key id, secret) pair to take over, as when moving users off
        another S3 service that clients are configured for."""
        key_id, secret = imported or new_access_key()
        if not _ACCESS_KEY.match(key_id) or not 16 <= len(secret) <= 128:
            raise InvalidArgument("an access key id is 16-128 letters or digits, a secret 16-128")
        now = time.time_ns()

        def fn(cur: Cursor) -> None:
            self._user_row(cur, user)
            self._cat._q(
                cur,
                "INSERT INTO access_keys (access_key, user_name, secret, created_ns) "
                "VALUES (?, ?, ?, ?)",
                (key_id, user, secret, now),
            )

        await self._cat._run(self._cat._write, fn)
        return AccessKey(key_id, user, now, secret)

    async def remove_access_key(self, access_key: str) -> None:
        def fn(cur: Cursor) -> None:
            gone = self._cat._q(
                cur,
                "DELETE FROM access_keys WHERE access_key = ? RETURNING user_name",
                (access_key,),
            ).fetchone()
            if gone is None:
                raise NotFound(f"no such access key: {access_key}")

        await self._cat._run(self._cat._write, fn)
        self._found.pop(access_key, None)

    async def lookup_access_key(self, access_key: str) -> tuple[User, str] | None:
        """The user owning ``access_key`` and the key's secret, or None if unknown."""
        now = time.monotonic()
        known = self._found.get(access_key)
        if known is not None and known[2] > now:
            return known[0], known[1]
        found = await self._lookup_access_key(access_key)
        if found is not None and self._remember > 0:
            if len(self._found) >= MAX_REMEMBERED:  # keys of clients long gone
                self._found = {k: v for k, v in self._found.items() if v[2] > now}
            self._found[access_key] = (*found, now + self._remember)
        return found

    async def _lookup_access_key(self, access_key: str) -> tuple[User, str] | None:
        def fn(cur: Cursor) -> tuple[User, str] | None:
            row = self._cat._q(
                cur,
                "SELECT user_name, secret FROM access_keys WHERE access_key = ?",
                (access_key,),
            ).fetchone()
            return None if row is None else (self._load(cur, row[0]), row[1])

        return await self._cat._run(self._cat._read, fn)

    # -- SSH public keys -------------------------------------------------------------------

    async def add_ssh_key(self, user: str, line: str) -> SshKey:
        key_type, data, comment = parse_ssh_key(line)
        now = time.time_ns()

        def fn(cur: Cursor) -> None:
            self._user_row(cur, user)
            owner = self._cat._q(
                cur,
                "SELECT user_name FROM ssh_keys WHERE key_type = ? AND key_data = ?",
                (key_type, data),
            ).fetchone()
            if owner is not None:
                # one key, one user: otherwise a login would be ambiguous
                raise AlreadyExists(f"this SSH key already belongs to user {owner[0]}")
            self._cat._q(
                cur,
                "INSERT INTO ssh_keys (user_name, key_type, key_data, comment, created_ns) "
                "VALUES (?, ?, ?, ?, ?)",
                (user, key_type, data, comment, now),
            )

        await self._cat._run(self._cat._write, fn)
        return SshKey(user, key_type, data, comment, now)

    async def remove_ssh_key(self, user: str, line: str) -> None:
        key_type, data, _ = parse_ssh_key(line)

        def fn(cur: Cursor) -> None:
            gone = self._cat._q(
                cur,
                "DELETE FROM ssh_keys WHERE user_name = ? AND key_type = ? AND key_data = ? "
                "RETURNING key_type",
                (user, key_type, data),
            ).fetchone()
            if gone is None:
                raise NotFound(f"user {user} has no such SSH key")

        await self._cat._run(self._cat._write, fn)

    async def lookup_ssh_key(self, key_type: str, key_data: str) -> User | None:
        """The user an offered public key belongs to, or None."""

        def fn(cur: Cursor) -> User | None:
            row = self._cat._q(
                cur,
                "SELECT user_name FROM ssh_keys WHERE key_type = ? AND key_data = ?",
                (key_type, key_data),
            ).fetchone()
            return None if row is None else self._load(cur, row[0])

        return await self._cat._run(self._cat._read, fn)

    # -- SMB passwords ---------------------------------------------------------------------

    async def set_smb_password(self, user: str, nt_hash: str) -> SmbLogin:
        """Set ``user``'s SMB password by its NT hash (``nthash.nt_hash``); her first one
        also gives her the next free uid of the SMB range, kept from then on."""
        nt_hash = nt_hash.upper()
        if not _NT_HASH.match(nt_hash):
            raise InvalidArgument("an NT hash is 32 hexadecimal digits")
        now = time.time_ns()

        def fn(cur: Cursor) -> int:
            q = self._cat._q
            self._user_row(cur, user)
            row = q(cur, "SELECT uid FROM smb_passwords WHERE user_name = ?", (user,)).fetchone()
            if row is not None:
                q(
                    cur,
                    "UPDATE smb_passwords SET nt_hash = ?, changed_ns = ? WHERE user_name = ?",
                    (nt_hash, now, user),
                )
                return int(row[0])
            top = q(cur, "SELECT max(uid) FROM smb_passwords").fetchone()
            uid = max(SMB_UID_BASE, (top[0] or 0) + 1)
            q(
                cur,
                "INSERT INTO smb_passwords (user_name, uid, nt_hash, changed_ns) "
                "VALUES (?, ?, ?, ?)",
                (user, uid, nt_hash, now),
            )
            return uid

        uid = await self._cat._run(self._cat._write, fn)
        return SmbLogin(user, uid, nt_hash, now)

    async def smb_logins(self) -> list[SmbLogin]:
        """Every user with an SMB password, by uid."""

        def fn(cur: Cursor) -> list[SmbLogin]:
            rows = self._cat._q(
                cur,
                "SELECT user_name, uid, nt_hash, changed_ns FROM smb_passwords ORDER BY uid",
            ).fetchall()
            return [SmbLogin(r[0], int(r[1]), r[2], int(r[3])) for r in rows]

        return await self._cat._run(self._cat._read, fn)
