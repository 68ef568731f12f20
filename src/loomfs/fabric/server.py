"""The hub's end of the fabric link (protocol layer): the REST API over mutual TLS.

Spokes speak the same REST API as every other client (stat, list, ranged reads, writes,
the change feed as a long poll), so there is one server for both; what differs is who
is calling: the site named by the pinned certificate the spoke presented.

The trust model: the *site* is authenticated by its certificate; the *user* a spoke
serves is asserted by that site (``X-Loomfs-User``) and gets the groups the hub's
registry gives that name, so the hub's ACL rules decide for the end user wherever they
are. Every call is remote (protocol "fabric"), whatever the site is called and whatever
protocol it says its user came in by (``X-Loomfs-Protocol``, kept for audit only). A
spoke authenticates its own REST users by passing their Basic credentials through to
``/v1/whoami`` here, where the registry checks them. A pinned site is therefore trusted
to tell the truth about its users (it could name any user); revoking the site is the
remedy for one that does not. Administration is the exception: a user a site merely
names is never an administrator here (``core.acl``), only one whose own credentials the
hub checked. A spoke's own calls (its change feed, cache fills of versions a user was
already allowed, its journal's uploads) carry no user and act as ``site:NAME``.

``TlsSite`` serves it: a handshake the hub refuses (a site not pinned, a wrong address, plain
HTTP on the fabric port) is logged with the peer's address and the reason, which asyncio's
own TLS server keeps to its debug log.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import ssl
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web
from prometheus_client import Counter

from ..core.acl import ANONYMOUS, SITE_PREFIX
from ..core.audit import AuditSink
from ..core.certs import fingerprint
from ..core.metrics import HUB
from ..core.types import Principal
from ..core.users import RESERVED_USERS, UserRegistry, _check_name
from ..errors import AuthenticationFailed, InvalidArgument
from ..namespace.base import Namespace
from ..namespace.chunklink import ChunkService
from ..namespace.governed import GovernedNamespace
from ..rest import wire
from ..rest.auth import RegistryAuthenticator
from ..rest.chunks import ChunkRoutes
from ..rest.server import RestServer, VolumeAdmin
from .identity import SiteIdentity

FABRIC = "fabric"  # the protocol of every call that comes over the link

log = logging.getLogger(__name__)

REFUSED_HANDSHAKES = Counter(
    "loomfs_fabric_refused_handshakes_total",
    "TLS handshakes the fabric link refused",
    registry=HUB,
)
HANDSHAKE_TIMEOUT = 30.0


class FabricServer(RestServer):
    def __init__(
        self,
        namespace: Namespace,
        admin: VolumeAdmin | None,
        identity: SiteIdentity,
        trusted: Mapping[str, bytes],
        *,
        chunks: ChunkService | None = None,
        audit: AuditSink | None = None,
        users: UserRegistry | None = None,
        groups_of: Callable[[str], frozenset[str]] = lambda _: frozenset(),
        governance: GovernedNamespace | None = None,
    ) -> None:
        """``trusted`` maps each pinned site's name to its certificate (PEM); with
        ``chunks``, spokes can move chunks instead of byte ranges; refusals are policy
        decisions and go to ``audit``; ``users`` checks the credentials spokes pass
        through, ``groups_of`` names a user's groups; ``governance`` decides the
        administration routes, as on the hub's REST API (without it they refuse all)."""
        super().__init__(namespace, admin, site=identity.name, governance=governance)
        self.chunks = chunks
        self.identity = identity
        self.audit = audit
        self._credentials = (
            RegistryAuthenticator(users, site=identity.name, anonymous=False) if users else None
        )
        self._groups_of = groups_of
        self._context = identity.server_context(trusted.values())
        self._sites: dict[str, str] = {}
        self.trust(trusted)

    def app(self) -> web.Application:
        app = super().app()
        if self.chunks is not None:
            ChunkRoutes(self, self.chunks, audit=self.audit).register(app)
        return app

    def ssl_context(self) -> ssl.SSLContext:
        return self._context

    def trust(self, trusted: Mapping[str, bytes]) -> None:
        """Follow the pinned set as it changes: a new site can connect at once (its
        certificate joins the live context); a revoked one is refused on every request
        (a context can't unlearn a certificate, so the check is here too)."""
        known = set(self._sites)
        for pem in trusted.values():
            if fingerprint(pem) not in known:
                self._context.load_verify_locations(cadata=pem.decode())
        self._sites = {fingerprint(pem): name for name, pem in trusted.items()}

    def _site(self, request: web.Request) -> str:
        tls = request.transport.get_extra_info("ssl_object") if request.transport else None
        der = tls.getpeercert(binary_form=True) if tls is not None else None
        peer = hashlib.sha256(der).hexdigest() if der else None
        site = self._sites.get(peer) if peer else None
        if site is None:
            if self.audit is not None:
                # the site is named by the certificate it presented, as far as known
                who = Principal("unknown", site=f"cert:{(peer or 'none')[:16]}", protocol="fabric")
                self.audit.record(
                    who,
                    "connect",
                    request.path,
                    "denied",
                    detail=f"{request.method}: site certificate not trusted (revoked or unknown)",
                )
            # the handshake already pins certificates; this catches a site revoked since
            raise AuthenticationFailed("this site's certificate is not trusted by the hub")
        return site

    async def authenticate(self, request: web.Request) -> Principal:
        """The caller: the pinned site, acting for itself or for the user it names. The
        protocol is always this listener's ("fabric"): what a spoke says its user came in
        by is kept for the audit log only, so no header can make a call look local."""
        site = self._site(request)
        forwarded = request.headers.get(wire.PROTOCOL_HEADER)
        if forwarded is not None and not forwarded.isidentifier():
            raise AuthenticationFailed(f"site {site} forwarded an invalid protocol {forwarded!r}")
        header = request.headers.get("Authorization")
        if header is not None:  # a spoke checking its user's credentials
            if self._credentials is None:
                raise AuthenticationFailed("this hub has no user registry to check credentials")
            found = await self._credentials.identify(header)
            return Principal(
                found.user, found.groups, site=site, protocol=FABRIC, forwarded=forwarded
            )
        user = request.headers.get(wire.USER_HEADER)
        if user is None:
            return Principal(f"{SITE_PREFIX}{site}", site=site, protocol=FABRIC)
        if user == ANONYMOUS:
            return Principal(user, site=site, protocol=FABRIC, forwarded=forwarded)
        try:
            _check_name(user, "user name")
        except InvalidArgument:
            raise AuthenticationFailed(f"site {site} forwarded an invalid user {user!r}") from None
        if user in RESERVED_USERS:
            raise AuthenticationFailed(f"site {site} may not act as {user}")
        return Principal(
            user,
            self._groups_of(user),
            site=site,
            protocol=FABRIC,
            forwarded=forwarded,
            asserted=True,
        )


