"""Who is calling the REST API (protocol layer, server side): authentication only.

A caller presents HTTP Basic credentials, the access key id and secret that ``loomfs user
add`` makes (the same pair S3 clients sign with), or nothing, which makes it the anonymous
caller where ``[hub] anonymous`` allows it. What a caller may then do is decided in the
namespace layer (``namespace.governed``), never here.

A hub checks credentials against its user registry; a spoke has no registry and asks its
hub (``GET /v1/whoami`` over the fabric link, the credentials passed through), so a user
is the same user at every site. Either way a verified pair is remembered for ``ttl``
seconds, so a client's requests cost one check per ``ttl``, and a removed key stops
working within that time; a spoke that cannot reach its hub keeps the identities the hub
gave it, so its users go on reading what the hub let them read while the link is down.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import time
from abc import ABC, abstractmethod
from typing import NamedTuple

from aiohttp import web

from ..core.acl import ANONYMOUS
from ..core.types import Principal
from ..core.users import UserRegistry
from ..errors import AuthenticationFailed, BackendUnavailable
from .client import RestNamespace

CHALLENGE = 'Basic realm="loomfs"'
TTL = 2.0


class Identity(NamedTuple):
    user: str
    groups: frozenset[str]


def parse_basic(header: str) -> tuple[str, str]:
    """(access key id, secret) of an ``Authorization: Basic`` header."""
    scheme, _, encoded = header.strip().partition(" ")
    if scheme.lower() != "basic":
        raise AuthenticationFailed(
            f"unsupported authorization scheme {scheme!r}: use HTTP Basic with an access key "
            "id and secret"
        )
    try:
        key, sep, secret = base64.b64decode(encoded.strip(), validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        raise AuthenticationFailed("the Basic credentials are not valid base64") from None
    if not sep or not key:
        raise AuthenticationFailed("Basic credentials are ACCESS_KEY_ID:SECRET")
    return key, secret


class Authenticator(ABC):
    """Turns a request into a ``Principal``; subclasses say how credentials are checked."""

    def __init__(self, *, site: str, anonymous: bool, ttl: float = TTL) -> None:
        self.site = site
        self.anonymous = anonymous
        self.ttl = ttl
        # Authorization header as sent -> (identity, until): one dict lookup per request.
        # The header holds the secret, as the catalog does (SigV4 needs it in the clear);
        # neither is ever logged.
        self._known: dict[str, tuple[Identity, float]] = {}

    async def __call__(self, request: web.Request) -> Principal:
        return await self.principal_of(request.headers.get("Authorization"))

    async def principal_of(self, header: str | None) -> Principal:
        """The caller an ``Authorization`` header (or none) stands for, over REST (an
        HTTP request, or a local read the REST API announced: ``rest.local``)."""
        if header is None:
            if not self.anonymous:
                raise AuthenticationFailed(
                    "this site needs credentials: HTTP Basic with an access key id and secret "
                    "(`loomfs user add` makes them; the CLI reads [client] access_key and "
                    "secret_key or LOOMFS_ACCESS_KEY and LOOMFS_SECRET_KEY)"
                )
            return Principal(ANONYMOUS, site=self.site, protocol="rest")
        identity = await self.identify(header)
        return Principal(identity.user, identity.groups, site=self.site, protocol="rest")

    async def identify(self, header: str) -> Identity:
        """The identity of an ``Authorization`` header's Basic credentials."""
        known = self._known.get(header)
        now = time.monotonic()
        if known is not None and known[1] > now:
            return known[0]
        try:
            identity = await self._verify(*parse_basic(header))
        except BackendUnavailable:
            # a spoke cut off from its hub: whoever the hub last said these credentials
            # are, they still are (no revocation can arrive meanwhile); what that user may
            # read is still the hub's earlier word (the spoke's admissions)
            if known is None:
                raise
            return known[0]
        if len(self._known) > 10000:  # expired pairs of clients long gone
            self._known = {k: v for k, v in self._known.items() if v[1] > now}
        self._known[header] = (identity, now + self.ttl)
        return identity

    @abstractmethod
    async def _verify(self, key: str, secret: str) -> Identity:
        """The identity owning the pair; ``AuthenticationFailed`` if it is wrong."""


class RegistryAuthenticator(Authenticator):
    """A hub's: the pair is checked against the site's user registry."""

    def __init__(self, users: UserRegistry, *, site: str, anonymous: bool, ttl: float = TTL):
        super().__init__(site=site, anonymous=anonymous, ttl=ttl)
        self.users = users

    async def _verify(self, key: str, secret: str) -> Identity:
        found = await self.users.lookup_access_key(key)
        # compared in constant time, and an unknown key fails the same way as a wrong secret
        expected = found[1] if found is not None else ""
        if found is None or not hmac.compare_digest(expected.encode(), secret.encode()):
            raise AuthenticationFailed("wrong access key id or secret")
        return Identity(found[0].name, found[0].groups)


class HubAuthenticator(Authenticator):
    """A spoke's: it has no user registry, so its hub checks the pair, passed through
    over the fabric link."""

    def __init__(self, hub: RestNamespace, *, site: str, anonymous: bool, ttl: float = TTL):
        super().__init__(site=site, anonymous=anonymous, ttl=ttl)
        self.hub = hub

    async def _verify(self, key: str, secret: str) -> Identity:
        found = await self.hub.whoami((key, secret))
        return Identity(found["user"], frozenset(found["groups"]))
