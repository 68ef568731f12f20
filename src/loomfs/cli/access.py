"""``loomfs user``, ``group``, ``acl`` and ``whoami`` (protocol layer): who may do what,
over the hub's admin API or, ``--offline``, in a stopped hub's own catalog."""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.table import Table

from ..core.types import Principal
from ..errors import ConfigError, LoomError

if TYPE_CHECKING:
    from ..core.directory import Directory
    from ..rest.client import RestDirectory

    Administration = Directory | RestDirectory


from . import (
    JSON_LINES,
    State,
    _json_line,
    _json_lines,
    connected,
    main,
    out,
    run,
)

# -- users -------------------------------------------------------------------------------


def offline_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--offline``: for a hub that is not serving (before its first ``hub serve``, or
    to recover one), change its catalog directly instead of through the admin API."""

    def remember(ctx: click.Context, _: click.Parameter, value: bool) -> None:
        ctx.meta["offline"] = value

    return click.option(
        "--offline", is_flag=True, expose_value=False, callback=remember,
        help="The hub is stopped: change its catalog directly (bootstrap, recovery).",
    )(fn)  # fmt: skip


@contextlib.asynccontextmanager
async def administering(ctx: click.Context) -> AsyncIterator[Administration]:
    """The records this administration command changes: the hub's admin API (it decides
    and audits, ``rest.admin``), or with ``--offline`` the stopped hub's own catalog,
    the command's outcome recorded in its audit log."""
    from ..rest.client import RestDirectory

    if not ctx.meta.get("offline"):
        async with connected(ctx, admin=True) as ns:
            yield RestDirectory(ns)
        return
    from ..core.directory import Directory
    from ..core.dirlock import DirectoryLock
    from ..core.registry import open_catalog
    from ..service import audit_log, own_names

    state: State = ctx.find_object(State)  # type: ignore[assignment]
    config = state.config
    lock = DirectoryLock(config.site.data_dir, "data directory")
    try:
        lock.acquire()  # no hub serves from it meanwhile: its admin API is the way then
    except ConfigError as exc:
        raise ConfigError(f"--offline is for a stopped hub: {exc}") from None
    audit, catalog = audit_log(config), open_catalog(config.catalog_url)
    who = Principal(getpass.getuser(), site=config.site.name, protocol="offline")
    try:
        if audit is not None:
            audit.start()
        await catalog.open()
        op = ctx.command_path.removeprefix(ctx.find_root().info_name or "").strip()
        try:
            yield Directory(catalog, own_names(config))
        except LoomError as exc:
            if audit is not None:
                audit.record(who, op, "/", exc.code, detail=str(exc))
            raise
        if audit is not None:
            audit.record(who, op, "/", "ok")
    finally:
        await catalog.close()
        if audit is not None:
            await asyncio.to_thread(audit.close)
        lock.release()


def _print_secret(key: dict[str, Any]) -> None:
    # the only time the secret is shown; it is never logged
    out.print(f"access key id:     {key['access_key']}")
    out.print(f"secret access key: {key['secret']}")


@main.group()
def user() -> None:
    """Users shared by every protocol: S3 access keys, SSH public keys (on the hub)."""


