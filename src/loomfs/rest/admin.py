"""The hub's admin API (protocol layer): users, keys, groups, ACL rules, trusted sites,
placement policies, exports (NFS exports and SMB shares added and removed) and the audit
log over REST,
under ``/v1/admin``; ``AdminApi`` is the same calls for the web console (``console``).

Every route is administration, never open: an explicit admin right (``core.acl``) on the
path it governs (an ACL rule's path, a policy's globs, an NFS export's or SMB share's
directory; "/" for
users, groups, sites and every listing), then the call (``core.directory``), then one
audit record of its outcome (``GovernedNamespace.administered``). Bad input is a 400
before anything is decided. A new access key's secret is in its answer only: never in a
log line or an audit record.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from aiohttp import web

from .. import paths
from ..config import Config
from ..core.audit import AuditReader
from ..core.directory import Directory
from ..core.exports import DEFAULT as DEFAULT_EXPORTS
from ..core.exports import DEFAULT_SHARES, NfsExports, SmbShares, nfs_export, smb_share
from ..core.placement import Policy
from ..core.sites import parse_labels
from ..core.types import Principal
from ..errors import InvalidArgument, NotSupported
from ..namespace.governed import GovernedNamespace
from . import wire
from .server import WHO, _body, _int, _json

ADMIN = wire.ADMIN
MAX_AUDIT = 10000  # records one audit query answers with at most
T = TypeVar("T")


class Volumes(Protocol):
    """The hub's volumes, as ``rest.server.VolumeAdmin`` has them."""

    async def list_volumes(self) -> list[dict[str, Any]]: ...

    async def add_volume(self, mount: str, url: str, progress: Callable[[Any], None]) -> Any: ...

    async def remove_volume(self, mount: str) -> None: ...


_GLOB = frozenset("*?[")


def _text(body: dict[str, Any], name: str, what: str) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"{what} needs '{name}', a non-empty string")
    return value


