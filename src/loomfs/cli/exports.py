"""``loomfs export ...`` (protocol layer): what each protocol serves, and the NFS exports
and SMB shares added and removed at run time, through the running hub's admin API
(``rest.admin``), which decides and audits each change."""

from __future__ import annotations

from typing import Any

import click
from rich.table import Table

from . import JSON_LINES, _json_lines, connected, main, out, run


@main.group()
def export() -> None:
    """Exports per protocol: list them all; add and remove NFS exports and SMB shares on
    the running hub (those of the config file are changed there, then a restart)."""


def _rows(exports: dict[str, Any]) -> list[dict[str, Any]]:
    """Every export of every protocol, one row each: its protocol, name (an NFS export's
    path, an SMB share's, an S3 bucket's), namespace path, settings and source."""
    s3, sftp, nfs, smb = exports["s3"], exports["sftp"], exports["nfs"], exports["smb"]
    rows: list[dict[str, Any]] = [
        {"protocol": "s3", "name": bucket, "path": path, "settings": "", "source": "config",
         "listen": s3["listen"]}
        for bucket, path in sorted(s3["buckets"].items())
    ]  # fmt: skip
    if s3["bucket_root"]:
        rows.append({"protocol": "s3", "name": "*", "path": s3["bucket_root"],
                     "settings": "each directory a bucket", "source": "config",
                     "listen": s3["listen"]})  # fmt: skip
    rows.append({"protocol": "sftp", "name": "/", "path": sftp["root"], "settings": "",
                 "source": "config", "listen": sftp["listen"]})  # fmt: skip
    for x in nfs["exports"]:
        settings = f"{x['access']}, clients {','.join(x['clients'])}, squash {x['squash']}"
        rows.append({"protocol": "nfs", "name": x["path"], "path": x["path"],
                     "settings": settings + (", anonymous" if x["anonymous"] else ""),
                     "source": x["source"], "listen": nfs["listen"]})  # fmt: skip
    for x in smb["shares"]:
        rows.append({"protocol": "smb", "name": x["share"], "path": x["path"],
                     "settings": x["access"], "source": x["source"],
                     "listen": smb["listen"]})  # fmt: skip
    return rows


@export.command("ls")
@JSON_LINES
@click.pass_context
@run
async def export_ls(ctx: click.Context, as_json: bool) -> None:
    """Every export of every protocol, with its source: the config file or the catalog
    (added at run time); a protocol not listening is "off"."""
    from ..rest.client import RestDirectory

    async with connected(ctx, admin=True) as ns:
        rows = _rows(await RestDirectory(ns).list_exports())
    if as_json:
        _json_lines(rows)
        return
    table = Table("protocol", "name", "path", "settings", "source", "listen")
    for row in rows:
        table.add_row(*(str(row[k] or "") for k in ("protocol", "name", "path", "settings",
                                                   "source")), row["listen"] or "off")  # fmt: skip
    out.print(table)


@export.group("nfs")
def export_nfs() -> None:
    """NFS exports added at run time: served from the NFS server's next MNT."""


@export_nfs.command("add")
@click.argument("path")
@click.option(
    "--clients", multiple=True, help="A network that may mount it (repeat; none: loopback only)."
)
@click.option("--access", type=click.Choice(["rw", "ro"]), default="rw", show_default=True)
@click.option("--squash", type=click.Choice(["root", "all", "none"]), default="root",
              show_default=True, help="Who is the anonymous user.")  # fmt: skip
@click.option("--anonymous", is_flag=True, help="Serve AUTH_NONE calls (as the anonymous user).")
@click.pass_context
@run
async def export_nfs_add(
    ctx: click.Context,
    path: str,
    clients: tuple[str, ...],
    access: str,
    squash: str,
    anonymous: bool,
) -> None:
    """Export PATH over NFS (the admin right on PATH)."""
    from ..rest.client import RestDirectory

    fields: dict[str, Any] = {"access": access, "squash": squash, "anonymous": anonymous}
    if clients:
        fields["clients"] = list(clients)
    async with connected(ctx, admin=True) as ns:
        made = await RestDirectory(ns).add_nfs_export(path, fields)
    out.print(f"exporting {made['path']} over NFS: {made['access']}, clients "
              f"{','.join(made['clients'])}, squash {made['squash']}")  # fmt: skip


@export_nfs.command("rm")
@click.argument("path")
@click.pass_context
@run
async def export_nfs_rm(ctx: click.Context, path: str) -> None:
    """Remove the NFS export of PATH added at run time: its handles are STALE."""
    from ..rest.client import RestDirectory

    async with connected(ctx, admin=True) as ns:
        await RestDirectory(ns).remove_nfs_export(path)


@export.group("smb")
def export_smb() -> None:
    """SMB shares added at run time: smbd serves them within seconds, no restart."""


@export_smb.command("add")
@click.argument("name")
@click.argument("path")
@click.option("--access", type=click.Choice(["rw", "ro"]), default="rw", show_default=True,
              help="ro: the share refuses changes whatever the user's rights.")  # fmt: skip
@click.pass_context
@run
async def export_smb_add(ctx: click.Context, name: str, path: str, access: str) -> None:
    """Share PATH over SMB as NAME (the admin right on PATH)."""
    from ..rest.client import RestDirectory

    async with connected(ctx, admin=True) as ns:
        made = await RestDirectory(ns).add_smb_share(name, {"path": path, "access": access})
    out.print(f"sharing {made['path']} over SMB as {made['share']}: {made['access']}")


@export_smb.command("rm")
@click.argument("name")
@click.pass_context
@run
async def export_smb_rm(ctx: click.Context, name: str) -> None:
    """Remove share NAME added at run time: it takes no new connection."""
    from ..rest.client import RestDirectory

    async with connected(ctx, admin=True) as ns:
        await RestDirectory(ns).remove_smb_share(name)
