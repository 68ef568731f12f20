"""The sites a hub trusts (core layer): pinned certificates, labels, revocation.

``loomfs site add NAME --cert FILE`` pins a spoke's certificate; the fabric server accepts
exactly the pinned, unrevoked sites. Labels (``region=eu-west``) are what placement and
residency policies will match on. Rows live in the site catalog, like users.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Collection
from dataclasses import dataclass, field

from ..errors import AlreadyExists, InvalidArgument, NotFound, UnsupportedScheme
from .catalog.base import Catalog
from .catalog.sql import Cursor, SqlCatalog
from .certs import certificate_labels, certificate_name, fingerprint

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
#: names a spoke can't be pinned under: the site of principals made in the hub's own
#: process and loomfs's own users. With the hub's own names (``add``'s ``own``) they
#: would let a spoke's calls pass for the hub's own in a log or a decision keyed on names.
RESERVED_SITES = frozenset({"local", "system", "anonymous"})


@dataclass(frozen=True, slots=True)
class Site:
    name: str
    fingerprint: str
    labels: dict[str, str]
    added_ns: int
    revoked_ns: int | None
    cert_pem: bytes = field(repr=False)

    @property
    def trusted(self) -> bool:
        return self.revoked_ns is None


def parse_labels(items: list[str] | tuple[str, ...]) -> dict[str, str]:
    labels: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InvalidArgument(f"a label is KEY=VALUE, not {item!r}")
        labels[key] = value
    return labels


class SiteRegistry:
    def __init__(self, catalog: Catalog) -> None:
        if not isinstance(catalog, SqlCatalog):
            raise UnsupportedScheme(f"the site registry needs a SQL catalog, not {catalog.url}")
        self._cat = catalog

    async def add(
        self,
        cert_pem: bytes,
        labels: dict[str, str] | None = None,
        name: str | None = None,
        *,
        own: Collection[str] = (),
    ) -> Site:
        """Pin a site's certificate; its name is the certificate's (or must match it), its
        labels those the certificate carries, overridden by ``labels``. Refused for a
        reserved name and for ``own``, the names of the hub itself."""
        try:
            named = certificate_name(cert_pem)
            pin = fingerprint(cert_pem)
            labels = {**certificate_labels(cert_pem), **(labels or {})}
        except ValueError as exc:
            raise InvalidArgument(f"not a PEM certificate: {exc}") from None
        if name is not None and name != named:
            raise InvalidArgument(f"the certificate names site {named!r}, not {name!r}")
        if not _NAME.match(named):
            raise InvalidArgument(f"invalid site name {named!r}")
        if named.lower() in RESERVED_SITES | {o.lower() for o in own}:
            raise InvalidArgument(
                f"a spoke can't be pinned as {named!r}: that name is the hub's own or reserved "
                f"({', '.join(sorted(RESERVED_SITES))}); give the spoke another name with "
                "`loomfs site init --name`"
            )
        now = time.time_ns()

        def fn(cur: Cursor) -> None:
            q = self._cat._q
            if q(cur, "SELECT 1 FROM sites WHERE name = ?", (named,)).fetchone() is not None:
                raise AlreadyExists(
                    f"site {named} is already known; to pin a new certificate, first "
                    f"`loomfs site remove {named}`"
                )
            q(
                cur,
                "INSERT INTO sites (name, cert_pem, fingerprint, labels, added_ns) "
                "VALUES (?, ?, ?, ?, ?)",
                (named, cert_pem.decode(), pin, json.dumps(labels, sort_keys=True), now),
            )

        await self._cat._run(self._cat._write, fn)
        return Site(named, pin, labels, now, None, cert_pem)

    async def revoke(self, name: str) -> None:
        """Stop trusting a site (its row stays, for the record); re-adding needs removal."""

        def fn(cur: Cursor) -> None:
            q = self._cat._q
            if q(cur, "SELECT 1 FROM sites WHERE name = ?", (name,)).fetchone() is None:
                raise NotFound(f"no site named {name}")
            q(cur, "UPDATE sites SET revoked_ns = ? WHERE name = ?", (time.time_ns(), name))

        await self._cat._run(self._cat._write, fn)

    async def remove(self, name: str) -> None:
        def fn(cur: Cursor) -> None:
            q = self._cat._q
            if q(cur, "SELECT 1 FROM sites WHERE name = ?", (name,)).fetchone() is None:
                raise NotFound(f"no site named {name}")
            q(cur, "DELETE FROM sites WHERE name = ?", (name,))

        await self._cat._run(self._cat._write, fn)

    async def list(self) -> list[Site]:
        def fn(cur: Cursor) -> list[Site]:
            rows = self._cat._q(
                cur,
                "SELECT name, fingerprint, labels, added_ns, revoked_ns, cert_pem FROM sites "
                "ORDER BY name",
            ).fetchall()
            return [
                Site(r[0], r[1], json.loads(r[2]), r[3], r[4], str(r[5]).encode()) for r in rows
            ]

        return await self._cat._run(self._cat._read, fn)

    async def trusted(self) -> dict[str, bytes]:
        """Pinned, unrevoked sites: name -> certificate."""
        return {s.name: s.cert_pem for s in await self.list() if s.trusted}
