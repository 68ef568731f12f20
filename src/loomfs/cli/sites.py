"""``loomfs site ...`` and ``loomfs policy ...`` (protocol layer): the sites a hub
trusts, and where their data may live."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.table import Table

from ..errors import BackendUnavailable, LoomError
from . import (
    JSON_LINES,
    State,
    _json_lines,
    failed,
    main,
    out,
    run,
)
from .access import administering, offline_option

# -- sites and spokes --------------------------------------------------------------------


@main.group()
def site() -> None:
    """This site's identity, and (on a hub) the spokes it trusts."""


@site.command("init")
@click.option("--name", required=True, help="This site's name (it goes in the certificate).")
@click.option("--label", "labels", multiple=True, help="KEY=VALUE, e.g. region=us-west.")
@click.option("--host", "hosts", multiple=True, help="A name or address this site is reached by.")
@click.option("--cache-key", is_flag=True, help="Also a key sealing this spoke's cache at rest.")
@click.pass_context
def site_init(
    ctx: click.Context,
    name: str,
    labels: tuple[str, ...],
    hosts: tuple[str, ...],
    cache_key: bool,
) -> None:
    """Create this site's key and self-signed certificate (give the .pem to the other side)."""
    from ..core.certs import fingerprint
    from ..core.sites import parse_labels
    from ..fabric.identity import SiteIdentity

    state: State = ctx.find_object(State)  # type: ignore[assignment]
    if cache_key:  # before anything is made: sealing needs BLAKE3 (the chunks extra)
        from ..spoke.sealed import load_key as load_cache_key
    try:
        identity = SiteIdentity.create(state.config.identity_dir, name, hosts, parse_labels(labels))
        key_file = state.config.spoke.cache_key_file or state.config.identity_dir / "cache.key"
        if cache_key:
            load_cache_key(key_file, create=True)
    except LoomError as exc:
        failed(f"{exc.code}: {exc}")
        sys.exit(1)
    out.print(f"site {identity.name}: certificate {identity.cert_path}")
    out.print(f"fingerprint {fingerprint(identity.cert_pem)}")
    if cache_key:
        out.print(f"cache key {key_file} (mode 0600)")
        if state.config.spoke.cache_key_file is None:
            out.print(f'seal the cache with it: [spoke] cache_key_file = "{key_file}"')


@site.command("add")
@click.argument("name")
@click.option("--cert", type=click.Path(path_type=Path, exists=True), required=True)
@click.option("--label", "labels", multiple=True, help="KEY=VALUE, beside the certificate's.")
@offline_option
@click.pass_context
@run
async def site_add(ctx: click.Context, name: str, cert: Path, labels: tuple[str, ...]) -> None:
    """On a hub: trust site NAME, pinned to its certificate (never under the hub's name)."""
    from ..core.sites import parse_labels

    async with administering(ctx) as admin:
        pinned = await admin.add_site(cert.read_bytes(), parse_labels(labels), name)
    tags = ", ".join(f"{k}={v}" for k, v in pinned["labels"].items())
    out.print(
        f"trusting {pinned['site']} ({pinned['fingerprint'][:16]}...){' ' + tags if tags else ''}"
    )


@site.command("list")
@JSON_LINES
@offline_option
@click.pass_context
@run
async def site_list(ctx: click.Context, as_json: bool) -> None:
    """Sites this hub trusts (and those it revoked)."""
    table = Table("site", "labels", "fingerprint", "state")
    async with administering(ctx) as admin:
        sites = await admin.list_sites()
    if as_json:
        _json_lines(sites)
        return
    for s in sites:
        labels = ", ".join(f"{k}={v}" for k, v in s["labels"].items())
        state = "trusted" if s["trusted"] else "revoked"
        table.add_row(s["site"], labels, s["fingerprint"][:16], state)
    out.print(table)


@site.command("revoke")
@click.argument("name")
@offline_option
@click.pass_context
@run
async def site_revoke(ctx: click.Context, name: str) -> None:
    """Stop trusting a site: its next request is refused."""
    async with administering(ctx) as admin:
        await admin.revoke_site(name)


@site.command("remove")
@click.argument("name")
@offline_option
@click.pass_context
@run
async def site_remove(ctx: click.Context, name: str) -> None:
    """Forget a site entirely (to pin a new certificate for it)."""
    async with administering(ctx) as admin:
        await admin.remove_site(name)


# -- placement policies ------------------------------------------------------------------


@main.group()
def policy() -> None:
    """Residency: which sites (by label) may hold or receive the data of which paths."""


@policy.command("add")
@click.argument("name")
@click.option("--paths", "globs", multiple=True, required=True, help="A path glob, /a/b/**.")
@click.option("--tag", help="KEY=VALUE: files with this tag are covered too, wherever they are.")
@click.option(
    "--allow-sites", "allow", multiple=True, required=True, help="A site label KEY=VALUE (any)."
)
@click.option(
    "--metadata",
    type=click.Choice(["visible", "hidden"]),
    default="visible",
    help="Whether refused sites see names and sizes (visible) or nothing (hidden).",
)
@offline_option
@click.pass_context
@run
async def policy_add(
    ctx: click.Context,
    name: str,
    globs: tuple[str, ...],
    tag: str | None,
    allow: tuple[str, ...],
    metadata: str,
) -> None:
    """Add (or replace) policy NAME; returns once every spoke that may no longer hold its
    data has evicted it (the hub at --hub confirms; --offline: once they reconnect)."""
    from ..core.directory import Directory
    from ..core.placement import Policy

    rule = Policy.build(name, globs, allow, tag, metadata)
    async with administering(ctx) as admin:
        seq = await admin.put_policy(rule)
        if isinstance(admin, Directory):  # no hub serves: spokes evict as they come back
            out.print(f"policy {name} stored; spokes apply it when their hub serves again")
            return
        try:
            await admin.rest.settle(seq)
        except BackendUnavailable as exc:
            raise BackendUnavailable(
                f"policy {name} is stored, but no spoke's eviction is confirmed: {exc}"
            ) from None
    out.print(f"policy {name} in force; spokes it refuses hold none of its data")


@policy.command("list")
@JSON_LINES
@offline_option
@click.pass_context
@run
async def policy_list(ctx: click.Context, as_json: bool) -> None:
    """The placement policies of this hub."""
    table = Table("policy", "paths", "tag", "allowed sites", "metadata")
    async with administering(ctx) as admin:
        policies = await admin.list_policies()
    if as_json:
        _json_lines(policies)
        return
    for p in policies:
        table.add_row(
            p["policy"], " ".join(p["paths"]), p["tag"] or "", " ".join(p["allow"]), p["metadata"]
        )
    out.print(table)


@policy.command("remove")
@click.argument("name")
@offline_option
@click.pass_context
@run
async def policy_remove(ctx: click.Context, name: str) -> None:
    """Remove policy NAME (a loosening: nothing to evict)."""
    async with administering(ctx) as admin:
        await admin.remove_policy(name)
