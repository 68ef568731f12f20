"""The site's administered records (core layer): users and their keys, groups, ACL rules,
trusted sites and placement policies, as administration changes them.

One place for what an administration command does, whoever runs it: the hub's admin API
(``rest.admin``, after its admin check) and the CLI's offline recovery path (the hub
stopped). Results are plain dicts, the admin API's wire form, so both print alike. A new
access key's secret is in the result of the call that made it and nowhere else.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from ..errors import NotFound
from .acl import AclStore, Group, Rule
from .catalog.base import Catalog
from .placement import Policy, PolicyStore
from .sites import Site, SiteRegistry
from .users import AccessKey, SshKey, User, UserRegistry


def key_json(key: AccessKey) -> dict[str, Any]:
    return {"user": key.user, "access_key": key.access_key, "secret": key.secret}


def user_json(user: User) -> dict[str, Any]:
    return {
        "user": user.name,
        "groups": sorted(user.groups),
        "access_keys": list(user.access_keys),
        "ssh_keys": [ssh_json(k) for k in user.ssh_keys],
    }


def ssh_json(key: SshKey) -> dict[str, Any]:
    """A public key, its line included (it is no secret: removing one names it)."""
    return {
        "user": key.user, "key_type": key.key_type, "comment": key.comment,
        "fingerprint": key.fingerprint, "line": key.line,
    }  # fmt: skip


def group_json(group: Group) -> dict[str, Any]:
    return {"group": group.name, "members": list(group.members)}


def rule_json(rule: Rule) -> dict[str, Any]:
    return {"path": rule.path, "subject": rule.subject, "permission": rule.permission.value}


def site_json(site: Site) -> dict[str, Any]:
    return {
        "site": site.name,
        "labels": site.labels,
        "fingerprint": site.fingerprint,
        "trusted": site.trusted,
    }


def policy_json(policy: Policy) -> dict[str, Any]:
    return {
        "policy": policy.name,
        "paths": list(policy.paths),
        "tag": None if policy.tag is None else "=".join(policy.tag),
        "allow": [f"{k}={v}" for k, v in policy.allow],
        "metadata": policy.metadata.value,
    }


class Directory:
    """The administered records of the site whose catalog is ``catalog``; ``own``: the
    hub's own names, which no spoke may be pinned under."""

    def __init__(self, catalog: Catalog, own: Collection[str] = ()) -> None:
        self.users = UserRegistry(catalog)
        self.acl = AclStore(catalog)
        self.sites = SiteRegistry(catalog)
        self.policies = PolicyStore(catalog)
        self.own = frozenset(own)

    # -- users and keys --------------------------------------------------------------------

    async def add_user(
        self, name: str, groups: Sequence[str] = (), ssh_key: str | None = None
    ) -> dict[str, Any]:
        """A new user with a new access key (its secret in the result), and an SSH key."""
        await self.users.add_user(name, frozenset(groups))
        if ssh_key is not None:
            await self.users.add_ssh_key(name, ssh_key)
        return key_json(await self.users.add_access_key(name))

    async def list_users(self) -> list[dict[str, Any]]:
        return [user_json(u) for u in await self.users.list_users()]

    async def remove_user(self, name: str) -> None:
        await self.users.remove_user(name)

    async def add_access_key(self, name: str) -> dict[str, Any]:
        return key_json(await self.users.add_access_key(name))

    async def remove_access_key(self, name: str, access_key: str) -> None:
        if access_key not in (await self.users.get_user(name)).access_keys:
            raise NotFound(f"user {name} has no access key {access_key}")
        await self.users.remove_access_key(access_key)

    async def add_ssh_key(self, name: str, line: str) -> dict[str, Any]:
        return ssh_json(await self.users.add_ssh_key(name, line))

    async def remove_ssh_key(self, name: str, line: str) -> None:
        await self.users.remove_ssh_key(name, line)

    async def set_smb_password(self, name: str, nt_hash: str) -> dict[str, Any]:
        """``nt_hash``: the NT hash of the new password; the password never travels."""
        login = await self.users.set_smb_password(name, nt_hash)
        return {"user": login.user, "uid": login.uid}

    # -- groups and rules ------------------------------------------------------------------

    async def add_group(self, name: str) -> None:
        await self.acl.add_group(name)

    async def list_groups(self) -> list[dict[str, Any]]:
        return [group_json(g) for g in await self.acl.list_groups()]

    async def remove_group(self, name: str) -> None:
        await self.acl.remove_group(name)

    async def set_member(self, group: str, user: str, *, member: bool) -> None:
        await self.acl.set_member(group, user, member=member)

    async def grant(self, subject: str, permission: str, path: str) -> dict[str, Any]:
        """``subject``: user:NAME, group:NAME or a bare name, resolved to one of them."""
        return rule_json(await self.acl.grant(await self.acl.resolve(subject), permission, path))

    async def revoke(self, subject: str, permission: str, path: str) -> None:
        await self.acl.revoke(await self.acl.resolve(subject), permission, path)

    async def list_rules(self) -> dict[str, Any]:
        rules, private, _ = await self.acl.snapshot()
        return {"rules": [rule_json(r) for r in rules], "private": private}

    async def set_private(self, path: str, private: bool) -> None:
        await self.acl.set_private(path, private)

    # -- sites and policies ----------------------------------------------------------------

    async def add_site(
        self, cert_pem: bytes, labels: dict[str, str], name: str | None = None
    ) -> dict[str, Any]:
        return site_json(await self.sites.add(cert_pem, labels, name, own=self.own))

    async def list_sites(self) -> list[dict[str, Any]]:
        return [site_json(s) for s in await self.sites.list()]

    async def revoke_site(self, name: str) -> None:
        await self.sites.revoke(name)

    async def remove_site(self, name: str) -> None:
        await self.sites.remove(name)

    async def put_policy(self, policy: Policy) -> int:
        """Add or replace a policy; the change-log position to settle on."""
        return await self.policies.put(policy)

    async def list_policies(self) -> list[dict[str, Any]]:
        return [policy_json(p) for p in await self.policies.list()]

    async def remove_policy(self, name: str) -> None:
        await self.policies.remove(name)