class TlsSite(web.TCPSite):
    """An aiohttp site that does the TLS handshake itself (``loop.start_tls``) so that a
    refused one is seen: logged as a warning with the peer and the reason, and counted."""

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site; TCPSite.start would listen
        loop = asyncio.get_running_loop()
        serve, context = self._runner.server, self._ssl_context
        assert serve is not None and context is not None
        self._server = await loop.create_server(
            lambda: _Handshake(serve, context),
            self._host,
            self._port,
            backlog=self._backlog,
            reuse_address=self._reuse_address,
            reuse_port=self._reuse_port,
        )
        self._bound_port = self._server.sockets[0].getsockname()[1]


class _Handshake(asyncio.Protocol):
    """One accepted connection until its handshake is done; then the HTTP server's own
    protocol takes it over, with the bytes that came with the end of the handshake."""

    def __init__(self, serve: Callable[[], asyncio.BaseProtocol], context: ssl.SSLContext):
        self._serve = serve
        self._context = context
        self._inner: Any = None  # aiohttp's RequestHandler, once the handshake is done
        self._early: list[bytes] = []
        self._lost = False
        self._task: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.pause_reading()  # the handshake's bytes are start_tls's to read
        self._task = asyncio.get_running_loop().create_task(self._handshake(transport))

    async def _handshake(self, transport: asyncio.Transport) -> None:
        peer = transport.get_extra_info("peername")
        try:
            tls = await asyncio.get_running_loop().start_tls(
                transport, self, self._context, server_side=True,
                ssl_handshake_timeout=HANDSHAKE_TIMEOUT,
            )  # fmt: skip
        except (OSError, TimeoutError) as exc:  # ssl.SSLError is an OSError
            REFUSED_HANDSHAKES.inc()
            address = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
            log.warning("refused a TLS handshake", extra={"peer": address, "reason": _reason(exc)})
            transport.close()
            return
        if tls is None or self._lost:
            return
        self._inner = self._serve()
        tls.set_protocol(self._inner)
        self._inner.connection_made(tls)
        for data in self._early:
            self._inner.data_received(data)
        self._early.clear()

    def data_received(self, data: bytes) -> None:
        if self._inner is None:
            self._early.append(data)
        else:
            self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._inner is not None else None

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        if self._inner is not None:
            self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()


def _reason(exc: BaseException) -> str:
    """What OpenSSL said, in its words: the reason code, and why a certificate failed."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"{exc.reason}: {exc.verify_message}"
    if isinstance(exc, ssl.SSLError):
        return str(exc.reason or exc)
    if isinstance(exc, TimeoutError):
        return "no handshake within the time allowed"
    return str(exc) or type(exc).__name__
