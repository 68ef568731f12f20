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

from ..core.types import Principal
from ..errors import AuthenticationFailed
from ..namespace.base import Namespace
from ..rest.server import RestServer, VolumeAdmin
from .identity import SiteIdentity, fingerprint


class FabricServer(RestServer):
    def __init__(
        self,
        namespace: Namespace,
        admin: VolumeAdmin | None,
        identity: SiteIdentity,
        trusted: Mapping[str, bytes],
    ) -> None:
        """``trusted`` maps each pinned site's name to its certificate (PEM)."""
        super().__init__(namespace, admin, site=identity.name)
        self.identity = identity
        self.trusted = dict(trusted)
        self._sites = {fingerprint(pem): name for name, pem in trusted.items()}

    def ssl_context(self) -> ssl.SSLContext:
        return self.identity.server_context(self.trusted.values())

    def principal(self, request: web.Request) -> Principal:
        tls = request.transport.get_extra_info("ssl_object") if request.transport else None
        der = tls.getpeercert(binary_form=True) if tls is not None else None
        site = self._sites.get(hashlib.sha256(der).hexdigest()) if der else None
        if site is None:
            # the handshake already pins certificates; this catches a site revoked since
            raise AuthenticationFailed("this site's certificate is not trusted by the hub")
        return Principal(user=f"site:{site}", site=site, protocol="fabric")
