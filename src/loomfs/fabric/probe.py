"""A spoke's first look at its hub (fabric layer): can the mutual-TLS link be made, and if
not, whose configuration is wrong.

A request over a link that cannot be made fails only as "cannot connect" or "server
disconnected" (under TLS 1.3 a hub refuses a client's certificate after the client thinks
the handshake is done, by closing with an alert). So a spoke checks once at start, with a
bare TLS connection and one request, and tells apart: the hub is not the pinned one, the
hub does not pin this site, the address is not a TLS port (the hub's REST port, say), and
the hub is simply not reachable now (which is no error: a spoke serves its cache offline).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from pathlib import Path
from urllib.parse import urlsplit

from ..errors import BackendUnavailable, ConfigError
from ..rest.client import hub_urls

TIMEOUT = 10.0


async def check_links(
    urls: str, context: ssl.SSLContext, *, site: str, site_cert: Path, hub_cert: Path
) -> None:
    """``check_link`` of each of a hub's gateways (``hub_urls``) until one works: one
    gateway down is no reason to start offline. Wrong trust or a wrong address is a
    ``ConfigError`` at once."""
    failures: list[str] = []
    for url in hub_urls(urls):
        try:
            await check_link(url, context, site=site, site_cert=site_cert, hub_cert=hub_cert)
            return
        except BackendUnavailable as exc:
            failures.append(str(exc))
    raise BackendUnavailable("; ".join(failures))


async def check_link(
    url: str, context: ssl.SSLContext, *, site: str, site_cert: Path, hub_cert: Path
) -> None:
    """Return once a TLS link to the hub at ``url`` works; raise ``ConfigError`` saying
    what to fix where trust or the address is wrong, ``BackendUnavailable`` where the hub
    cannot be reached now."""
    parts = urlsplit(url)
    if parts.scheme != "https" or not parts.hostname:
        raise ConfigError(
            f"the hub's fabric URL must be https://HOST:PORT, not {url!r} "
            "(the address of [fabric] listen on the hub)"
        )
    # a blocking socket, in a thread: asyncio's TLS reads an alert after the handshake as
    # a plain end of stream, and the alert is what says this site is not trusted
    await asyncio.to_thread(
        _check, url, parts.hostname, parts.port or 443, context, site, site_cert, hub_cert
    )


def _check(
    url: str,
    host: str,
    port: int,
    context: ssl.SSLContext,
    site: str,
    site_cert: Path,
    hub_cert: Path,
) -> None:
    try:
        raw = socket.create_connection((host, port), timeout=TIMEOUT)
    except OSError as exc:
        raise BackendUnavailable(f"cannot reach the hub at {url}: {exc}") from exc
    with raw:
        try:
            tls = context.wrap_socket(raw, server_hostname=host)
        except ssl.SSLCertVerificationError as exc:
            raise ConfigError(
                f"the hub at {url} is not the hub pinned in {hub_cert} "
                f"({exc.verify_message}): give --hub-cert a copy of that hub's identity/site.pem"
            ) from None
        except ssl.SSLError as exc:
            raise ConfigError(
                f"{url} does not answer TLS ({exc.reason}): is it the hub's REST port? --hub "
                "takes the hub's fabric address ([fabric] listen on the hub)"
            ) from None
        except OSError as exc:
            raise BackendUnavailable(f"the hub at {url} dropped the link: {exc}") from exc
        with tls:
            request = f"GET /healthz HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
            try:
                tls.sendall(request.encode())
                answer = tls.recv(1)
            except ssl.SSLError as exc:  # the hub's alert: it does not pin this certificate
                answer, reason = b"", f" ({exc.reason})"
            except OSError as exc:
                raise BackendUnavailable(f"the hub at {url} dropped the link: {exc}") from exc
            else:
                reason = ""
            if not answer:  # a hub answers /healthz to every site it lets in
                raise ConfigError(
                    f"the hub at {url} refused this site's certificate{reason}: on the hub, "
                    f"run `loomfs site add {site} --cert FILE` with FILE a copy of {site_cert}"
                )
