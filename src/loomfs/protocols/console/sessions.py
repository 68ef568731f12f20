"""The web console's logins (protocol layer): sessions, their cookies and CSRF tokens.

A session holds the credentials its user logged in with, in this process's memory only
(as the REST authenticator's cache holds them), and every request checks them again
through the site's authenticator: a removed key ends its sessions within that cache's
TTL. The cookie carries only the session's random id and expiry, signed with a key that
lives as long as the process (a restart logs everyone out), and is sent HttpOnly,
SameSite=Strict, to ``/ui`` only. Every form carries the session's CSRF token; the login
form, before there is a session, a token of its own cookie's (double submit).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass

COOKIE = "loomfs_session"
LOGIN_COOKIE = "loomfs_login"
TTL = 8 * 3600.0  # a working day: then the user logs in again
MAX_SESSIONS = 10000


@dataclass(frozen=True, slots=True)
class Session:
    id: str
    #: the ``Authorization: Basic`` header of the login, checked again on every request;
    #: never logged, never in a cookie
    credentials: str
    csrf: str
    until: float  # time.time() at which it ends


def same(given: str | None, expected: str) -> bool:
    """Whether a submitted token is the expected one (in constant time)."""
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


class Sessions:
    def __init__(self, ttl: float = TTL, key: bytes | None = None) -> None:
        self.ttl = ttl
        self._key = key or secrets.token_bytes(32)
        self._open: dict[str, Session] = {}

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
        signed = f"{session.id}.{int(session.until)}"
        return f"{signed}.{self._sign(signed)}", session

    def get(self, cookie: str | None) -> Session | None:
        """The live session a cookie names; None for a forged, expired or closed one."""
        if not cookie or cookie.count(".") != 2:
            return None
        signed, _, signature = cookie.rpartition(".")
        if not same(signature, self._sign(signed)):
            return None
        session = self._open.get(signed.partition(".")[0])
        if session is None or session.until <= time.time():
            return None
        return session

    def close(self, session: Session) -> None:
        self._open.pop(session.id, None)

    def login_token(self) -> tuple[str, str]:
        """(cookie value, form token) for a login form: the form's token is the cookie's
        value signed, so a page of another origin can't make one that passes."""
        value = secrets.token_urlsafe(24)
        return value, self._sign(f"login:{value}")

    def login_ok(self, cookie: str | None, token: str | None) -> bool:
        return cookie is not None and same(token, self._sign(f"login:{cookie}"))
