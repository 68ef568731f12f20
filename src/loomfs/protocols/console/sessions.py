"""The web console's logins (protocol layer): sessions, their cookies and CSRF tokens.

A session holds the credentials its user logged in with, and every request checks them
again through the site's authenticator: a removed key ends its sessions within that
authenticator's cache TTL (the first request after that closes the session for good).
The cookie carries the session's random id and expiry, signed, and is sent HttpOnly,
SameSite=Strict, to ``/ui`` only. Every form carries the session's CSRF token; the login
form, before there is a session, a token of its own cookie's (double submit).

Given a ``store`` (a sqlite file in the site's data directory), the signing key and the
sessions outlive the process, so a restart logs nobody out. The file never holds what a
cookie could be made from, nor a secret: a session is found by a hash of its id, and
its credentials are sealed (AES-GCM) with a key derived from that id, which only the
cookie carries.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

COOKIE = "loomfs_session"
LOGIN_COOKIE = "loomfs_login"
TTL = 8 * 3600.0  # a working day: then the user logs in again
MAX_SESSIONS = 10000
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value BLOB NOT NULL)",
    "CREATE TABLE IF NOT EXISTS sessions (lookup TEXT PRIMARY KEY, csrf TEXT NOT NULL,"
    " until REAL NOT NULL, nonce BLOB NOT NULL, sealed BLOB NOT NULL)",
)


@dataclass(frozen=True, slots=True)
class Session:
    id: str
    #: the ``Authorization: Basic`` header of the login, checked again on every request;
    #: never logged, never in a cookie, sealed on disk
    credentials: str
    csrf: str
    until: float  # time.time() at which it ends


def same(given: str | None, expected: str) -> bool:
    """Whether a submitted token is the expected one (in constant time)."""
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


def _lookup(session_id: str) -> str:
    return hashlib.sha256(b"lookup:" + session_id.encode()).hexdigest()


def _seal_key(session_id: str) -> bytes:
    return hashlib.sha256(b"seal:" + session_id.encode()).digest()


class Sessions:
    def __init__(self, ttl: float = TTL, key: bytes | None = None, store: Path | None = None):
        """``store``: the sqlite file that keeps sessions over restarts (made 0600);
        without one they live as long as the process."""
        self.ttl = ttl
        self._open: dict[str, Session] = {}
        self.store = store
        if store is not None:
            store.parent.mkdir(parents=True, exist_ok=True)
            os.close(os.open(store, os.O_CREAT | os.O_WRONLY, 0o600))  # before sqlite opens it
            with self._db() as db:
                for statement in _SCHEMA:
                    db.execute(statement)
                db.execute("DELETE FROM sessions WHERE until <= ?", (time.time(),))
                # the first process's key signs every later one's cookies
                made = secrets.token_bytes(32)
                db.execute("INSERT OR IGNORE INTO meta VALUES ('key', ?)", (made,))
                stored = db.execute("SELECT value FROM meta WHERE name = 'key'").fetchone()
                key = key or bytes(stored[0])
        self._key = key or secrets.token_bytes(32)

    @contextlib.contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        """A connection to the store for one step: logins are rare, and a session is
        read from it once per process."""
        assert self.store is not None
        db = sqlite3.connect(self.store, isolation_level=None)
        try:
            yield db
        finally:
            db.close()

    def _sign(self, text: str) -> str:
        return hmac.new(self._key, text.encode(), hashlib.sha256).hexdigest()

    def open(self, credentials: str) -> tuple[str, Session]:
        """A new session for verified ``credentials``, and its cookie's value."""
        now = time.time()
        if len(self._open) >= MAX_SESSIONS:  # sessions of users long gone
            self._open = {k: s for k, s in self._open.items() if s.until > now}
        session = Session(
            secrets.token_urlsafe(24), credentials, secrets.token_urlsafe(24), now + self.ttl
        )
        self._open[session.id] = session
        if self.store is not None:
            nonce = secrets.token_bytes(12)
            sealed = AESGCM(_seal_key(session.id)).encrypt(nonce, credentials.encode(), None)
            with self._db() as db:
                db.execute("DELETE FROM sessions WHERE until <= ?", (now,))
                db.execute(
                    "INSERT INTO sessions VALUES (?, ?, ?, ?, ?)",
                    (_lookup(session.id), session.csrf, session.until, nonce, sealed),
                )
        signed = f"{session.id}.{int(session.until)}"
        return f"{signed}.{self._sign(signed)}", session

    def get(self, cookie: str | None) -> Session | None:
        """The live session a cookie names; None for a forged, expired or closed one."""
        if not cookie or cookie.count(".") != 2:
            return None
        signed, _, signature = cookie.rpartition(".")
        if not same(signature, self._sign(signed)):
            return None
        session_id = signed.partition(".")[0]
        session = self._open.get(session_id) or self._stored(session_id)
        if session is None or session.until <= time.time():
            return None
        return session

    def _stored(self, session_id: str) -> Session | None:
        """A session of an earlier process, unsealed with the id its cookie gave."""
        if self.store is None:
            return None
        with self._db() as db:
            row = db.execute(
                "SELECT csrf, until, nonce, sealed FROM sessions WHERE lookup = ?",
                (_lookup(session_id),),
            ).fetchone()
        if row is None:
            return None
        csrf, until, nonce, sealed = row
        try:
            credentials = AESGCM(_seal_key(session_id)).decrypt(nonce, sealed, None).decode()
        except InvalidTag:  # a file edited by hand: no session, rather than a wrong one
            return None
        session = Session(session_id, credentials, csrf, until)
        self._open[session_id] = session
        return session

    def close(self, session: Session) -> None:
        self._open.pop(session.id, None)
        if self.store is not None:
            with self._db() as db:
                db.execute("DELETE FROM sessions WHERE lookup = ?", (_lookup(session.id),))

    def login_token(self) -> tuple[str, str]:
        """(cookie value, form token) for a login form: the form's token is the cookie's
        value signed, so a page of another origin can't make one that passes."""
        value = secrets.token_urlsafe(24)
        return value, self._sign(f"login:{value}")

    def login_ok(self, cookie: str | None, token: str | None) -> bool:
        return cookie is not None and same(token, self._sign(f"login:{cookie}"))