@user.command("add")
@click.argument("name")
@click.option("--group", "groups", multiple=True, help="A group of the user (repeatable).")
@click.option("--ssh-key", "ssh_key", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@offline_option
@click.pass_context
@run
async def user_add(
    ctx: click.Context, name: str, groups: tuple[str, ...], ssh_key: Path | None
) -> None:
    """Add a user with a new S3 access key (shown once) and optionally an SSH key."""
    line = None if ssh_key is None else ssh_key.read_text()
    async with administering(ctx) as admin:
        _print_secret(await admin.add_user(name, groups, line))


@user.command("list")
@JSON_LINES
@offline_option
@click.pass_context
@run
async def user_list(ctx: click.Context, as_json: bool) -> None:
    """Users, their groups and key ids (never secrets)."""
    async with administering(ctx) as admin:
        users = await admin.list_users()
    if as_json:
        _json_lines(users)
        return
    table = Table("user", "groups", "access keys", "ssh keys")
    for u in users:
        table.add_row(
            u["user"],
            ",".join(u["groups"]),
            " ".join(u["access_keys"]),
            "\n".join(f"{k['key_type']} {k['comment']}".strip() for k in u["ssh_keys"]),
        )
    out.print(table)


@user.command("remove")
@click.argument("name")
@offline_option
@click.pass_context
@run
async def user_remove(ctx: click.Context, name: str) -> None:
    """Remove a user and all their keys."""
    async with administering(ctx) as admin:
        await admin.remove_user(name)


@user.command("passwd")
@click.argument("name")
@click.option("--stdin", "from_stdin", is_flag=True, help="Read the password from stdin.")
@offline_option
@click.pass_context
@run
async def user_passwd(ctx: click.Context, name: str, from_stdin: bool) -> None:
    """Set NAME's SMB password (only its NT hash is sent and kept)."""
    from ..core.nthash import nt_hash

    if from_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = click.prompt("SMB password", hide_input=True, confirmation_prompt=True)
    if not password:
        raise click.UsageError("the password is empty")
    async with administering(ctx) as admin:
        login = await admin.set_smb_password(name, nt_hash(password))
    out.print(f"user {login['user']}: SMB password set (runs as uid {login['uid']})")


@user.group("key")
def user_key() -> None:
    """Add or remove a user's S3 access keys and SSH public keys."""


@user_key.command("add")
@click.argument("name")
@click.option("--ssh-key", "ssh_key", type=click.Path(path_type=Path, exists=True, dir_okay=False),
              help="Add this public key file instead of a new S3 access key.")  # fmt: skip
@offline_option
@click.pass_context
@run
async def user_key_add(ctx: click.Context, name: str, ssh_key: Path | None) -> None:
    """A new S3 access key for NAME (shown once), or an SSH public key."""
    async with administering(ctx) as admin:
        if ssh_key is not None:
            await admin.add_ssh_key(name, ssh_key.read_text())
            return
        _print_secret(await admin.add_access_key(name))


@user_key.command("remove")
@click.argument("name")
@click.option("--access-key", help="The S3 access key id to revoke.")
@click.option("--ssh-key", "ssh_key", type=click.Path(path_type=Path, exists=True, dir_okay=False),
              help="The public key file to revoke.")  # fmt: skip
@offline_option
@click.pass_context
@run
async def user_key_remove(
    ctx: click.Context, name: str, access_key: str | None, ssh_key: Path | None
) -> None:
    """Revoke one of NAME's keys."""
    if (access_key is None) == (ssh_key is None):
        raise click.UsageError("give exactly one of --access-key and --ssh-key")
    async with administering(ctx) as admin:
        if ssh_key is not None:
            await admin.remove_ssh_key(name, ssh_key.read_text())
        else:
            assert access_key is not None
            await admin.remove_access_key(name, access_key)


# -- access control ----------------------------------------------------------------------


@main.group()
def group() -> None:
    """Groups of users, for ACL rules (on the hub)."""


@group.command("add")
@click.argument("name")
@offline_option
@click.pass_context
@run
async def group_add(ctx: click.Context, name: str) -> None:
    """Create a group (add users with `loomfs user add --group` or `group member`)."""
    async with administering(ctx) as admin:
        await admin.add_group(name)


@group.command("list")
@JSON_LINES
@offline_option
@click.pass_context
@run
async def group_list(ctx: click.Context, as_json: bool) -> None:
    """Groups and their members."""
    table = Table("group", "members")
    async with administering(ctx) as admin:
        groups = await admin.list_groups()
    if as_json:
        _json_lines(groups)
        return
    for g in groups:
        table.add_row(g["group"], ",".join(g["members"]))
    out.print(table)


@group.command("remove")
@click.argument("name")
@offline_option
@click.pass_context
@run
async def group_remove(ctx: click.Context, name: str) -> None:
    """Remove a group and its memberships (refused while an ACL rule names it)."""
    async with administering(ctx) as admin:
        await admin.remove_group(name)


@group.command("member")
@click.argument("name")
@click.argument("user_name", metavar="USER")
@click.option("--remove", is_flag=True, help="Take USER out of the group instead.")
@offline_option
@click.pass_context
@run
async def group_member(ctx: click.Context, name: str, user_name: str, remove: bool) -> None:
    """Put USER in group NAME (or take them out)."""
    async with administering(ctx) as admin:
        await admin.set_member(name, user_name, member=not remove)


@main.group()
def acl() -> None:
    """Path-prefix access rules (on the hub): who may list, read, write or administer what.

    A path no rule governs (on it or an ancestor) and not under a private export is open
    to everyone; once a rule governs it, only what rules grant is allowed."""


PERMISSIONS = click.Choice(["list", "read", "put", "write", "admin"])


@acl.command("grant")
@click.argument("subject")
@click.argument("permission", type=PERMISSIONS)
@click.argument("path")
@offline_option
@click.pass_context
@run
async def acl_grant(ctx: click.Context, subject: str, permission: str, path: str) -> None:
    """Give SUBJECT (user:NAME, group:NAME or a group's name) PERMISSION on PATH and below."""
    async with administering(ctx) as admin:
        rule = await admin.grant(subject, permission, path)
    out.print(f"{rule['subject']} may {rule['permission']} {rule['path']}")


@acl.command("revoke")
@click.argument("subject")
@click.argument("permission", type=PERMISSIONS)
@click.argument("path")
@offline_option
@click.pass_context
@run
async def acl_revoke(ctx: click.Context, subject: str, permission: str, path: str) -> None:
    """Take back a rule made with `acl grant`."""
    async with administering(ctx) as admin:
        await admin.revoke(subject, permission, path)


@acl.command("list")
@click.option(
    "--json", "as_json", is_flag=True, help='One JSON object: {"rules": [...], "private": [...]}.'
)
@offline_option
@click.pass_context
@run
async def acl_list(ctx: click.Context, as_json: bool) -> None:
    """Every rule and every private export."""
    async with administering(ctx) as admin:
        found = await admin.list_rules()
    if as_json:
        _json_line(found)
        return
    table = Table("path", "subject", "permission")
    for rule in found["rules"]:
        table.add_row(rule["path"], rule["subject"], rule["permission"])
    for path in found["private"]:
        table.add_row(path, "(private export)", "")
    out.print(table)


@acl.command("private")
@click.argument("path")
@click.option("--off", is_flag=True, help="Make PATH open again (where no rule governs it).")
@offline_option
@click.pass_context
@run
async def acl_private(ctx: click.Context, path: str, off: bool) -> None:
    """Mark an export private: below PATH only what rules grant is allowed."""
    async with administering(ctx) as admin:
        await admin.set_private(path, not off)


@main.command("whoami")
@click.pass_context
@run
async def whoami(ctx: click.Context) -> None:
    """Who the hub (or spoke) takes this client for."""
    async with connected(ctx) as ns:
        found = await ns.whoami()
    groups = ",".join(found["groups"]) or "-"
    out.print(f"{found['user']} (groups {groups}) at {found['site']} over {found['protocol']}")
