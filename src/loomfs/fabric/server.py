"""The hub's end of the fabric link (protocol layer): the REST API over mutual TLS.

Spokes speak the same REST API as every other client (stat, list, ranged reads, writes,
the change feed as a long poll), so there is one server for both; what differs is who
is calling: the site named by the pinned certificate the spoke presented.
"""

from __future__ import annotations

import hashlib
import ssl
from collections.abc import Mapping

from aiohttp import web

from ..core.audit import AuditSink
from ..core.types import Principal
from ..errors import AuthenticationFailed
from ..hub.chunks import HubChunks
from ..namespace.base import Namespace
from ..rest.chunks import ChunkRoutes
from ..rest.server import RestServer, VolumeAdmin
from .identity import SiteIdentity, fingerprint


class FabricServer(RestServer):
    def __init__(
        self,
        namespace: Namespace,
        admin: VolumeAdmin | None,
        identity: SiteIdentity,
        trusted: Mapping[str, bytes],
        chunks: HubChunks | None = None,
        audit: AuditSink | None = None,
    ) -> None:
        """``trusted`` maps each pinned site's name to its certificate (PEM); with
        ``chunks``, spokes can move chunks instead of byte ranges; refusals are policy
        decisions and go to ``audit``."""
        super().__init__(namespace, admin, site=identity.name)
        self.chunks = chunks
        self.identity = identity
        self.audit = audit
        self._context = identity.server_context(trusted.values())
        self._sites: dict[str, str] = {}
        self.trust(trusted)

    def app(self) -> web.Application:
        app = super().app()
        if self.chunks is not None:
            ChunkRoutes(self, self.chunks).register(app)
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

    def principal(self, request: web.Request) -> Principal:
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
        return Principal(user=f"site:{site}", site=site, protocol="fabric")
