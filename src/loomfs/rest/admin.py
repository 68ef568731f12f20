"""The hub's admin API (protocol layer): users, keys, groups, ACL rules, trusted sites and
placement policies over REST, under ``/v1/admin``.

Every route is administration, never open: an explicit admin right (``core.acl``) on the
path it governs (an ACL rule's path, a policy's globs; "/" for users, groups, sites and
every listing), then the call (``core.directory``), then one audit record of its outcome
(``GovernedNamespace.administered``). Bad input is a 400 before anything is decided. A
new access key's secret is in its answer only: never in a log line or an audit record.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from aiohttp import web

from .. import paths
from ..core.directory import Directory
from ..core.placement import Policy
from ..core.sites import parse_labels
from ..errors import InvalidArgument
from ..namespace.governed import GovernedNamespace
from . import wire
from .server import WHO, _body, _json

ADMIN = wire.ADMIN
T = TypeVar("T")
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


def _none() -> web.Response:
    return web.Response(status=204)


class AdminRoutes:
    def __init__(self, directory: Directory, governance: GovernedNamespace) -> None:
        self.directory = directory
        self.governance = governance

    async def _do(
        self,
        request: web.Request,
        op: str,
        path: str,
        call: Callable[[], Awaitable[T]],
        detail: str = "",
    ) -> T:
        return await self.governance.administered(request[WHO], op, path, call, detail=detail)

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
        ]

    # -- users and keys --------------------------------------------------------------------

    async def list_users(self, request: web.Request) -> web.Response:
        return _json(await self._do(request, "list_users", "/", self.directory.list_users))

    async def add_user(self, request: web.Request) -> web.Response:
        body = await _body(request)
        name = _text(body, "user", "adding a user")
        groups = _texts(body, "groups", "adding a user")
        ssh_key = body.get("ssh_key")
        if ssh_key is not None and not isinstance(ssh_key, str):
            raise InvalidArgument("adding a user: 'ssh_key' is a public key line")
        made = await self._do(
            request, "add_user", "/",
            lambda: self.directory.add_user(name, groups, ssh_key),
            detail=f"user {name}, groups {','.join(sorted(groups)) or '-'}",
        )  # fmt: skip
        return _json(made, 201)

    async def remove_user(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        await self._do(
            request, "remove_user", "/", lambda: self.directory.remove_user(name),
            detail=f"user {name}",
        )  # fmt: skip
        return _none()

    async def add_key(self, request: web.Request) -> web.Response:
        """A new access key (its secret in this answer only), or ``ssh_key``'s line."""
        name = request.match_info["name"]
        line = (await _body(request)).get("ssh_key")
        if line is not None:
            if not isinstance(line, str):
                raise InvalidArgument("'ssh_key' is a public key line")
            ssh = await self._do(
                request, "add_ssh_key", "/", lambda: self.directory.add_ssh_key(name, line),
                detail=f"user {name}",
            )  # fmt: skip
            return _json(ssh, 201)
        key = await self._do(
            request, "add_access_key", "/", lambda: self.directory.add_access_key(name),
            detail=f"user {name}",
        )  # fmt: skip
        return _json(key, 201)

    async def set_smb_password(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        nt_hash = _text(await _body(request), "nt_hash", "setting an SMB password")
        login = await self._do(
            request, "set_smb_password", "/",
            lambda: self.directory.set_smb_password(name, nt_hash),
            detail=f"user {name}",
        )  # fmt: skip
        return _json(login)

    async def remove_key(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        access_key, line = request.query.get("access_key"), request.query.get("ssh_key")
        if (access_key is None) == (line is None):
            raise InvalidArgument("removing a key needs exactly one of ?access_key= and ?ssh_key=")
        if line is not None:
            await self._do(
                request, "remove_ssh_key", "/", lambda: self.directory.remove_ssh_key(name, line),
                detail=f"user {name}",
            )  # fmt: skip
        else:
            assert access_key is not None
            await self._do(
                request, "remove_access_key", "/",
                lambda: self.directory.remove_access_key(name, access_key),
                detail=f"user {name}, access key {access_key}",
            )  # fmt: skip
        return _none()

    # -- groups and rules ------------------------------------------------------------------

    async def list_groups(self, request: web.Request) -> web.Response:
        return _json(await self._do(request, "list_groups", "/", self.directory.list_groups))

    async def add_group(self, request: web.Request) -> web.Response:
        name = _text(await _body(request), "group", "adding a group")
        await self._do(
            request, "add_group", "/", lambda: self.directory.add_group(name),
            detail=f"group {name}",
        )  # fmt: skip
        return _none()

    async def remove_group(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        await self._do(
            request, "remove_group", "/", lambda: self.directory.remove_group(name),
            detail=f"group {name}",
        )  # fmt: skip
        return _none()

    async def set_member(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        body = await _body(request)
        user = _text(body, "user", "a membership")
        member = body.get("member", True)
        if not isinstance(member, bool):
            raise InvalidArgument("a membership: 'member' is true or false")
        await self._do(
            request, "set_member", "/",
            lambda: self.directory.set_member(name, user, member=member),
            detail=f"group {name}, user {user}, member {member}",
        )  # fmt: skip
        return _none()

    def _rule(self, body: dict[str, Any]) -> tuple[str, str, str]:
        what = "an ACL rule"
        subject, permission = _text(body, "subject", what), _text(body, "permission", what)
        return subject, permission, paths.normalize(_text(body, "path", what))

    async def list_rules(self, request: web.Request) -> web.Response:
        return _json(await self._do(request, "list_acl", "/", self.directory.list_rules))

    async def grant(self, request: web.Request) -> web.Response:
        subject, permission, path = self._rule(await _body(request))
        rule = await self._do(
            request, "acl_grant", path, lambda: self.directory.grant(subject, permission, path),
            detail=f"{subject} {permission}",
        )  # fmt: skip
        return _json(rule, 201)

    async def revoke(self, request: web.Request) -> web.Response:
        subject, permission, path = self._rule(await _body(request))
        await self._do(
            request, "acl_revoke", path, lambda: self.directory.revoke(subject, permission, path),
            detail=f"{subject} {permission}",
        )  # fmt: skip
        return _none()

    async def set_private(self, request: web.Request) -> web.Response:
        body = await _body(request)
        path = paths.normalize(_text(body, "path", "a private export"))
        private = body.get("private", True)
        if not isinstance(private, bool):
            raise InvalidArgument("a private export: 'private' is true or false")
        await self._do(
            request, "acl_private", path, lambda: self.directory.set_private(path, private),
            detail=f"private {private}",
        )  # fmt: skip
        return _none()

    # -- sites and policies ----------------------------------------------------------------

    async def list_sites(self, request: web.Request) -> web.Response:
        return _json(await self._do(request, "list_sites", "/", self.directory.list_sites))

    async def add_site(self, request: web.Request) -> web.Response:
        body = await _body(request)
        cert = _text(body, "cert", "trusting a site").encode()
        labels = parse_labels(_texts(body, "labels", "trusting a site"))
        name = body.get("site")
        if name is not None and not isinstance(name, str):
            raise InvalidArgument("trusting a site: 'site' is its name")
        pinned = await self._do(
            request, "add_site", "/", lambda: self.directory.add_site(cert, labels, name),
            detail=f"site {name or '(named by its certificate)'}",
        )  # fmt: skip
        return _json(pinned, 201)

    async def revoke_site(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        await self._do(
            request, "revoke_site", "/", lambda: self.directory.revoke_site(name),
            detail=f"site {name}",
        )  # fmt: skip
        return _none()

    async def remove_site(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        await self._do(
            request, "remove_site", "/", lambda: self.directory.remove_site(name),
            detail=f"site {name}",
        )  # fmt: skip
        return _none()

    async def list_policies(self, request: web.Request) -> web.Response:
        return _json(await self._do(request, "list_policies", "/", self.directory.list_policies))

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
        governed = _governed(policy)
        for path in governed[1:]:  # each path it governs is the caller's to administer
            await self.governance.authorize_admin(request[WHO], "put_policy", path)
        seq = await self._do(
            request, "put_policy", governed[0], lambda: self.directory.put_policy(policy),
            detail=f"policy {policy.name}: {' '.join(policy.paths)}",
        )  # fmt: skip
        return _json({"policy": policy.name, "seq": seq}, 201)

    async def remove_policy(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        known = {p.name: p for p in await self.directory.policies.list()}
        # an unknown name is decided on "/", so who may not administer learns nothing
        governed = _governed(known[name]) if name in known else ["/"]
        for path in governed[1:]:
            await self.governance.authorize_admin(request[WHO], "remove_policy", path)
        await self._do(
            request, "remove_policy", governed[0], lambda: self.directory.remove_policy(name),
            detail=f"policy {name}",
        )  # fmt: skip
        return _none()


def routes(directory: Directory, governance: GovernedNamespace) -> list[web.RouteDef]:
    """The admin API's routes, for ``RestServer(routes=...)`` at a hub."""
    return AdminRoutes(directory, governance).routes()
