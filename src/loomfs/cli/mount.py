"""``loomfs mount`` (protocol layer): the namespace as a FUSE file system."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import sys
from collections.abc import Awaitable
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ..errors import LoomError, NotSupported
from ..log import setup_logging

if TYPE_CHECKING:
    from ..config import Config
    from ..core.types import Feed
    from ..namespace.base import Namespace
    from ..rest.client import RestNamespace
    from ..service import HubService, SpokeService

from . import (
    State,
    client_of,
    failed,
    main,
)

log = logging.getLogger(__name__)

# -- FUSE --------------------------------------------------------------------------------


def _uid_map(pairs: tuple[str, ...]) -> dict[int, str]:
    table: dict[int, str] = {}
    for pair in pairs:
        uid, sep, user = pair.partition("=")
        if not sep or not uid.isdigit() or not user:
            raise click.BadParameter(f"{pair!r} is not UID=USER", param_hint="--uid-map")
        table[int(uid)] = user
    return table


@main.command("mount")
@click.argument("mountpoint", type=click.Path(path_type=Path))
@click.option("--hub", "hub_url", help="Mount this hub's namespace over its REST API.")
@click.option("--allow-other", is_flag=True, help="Let users other than the mounter in.")
@click.option(
    "--uid-map",
    multiple=True,
    metavar="UID=USER",
    help="The loomfs user a local uid acts as (repeatable; default: the local user name).",
)
@click.option(
    "--defer-creates",
    is_flag=True,
    help="Make a file created here in the namespace at its first close, content and "
    "attributes in one change; other protocols see it from then on.",
)
@click.option(
    "--ready-file",
    type=click.Path(path_type=Path),
    help="Write {'pid': ...} here once mounted (for scripts).",
)
@click.pass_context
def mount(
    ctx: click.Context,
    *,
    mountpoint: Path,
    hub_url: str | None,
    allow_other: bool,
    uid_map: tuple[str, ...],
    defer_creates: bool,
    ready_file: Path | None,
) -> None:
    """Mount the namespace at MOUNTPOINT (in the foreground; stop with Ctrl-C or SIGTERM).

    With --hub (or the global --hub) over that hub's REST API; otherwise this site runs
    in this process, from the configuration: its spoke where [spoke] hub is set, else
    its hub."""
    from ..protocols.fuse.session import event_loop

    state: State = ctx.find_object(State)  # type: ignore[assignment]
    uids = _uid_map(uid_map)
    try:
        config = state.config
        setup_logging(config.log.level, config.log.format)
        with asyncio.Runner(loop_factory=lambda: event_loop(config.fuse.poll_us)) as runner:
            runner.run(
                _mount(
                    config,
                    mountpoint,
                    hub_url=hub_url or state.hub_override,
                    allow_other=allow_other,
                    uid_map=uids,
                    ready_file=ready_file,
                    defer_creates=defer_creates,
                )
            )
    except LoomError as exc:
        failed(f"{exc.code}: {exc}")
        sys.exit(1)


def _hub_feed(service: HubService, since: int, wait: float) -> Awaitable[Feed]:
    """The change feed of the hub running in this process, as a mount follows it."""
    return service.feed(None, since, 1000, wait=wait)


def _rest_feed(rest: RestNamespace, since: int, wait: float) -> Awaitable[Feed]:
    """The change feed of a hub over REST, as a mount follows it."""
    return rest.changes(since, wait=wait)


async def _serves_feed(rest: RestNamespace) -> bool:
    """Whether the site has a change feed to follow: a hub has; a spoke keeps its own
    coherent with its hub but serves none, so a mount of it trusts the kernel's cache for
    the short timeout instead of retrying a feed that is not there."""
    try:
        await rest.changes(0, 1)
    except NotSupported:
        log.info("the site serves no change feed: kernel caches expire on their own")
        return False
    return True


async def _mount(
    config: Config,
    mountpoint: Path,
    *,
    hub_url: str | None,
    allow_other: bool,
    uid_map: dict[int, str],
    ready_file: Path | None,
    defer_creates: bool,
) -> None:
    from ..protocols.fuse.follow import Poll
    from ..protocols.fuse.mount import check_mountpoint, serve

    check_mountpoint(mountpoint)  # before a hub starts in this process for nothing

    def ready() -> None:
        if ready_file is not None:
            ready_file.write_text(json.dumps({"pid": os.getpid(), "mountpoint": str(mountpoint)}))

    spool = config.site.data_dir / "fuse-spool"
    service: HubService | SpokeService | None = None
    follow: Poll | None = None
    if hub_url:
        rest = client_of(config, hub_url)  # the CLI's credentials, for every local user
        ns: Namespace = rest
    elif config.spoke.hub:
        # this site is a spoke, run here: the kernel reads what its cache holds whole
        # straight from the cache files (passthrough). It keeps itself coherent with its
        # hub but has no feed to follow, so the kernel's caches expire on their own.
        from ..service import SpokeService

        service = SpokeService(config)
        await service.start()
        ns = service.namespace
    else:
        # this process serves the mount alone: its changes follow POSIX's durability
        from ..service import HubService

        hub = service = HubService(config, durable=config.fuse.durable_each_change)
        await hub.start()
        ns = hub.governed  # the mapped users are decided for like any other caller
        follow = functools.partial(_hub_feed, hub)  # invalidation only: no data
    try:
        if hub_url:
            follow = functools.partial(_rest_feed, rest) if await _serves_feed(rest) else None
        await serve(
            ns,
            mountpoint,
            spool_dir=spool,
            allow_other=allow_other,
            uid_map=uid_map,
            on_ready=ready,
            follow=follow,
            passthrough=config.fuse.passthrough,
            defer_creates=defer_creates,
        )
    finally:
        if service is not None:
            await service.stop()
        else:
            await ns.close()
        if ready_file is not None:
            ready_file.unlink(missing_ok=True)
