"""``loomfs hub serve``, ``loomfs serve PROTOCOL``, ``loomfs spoke serve`` and a spoke's
``warm`` and ``sync`` (protocol layer): run a site, or steer a running spoke's cache."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import click
from rich.progress import (
    DownloadColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

from ..errors import LoomError
from ..log import setup_logging
from . import (
    State,
    console,
    failed,
    main,
    out,
    run,
)

# -- hub ---------------------------------------------------------------------------------


@main.group()
def hub() -> None:
    """Run a hub: the site that owns exports."""


@hub.command("serve")
@click.option("--listen", help="HOST:PORT to listen on (default: hub.listen).")
@click.option(
    "--ready-file",
    type=click.Path(path_type=Path),
    help="Write {'url': ...} here once listening (for scripts; port 0 picks a free port).",
)
@click.pass_context
def hub_serve(ctx: click.Context, listen: str | None, ready_file: Path | None) -> None:
    """Serve the namespace, follow volumes for changes, expose /metrics (and S3 where
    [s3] listen is set)."""
    _serve(ctx, {"hub": {"listen": listen}} if listen else {}, ready_file)


def _serve(
    ctx: click.Context,
    overrides: dict[str, dict[str, Any]],
    ready: Path | None,
    *,
    spoke: bool = False,
) -> None:
    state: State = ctx.find_object(State)  # type: ignore[assignment]
    try:
        config = state.config
        for section, values in overrides.items():
            current = getattr(config, section)
            config = config.model_copy(update={section: current.model_copy(update=values)})
        setup_logging(config.log.level, config.log.format)
        from ..service import HubService, SpokeService

        service = SpokeService(config) if spoke else HubService(config)
        asyncio.run(service.serve(ready))
    except LoomError as exc:
        failed(f"{exc.code}: {exc}")
        sys.exit(1)


@main.group()
def serve() -> None:
    """Serve the namespace over one more protocol (shorthands for `hub serve`)."""


#: protocol (its config section) -> (what listens, its default address, the command's help)
SERVED: dict[str, tuple[str, str, str]] = {
    "s3": ("the S3 endpoint", "127.0.0.1:9000",
           "Serve the hub with its S3 gateway on; keys come from `loomfs user add`."),
    "sftp": ("the SFTP server", "127.0.0.1:2222",
             "Serve the hub with SFTP on; logins by the SSH keys of `loomfs user add --ssh-key`."),
    "nfs": ("the NFSv3 and MOUNT server", "127.0.0.1:2049",
            "Serve the hub over NFSv3 (MOUNT on the same port: mount with port=N,mountport=N)."),
    "smb": ("smbd", "127.0.0.1:445",
            "Serve the hub over SMB (Samba, run by loomfs); logins by `loomfs user passwd`."),
}  # fmt: skip


def _serve_command(section: str, what: str, default: str, text: str) -> None:
    @serve.command(section, help=text)
    @click.option("--listen", help=f"HOST:PORT of {what} (default: {section}.listen).")
    @click.option("--port", type=int, help="Port on 127.0.0.1 (instead of --listen).")
    @click.option("--ready-file", type=click.Path(path_type=Path), help="As for `hub serve`.")
    @click.pass_context
    def command(
        ctx: click.Context, listen: str | None, port: int | None, ready_file: Path | None
    ) -> None:
        _serve_protocol(ctx, section, listen, port, ready_file, default)


for _section, (_what, _default, _text) in SERVED.items():
    _serve_command(_section, _what, _default, _text)


def _serve_protocol(
    ctx: click.Context,
    section: str,
    listen: str | None,
    port: int | None,
    ready_file: Path | None,
    default: str,
) -> None:
    """The hub with one more protocol's listener on: at --listen, at --port on loopback,
    where the config's [section] listen says, or at ``default``."""
    state: State = ctx.find_object(State)  # type: ignore[assignment]
    address = listen or (f"127.0.0.1:{port}" if port is not None else None)
    address = address or getattr(state.config, section).listen or default
    _serve(ctx, {section: {"listen": address}}, ready_file)


# -- spokes ------------------------------------------------------------------------------


@main.group()
def spoke() -> None:
    """Run a spoke: a hub's exports, cached near the GPUs."""


@spoke.command("serve")
@click.option(
    "--hub", "hub_url", help="The hub's fabric URL, https://host:port (gateways: comma-separated)."
)
@click.option("--hub-cert", type=click.Path(path_type=Path), help="The hub's certificate.")
@click.option("--attach", multiple=True, help="A namespace path of the hub to serve here.")
@click.option("--cache-dir", type=click.Path(path_type=Path), help="Where cached data lives.")
@click.option("--cache-size", help="Cache capacity, e.g. 200G.")
@click.option("--write-back", is_flag=True, default=None, help="Acknowledge writes once journaled.")
@click.option("--listen", help="HOST:PORT of this spoke's REST API.")
@click.option("--ready-file", type=click.Path(path_type=Path), help="As for `hub serve`.")
@click.option(
    "--cache-key-file", type=click.Path(path_type=Path), help="Seal the cache with this key."
)
@click.pass_context
def spoke_serve(
    ctx: click.Context,
    hub_url: str | None,
    hub_cert: Path | None,
    attach: tuple[str, ...],
    cache_dir: Path | None,
    cache_size: str | None,
    write_back: bool | None,
    listen: str | None,
    ready_file: Path | None,
    cache_key_file: Path | None,
) -> None:
    """Attach exports of a hub and serve them here (options override [spoke] in the config)."""
    given = {
        "hub": hub_url,
        "hub_cert": hub_cert,
        "attach": list(attach) or None,
        "cache_dir": cache_dir,
        "cache_size": cache_size,
        "write_back": write_back,
        "listen": listen,
        "cache_key_file": cache_key_file,
    }
    _serve(
        ctx, {"spoke": {k: v for k, v in given.items() if v is not None}}, ready_file, spoke=True
    )


@main.command("warm")
@click.argument("path")
@click.option("--site", "site_url", help="The spoke's URL (default: --hub / client.hub).")
@click.option("--pin", is_flag=True, help="Keep it cached: never evicted.")
@click.pass_context
@run
async def warm(ctx: click.Context, path: str, site_url: str | None, pin: bool) -> None:
    """Fetch PATH into a spoke's cache ahead of training; resumable."""
    state: State = ctx.find_object(State)  # type: ignore[assignment]
    ns = state.rest(site_url)
    progress = Progress(
        SpinnerColumn(),
        TextColumn(f"warming {path}"),
        TextColumn("{task.fields[files]:,} files"),
        DownloadColumn(),
        TimeElapsedColumn(),
        console=console,
    )
    task = progress.add_task("warm", total=None, files=0)

    def update(line: dict[str, Any]) -> None:
        progress.update(task, completed=line.get("bytes", 0), files=line.get("files", 0))

    try:
        with progress:
            stats = await ns.warm(path, pin=pin, progress=update)
    finally:
        await ns.close()
    out.print(
        f"{stats['files']:,} files, {stats['bytes']:,} bytes cached; "
        f"{stats['fetched']:,} bytes fetched now"
        + (f"; {stats['refused']:,} files refused by placement" if stats.get("refused") else "")
    )


@main.command("sync")
@click.option("--site", "site_url", help="The spoke's URL (default: --hub / client.hub).")
@click.pass_context
@run
async def sync(ctx: click.Context, site_url: str | None) -> None:
    """Wait until a spoke has committed every write it acknowledged."""
    state: State = ctx.find_object(State)  # type: ignore[assignment]
    ns = state.rest(site_url)
    try:
        await ns.sync()
    finally:
        await ns.close()