def _texts(body: dict[str, Any], name: str, what: str) -> list[str]:
    value = body.get(name, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidArgument(f"{what}: '{name}' must be a list of strings")
    return value


def _governed(policy: Policy) -> list[str]:
    """The paths a policy governs, for the admin check: each glob's literal prefix, and
    "/" for a tag (tagged files are covered wherever they are)."""
    prefixes = []
    for glob in policy.paths:
        parts = glob.split("/")
        literal = next((i for i, part in enumerate(parts) if _GLOB & set(part)), len(parts))
        prefixes.append(paths.normalize("/".join(parts[:literal]) or "/"))
    return ["/"] if policy.tag is not None else prefixes


def exports_of(config: Config) -> dict[str, Any]:
    """What each protocol serves, as ``config`` has it (with the defaults a server uses
    when none is set). The S3 and SFTP servers take theirs when they start, so a change
    is an edit of the config file and a restart; NFS exports and SMB shares may be added
    at run time too (``NfsExports``, ``SmbShares``)."""
    nfs, smb, s3, sftp = config.nfs, config.smb, config.s3, config.sftp
    return {
        "s3": {"listen": s3.listen, "buckets": dict(s3.buckets), "bucket_root": s3.bucket_root},
        "sftp": {"listen": sftp.listen, "root": sftp.root},
        "nfs": {
            "listen": nfs.listen,
            "exports": [
                {"path": path, **export.model_dump(), "source": "config"}
                for path, export in sorted((nfs.exports or DEFAULT_EXPORTS).items())
            ],
        },
        "smb": {
            "listen": smb.listen,
            "shares": [
                {"share": name, **share.model_dump(), "source": "config"}
                for name, share in sorted((smb.shares or DEFAULT_SHARES).items())
            ],
        },
    }


def _none() -> web.Response:
    return web.Response(status=204)


class AdminApi:
    """The admin API's calls, each decided and recorded by ``governance``
    (``administered``): what the REST routes below and the web console (``console``) call,
    so both administer alike. Arguments are checked already (the routes parse them)."""

    def __init__(
        self,
        directory: Directory,
        governance: GovernedNamespace,
        *,
        audit: AuditReader | None = None,
        volumes: Volumes | None = None,
        exports: dict[str, Any] | None = None,
        nfs: NfsExports | None = None,
        smb: SmbShares | None = None,
    ) -> None:
        """``audit``: the site's audit log, for ``audit_query``; ``volumes``: the hub's,
        for ``list_volumes``; ``exports``: what its protocols serve (``exports_of``);
        ``nfs``, ``smb``: its NFS exports and SMB shares in force, to add and remove."""
        self.directory = directory
        self.governance = governance
        self.audit = audit
        self.volumes = volumes
        self.exports = exports
        self.nfs = nfs
        self.smb = smb

    async def _do(
        self, who: Principal, op: str, path: str, call: Callable[[], Awaitable[T]], detail: str = ""
    ) -> T:
        return await self.governance.administered(who, op, path, call, detail=detail)

    # -- users and keys --------------------------------------------------------------------

    async def list_users(self, who: Principal) -> list[dict[str, Any]]:
        return await self._do(who, "list_users", "/", self.directory.list_users)

    async def add_user(
        self, who: Principal, name: str, groups: list[str], ssh_key: str | None = None
    ) -> dict[str, Any]:
        """The new user and its first access key (the secret in this answer only)."""
        return await self._do(
            who, "add_user", "/", lambda: self.directory.add_user(name, groups, ssh_key),
            detail=f"user {name}, groups {','.join(sorted(groups)) or '-'}",
        )  # fmt: skip

    async def remove_user(self, who: Principal, name: str) -> None:
        await self._do(
            who, "remove_user", "/", lambda: self.directory.remove_user(name),
            detail=f"user {name}",
        )  # fmt: skip

    async def add_access_key(self, who: Principal, name: str) -> dict[str, Any]:
        return await self._do(
            who, "add_access_key", "/", lambda: self.directory.add_access_key(name),
            detail=f"user {name}",
        )  # fmt: skip

    async def add_ssh_key(self, who: Principal, name: str, line: str) -> dict[str, Any]:
        return await self._do(
            who, "add_ssh_key", "/", lambda: self.directory.add_ssh_key(name, line),
            detail=f"user {name}",
        )  # fmt: skip

    async def set_smb_password(self, who: Principal, name: str, nt_hash: str) -> dict[str, Any]:
        return await self._do(
            who, "set_smb_password", "/",
            lambda: self.directory.set_smb_password(name, nt_hash),
            detail=f"user {name}",
        )  # fmt: skip

    async def remove_access_key(self, who: Principal, name: str, access_key: str) -> None:
        await self._do(
            who, "remove_access_key", "/",
            lambda: self.directory.remove_access_key(name, access_key),
            detail=f"user {name}, access key {access_key}",
        )  # fmt: skip

    async def remove_ssh_key(self, who: Principal, name: str, line: str) -> None:
        await self._do(
            who, "remove_ssh_key", "/", lambda: self.directory.remove_ssh_key(name, line),
            detail=f"user {name}",
        )  # fmt: skip

    # -- groups and rules ------------------------------------------------------------------

    async def list_groups(self, who: Principal) -> list[dict[str, Any]]:
        return await self._do(who, "list_groups", "/", self.directory.list_groups)

    async def add_group(self, who: Principal, name: str) -> None:
        await self._do(
            who, "add_group", "/", lambda: self.directory.add_group(name), detail=f"group {name}"
        )

    async def remove_group(self, who: Principal, name: str) -> None:
        await self._do(
            who, "remove_group", "/", lambda: self.directory.remove_group(name),
            detail=f"group {name}",
        )  # fmt: skip

    async def set_member(self, who: Principal, group: str, user: str, *, member: bool) -> None:
        await self._do(
            who, "set_member", "/",
            lambda: self.directory.set_member(group, user, member=member),
            detail=f"group {group}, user {user}, member {member}",
        )  # fmt: skip

    async def list_rules(self, who: Principal) -> dict[str, Any]:
        return await self._do(who, "list_acl", "/", self.directory.list_rules)

    async def grant(
        self, who: Principal, subject: str, permission: str, path: str
    ) -> dict[str, Any]:
        path = paths.normalize(path)
        return await self._do(
            who, "acl_grant", path, lambda: self.directory.grant(subject, permission, path),
            detail=f"{subject} {permission}",
        )  # fmt: skip

    async def revoke(self, who: Principal, subject: str, permission: str, path: str) -> None:
        path = paths.normalize(path)
        await self._do(
            who, "acl_revoke", path, lambda: self.directory.revoke(subject, permission, path),
            detail=f"{subject} {permission}",
        )  # fmt: skip

    async def set_private(self, who: Principal, path: str, private: bool) -> None:
        path = paths.normalize(path)
        await self._do(
            who, "acl_private", path, lambda: self.directory.set_private(path, private),
            detail=f"private {private}",
        )  # fmt: skip

    # -- sites and policies ----------------------------------------------------------------

    async def list_sites(self, who: Principal) -> list[dict[str, Any]]:
        return await self._do(who, "list_sites", "/", self.directory.list_sites)

    async def add_site(
        self, who: Principal, cert: bytes, labels: dict[str, str], name: str | None
    ) -> dict[str, Any]:
        return await self._do(
            who, "add_site", "/", lambda: self.directory.add_site(cert, labels, name),
            detail=f"site {name or '(named by its certificate)'}",
        )  # fmt: skip

    async def revoke_site(self, who: Principal, name: str) -> None:
        await self._do(
            who, "revoke_site", "/", lambda: self.directory.revoke_site(name),
            detail=f"site {name}",
        )  # fmt: skip

    async def remove_site(self, who: Principal, name: str) -> None:
        await self._do(
            who, "remove_site", "/", lambda: self.directory.remove_site(name),
            detail=f"site {name}",
        )  # fmt: skip

    async def list_policies(self, who: Principal) -> list[dict[str, Any]]:
        return await self._do(who, "list_policies", "/", self.directory.list_policies)

    async def put_policy(self, who: Principal, policy: Policy) -> int:
        """Store a policy; the answer is the change to settle on (``/v1/settle``)."""
        governed = _governed(policy)
        for path in governed[1:]:  # each path it governs is the caller's to administer
            await self.governance.authorize_admin(who, "put_policy", path)
        return await self._do(
            who, "put_policy", governed[0], lambda: self.directory.put_policy(policy),
            detail=f"policy {policy.name}: {' '.join(policy.paths)}",
        )  # fmt: skip

    async def remove_policy(self, who: Principal, name: str) -> None:
        known = {p.name: p for p in await self.directory.policies.list()}
        # an unknown name is decided on "/", so who may not administer learns nothing
        governed = _governed(known[name]) if name in known else ["/"]
        for path in governed[1:]:
            await self.governance.authorize_admin(who, "remove_policy", path)
        await self._do(
            who, "remove_policy", governed[0], lambda: self.directory.remove_policy(name),
            detail=f"policy {name}",
        )  # fmt: skip

    # -- volumes, exports and the audit log ------------------------------------------------

    async def list_exports(self, who: Principal) -> dict[str, Any]:
        """Each protocol's exports (``exports_of``), the NFS and SMB ones in force now."""
        exports, nfs, smb = self.exports, self.nfs, self.smb
        if exports is None:
            raise NotSupported("this site was given no export configuration")

        async def listed() -> dict[str, Any]:
            found = dict(exports)
            if nfs is not None:
                found["nfs"] = {**exports["nfs"], "exports": await nfs.listed()}
            if smb is not None:
                found["smb"] = {**exports["smb"], "shares": await smb.listed()}
            return found

        return await self._do(who, "list_exports", "/", listed)

    def _nfs(self) -> NfsExports:
        if self.nfs is None:
            raise NotSupported("this site adds no NFS exports at run time: it is a spoke")
        return self.nfs

    async def add_nfs_export(self, who: Principal, path: str, fields: dict[str, Any]) -> Any:
        """Export ``path`` over NFS (``fields``: clients, access, squash, anonymous), decided
        on the path as an ACL rule is: served from the NFS server's next MNT."""
        nfs, (path, export) = self._nfs(), nfs_export(path, fields)
        return await self._do(
            who, "add_nfs_export", path, lambda: nfs.add(path, export),
            detail=f"clients {','.join(export.clients)}, {export.access}, squash {export.squash}",
        )  # fmt: skip

    async def remove_nfs_export(self, who: Principal, path: str) -> None:
        """No new mount of ``path``; the handles given out under it are STALE."""
        nfs, (path, _) = self._nfs(), nfs_export(path, {})
        await self._do(who, "remove_nfs_export", path, lambda: nfs.remove(path))

    def _smb(self) -> SmbShares:
        if self.smb is None:
            raise NotSupported("this site adds no SMB shares at run time: it is a spoke")
        return self.smb

    async def add_smb_share(self, who: Principal, name: str, fields: dict[str, Any]) -> Any:
        """Share ``fields["path"]`` over SMB as ``name`` (``access`` ro or rw), decided on
        the path as an ACL rule is: smbd serves it within seconds, no restart."""
        smb, (name, share) = self._smb(), smb_share(name, fields)
        return await self._do(
            who, "add_smb_share", share.path, lambda: smb.add(name, share),
            detail=f"share {name}, {share.access}",
        )  # fmt: skip

    async def remove_smb_share(self, who: Principal, name: str) -> None:
        """Share ``name`` takes no new connection. Decided on its path; an unknown name
        on "/", so who may not administer learns nothing."""
        smb = self._smb()
        known = {n.lower(): s for n, s in (await smb.table()).items()}
        path = known[name.lower()].path if name.lower() in known else "/"
        await self._do(
            who, "remove_smb_share", path, lambda: smb.remove(name), detail=f"share {name}"
        )

    async def list_volumes(self, who: Principal) -> list[dict[str, Any]]:
        return await self._do(who, "list_volumes", "/", self._volumes().list_volumes)

    def _volumes(self) -> Volumes:
        if self.volumes is None:
            raise NotSupported("this site has no volumes of its own: it is a spoke")
        return self.volumes

    async def add_volume(self, who: Principal, mount: str, url: str) -> dict[str, object]:
        """Assimilate ``url`` at ``mount`` (as ``POST /v1/volumes`` does, decided on the
        mount); the import's totals once it is done."""
        volumes, mount = self._volumes(), paths.normalize(mount)
        stats = await self._do(
            who, "add_volume", mount, lambda: volumes.add_volume(mount, url, lambda _: None),
            detail=f"storage {url}",
        )  # fmt: skip
        return dict(stats.as_dict())

    async def remove_volume(self, who: Principal, mount: str) -> None:
        volumes, mount = self._volumes(), paths.normalize(mount)
        await self._do(who, "remove_volume", mount, lambda: volumes.remove_volume(mount))

    async def audit_query(
        self,
        who: Principal,
        *,
        user: str | None = None,
        path: str | None = None,
        protocol: str | None = None,
        since: int | None = None,
        until: int | None = None,
        limit: int = 200,
    ) -> list[dict[str, Any]]:
        """The newest ``limit`` records matching every filter given, oldest first (times
        in ns since the epoch); reading the audit log is administration of "/"."""
        reader = self.audit
        if reader is None:
            raise NotSupported("this site keeps no audit log ([audit] enabled = false)")

        def newest() -> list[dict[str, Any]]:
            found = reader.query(
                user=user, path_prefix=path, protocol=protocol, since=since, until=until
            )
            return [r.as_dict() for r in collections.deque(found, maxlen=limit)]

        return await self._do(
            who, "audit_query", "/", lambda: asyncio.to_thread(newest),
            detail=" ".join(
                f"{k}={v}" for k, v in
                (("user", user), ("path", path), ("protocol", protocol)) if v
            ),
        )  # fmt: skip


class AdminRoutes:
    """The admin API over REST: each route parses its request (bad input is a 400 before
    anything is decided) and makes one ``AdminApi`` call as the caller."""

    def __init__(self, api: AdminApi) -> None:
        self.api = api

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get(f"{ADMIN}/users", self.list_users),
            web.post(f"{ADMIN}/users", self.add_user),
            web.delete(f"{ADMIN}/users/{{name}}", self.remove_user),
            web.post(f"{ADMIN}/users/{{name}}/keys", self.add_key),
            web.delete(f"{ADMIN}/users/{{name}}/keys", self.remove_key),
            web.put(f"{ADMIN}/users/{{name}}/smb-password", self.set_smb_password),
            web.get(f"{ADMIN}/groups", self.list_groups),
            web.post(f"{ADMIN}/groups", self.add_group),
            web.delete(f"{ADMIN}/groups/{{name}}", self.remove_group),
            web.post(f"{ADMIN}/groups/{{name}}/members", self.set_member),
            web.get(f"{ADMIN}/acl", self.list_rules),
            web.post(f"{ADMIN}/acl/grant", self.grant),
            web.post(f"{ADMIN}/acl/revoke", self.revoke),
            web.post(f"{ADMIN}/acl/private", self.set_private),
            web.get(f"{ADMIN}/sites", self.list_sites),
            web.post(f"{ADMIN}/sites", self.add_site),
            web.post(f"{ADMIN}/sites/{{name}}/revoke", self.revoke_site),
            web.delete(f"{ADMIN}/sites/{{name}}", self.remove_site),
            web.get(f"{ADMIN}/policies", self.list_policies),
            web.post(f"{ADMIN}/policies", self.put_policy),
            web.delete(f"{ADMIN}/policies/{{name}}", self.remove_policy),
            web.get(f"{ADMIN}/audit", self.audit_query),
            web.get(f"{ADMIN}/exports", self.list_exports),
            web.post(f"{ADMIN}/exports/nfs", self.add_nfs_export),
            web.delete(f"{ADMIN}/exports/nfs", self.remove_nfs_export),
            web.post(f"{ADMIN}/exports/smb", self.add_smb_share),
            web.delete(f"{ADMIN}/exports/smb", self.remove_smb_share),
        ]

    # -- users and keys --------------------------------------------------------------------

    async def list_users(self, request: web.Request) -> web.Response:
        return _json(await self.api.list_users(request[WHO]))

    async def add_user(self, request: web.Request) -> web.Response:
        body = await _body(request)
        name = _text(body, "user", "adding a user")
        groups = _texts(body, "groups", "adding a user")
        ssh_key = body.get("ssh_key")
        if ssh_key is not None and not isinstance(ssh_key, str):
            raise InvalidArgument("adding a user: 'ssh_key' is a public key line")
        return _json(await self.api.add_user(request[WHO], name, groups, ssh_key), 201)

    async def remove_user(self, request: web.Request) -> web.Response:
        await self.api.remove_user(request[WHO], request.match_info["name"])
        return _none()

    async def add_key(self, request: web.Request) -> web.Response:
        """A new access key (its secret in this answer only), or ``ssh_key``'s line."""
        name = request.match_info["name"]
        line = (await _body(request)).get("ssh_key")
        if line is not None:
            if not isinstance(line, str):
                raise InvalidArgument("'ssh_key' is a public key line")
            return _json(await self.api.add_ssh_key(request[WHO], name, line), 201)
        return _json(await self.api.add_access_key(request[WHO], name), 201)

    async def set_smb_password(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        nt_hash = _text(await _body(request), "nt_hash", "setting an SMB password")
        return _json(await self.api.set_smb_password(request[WHO], name, nt_hash))

    async def remove_key(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        access_key, line = request.query.get("access_key"), request.query.get("ssh_key")
        if (access_key is None) == (line is None):
            raise InvalidArgument("removing a key needs exactly one of ?access_key= and ?ssh_key=")
        if line is not None:
            await self.api.remove_ssh_key(request[WHO], name, line)
        else:
            assert access_key is not None
            await self.api.remove_access_key(request[WHO], name, access_key)
        return _none()

    # -- groups and rules ------------------------------------------------------------------

    async def list_groups(self, request: web.Request) -> web.Response:
        return _json(await self.api.list_groups(request[WHO]))

    async def add_group(self, request: web.Request) -> web.Response:
        await self.api.add_group(
            request[WHO], _text(await _body(request), "group", "adding a group")
        )
        return _none()

    async def remove_group(self, request: web.Request) -> web.Response:
        await self.api.remove_group(request[WHO], request.match_info["name"])
        return _none()

    async def set_member(self, request: web.Request) -> web.Response:
        body = await _body(request)
        user = _text(body, "user", "a membership")
        member = body.get("member", True)
        if not isinstance(member, bool):
            raise InvalidArgument("a membership: 'member' is true or false")
        await self.api.set_member(request[WHO], request.match_info["name"], user, member=member)
        return _none()

    def _rule(self, body: dict[str, Any]) -> tuple[str, str, str]:
        what = "an ACL rule"
        return (
            _text(body, "subject", what),
            _text(body, "permission", what),
            _text(body, "path", what),
        )

    async def list_rules(self, request: web.Request) -> web.Response:
        return _json(await self.api.list_rules(request[WHO]))

    async def grant(self, request: web.Request) -> web.Response:
        return _json(await self.api.grant(request[WHO], *self._rule(await _body(request))), 201)

    async def revoke(self, request: web.Request) -> web.Response:
        await self.api.revoke(request[WHO], *self._rule(await _body(request)))
        return _none()

    async def set_private(self, request: web.Request) -> web.Response:
        body = await _body(request)
        path = _text(body, "path", "a private export")
        private = body.get("private", True)
        if not isinstance(private, bool):
            raise InvalidArgument("a private export: 'private' is true or false")
        await self.api.set_private(request[WHO], path, private)
        return _none()

    # -- sites and policies ----------------------------------------------------------------

    async def list_sites(self, request: web.Request) -> web.Response:
        return _json(await self.api.list_sites(request[WHO]))

    async def add_site(self, request: web.Request) -> web.Response:
        body = await _body(request)
        cert = _text(body, "cert", "trusting a site").encode()
        labels = parse_labels(_texts(body, "labels", "trusting a site"))
        name = body.get("site")
        if name is not None and not isinstance(name, str):
            raise InvalidArgument("trusting a site: 'site' is its name")
        return _json(await self.api.add_site(request[WHO], cert, labels, name), 201)

    async def revoke_site(self, request: web.Request) -> web.Response:
        await self.api.revoke_site(request[WHO], request.match_info["name"])
        return _none()

    async def remove_site(self, request: web.Request) -> web.Response:
        await self.api.remove_site(request[WHO], request.match_info["name"])
        return _none()

    async def list_policies(self, request: web.Request) -> web.Response:
        return _json(await self.api.list_policies(request[WHO]))

    async def put_policy(self, request: web.Request) -> web.Response:
        """Store a policy; the answer's ``seq`` is what to settle on (``/v1/settle``)."""
        body = await _body(request)
        what = "a policy"
        tag, metadata = body.get("tag"), body.get("metadata", "visible")
        if (tag is not None and not isinstance(tag, str)) or not isinstance(metadata, str):
            raise InvalidArgument(f"{what}: 'tag' and 'metadata' are strings")
        policy = Policy.build(
            _text(body, "policy", what), _texts(body, "paths", what),
            _texts(body, "allow", what), tag, metadata,
        )  # fmt: skip
        seq = await self.api.put_policy(request[WHO], policy)
        return _json({"policy": policy.name, "seq": seq}, 201)

    async def remove_policy(self, request: web.Request) -> web.Response:
        await self.api.remove_policy(request[WHO], request.match_info["name"])
        return _none()

    async def list_exports(self, request: web.Request) -> web.Response:
        return _json(await self.api.list_exports(request[WHO]))

    async def add_nfs_export(self, request: web.Request) -> web.Response:
        body = await _body(request)
        path = _text(body, "path", "an NFS export")
        fields = {k: v for k, v in body.items() if k != "path"}
        return _json(await self.api.add_nfs_export(request[WHO], path, fields), 201)

    async def remove_nfs_export(self, request: web.Request) -> web.Response:
        path = request.query.get("path")
        if not path:
            raise InvalidArgument("removing an NFS export needs ?path=")
        await self.api.remove_nfs_export(request[WHO], path)
        return _none()

    async def add_smb_share(self, request: web.Request) -> web.Response:
        body = await _body(request)
        name = _text(body, "share", "an SMB share")
        fields = {k: v for k, v in body.items() if k != "share"}
        return _json(await self.api.add_smb_share(request[WHO], name, fields), 201)

    async def remove_smb_share(self, request: web.Request) -> web.Response:
        name = request.query.get("name")
        if not name:
            raise InvalidArgument("removing an SMB share needs ?name=")
        await self.api.remove_smb_share(request[WHO], name)
        return _none()

    # -- the audit log ---------------------------------------------------------------------

    async def audit_query(self, request: web.Request) -> web.Response:
        """``?user=&path=&protocol=&since=&until=&limit=``: times in ns since the epoch."""
        query = request.query
        limit = _int(query.get("limit"), "limit") or 200
        if not 0 < limit <= MAX_AUDIT:
            raise InvalidArgument(f"limit is 1 to {MAX_AUDIT}")
        records = await self.api.audit_query(
            request[WHO], user=query.get("user") or None, path=query.get("path") or None,
            protocol=query.get("protocol") or None, since=_int(query.get("since"), "since"),
            until=_int(query.get("until"), "until"), limit=limit,
        )  # fmt: skip
        return _json(records)


def routes(
    directory: Directory,
    governance: GovernedNamespace,
    *,
    audit: AuditReader | None = None,
    volumes: Volumes | None = None,
    exports: dict[str, Any] | None = None,
) -> list[web.RouteDef]:
    """The admin API's routes, for ``RestServer(routes=...)`` at a hub."""
    api = AdminApi(directory, governance, audit=audit, volumes=volumes, exports=exports)
    return AdminRoutes(api).routes()
