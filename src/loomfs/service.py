"""The hub process (composition root, above every layer): catalog, namespace, watchers,
rescans, the REST API and the S3 gateway wired together.

``loomfs hub serve`` runs one of these. On start it resumes any import that a killed hub
left half done, follows posix volumes with inotify, and rescans every volume periodically
(which is how changes to S3 volumes made by other tools are found).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import json
import logging
import signal
import ssl
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from aiohttp import web
from prometheus_client import Counter, Gauge

from . import health, paths
from .config import Config, TlsSettings, host_port, parse_size
from .core import acl
from .core.acl import AclAuthorizer
from .core.admin import LocalAdmin, check_volume_url
from .core.audit import AuditLog, AuditReader, load_key
from .core.backends.base import Capability
from .core.backends.posix import TEMP_PREFIX, PosixBackend
from .core.catalog.base import Catalog, Notices
from .core.certs import fingerprint
from .core.directory import Directory
from .core.dirlock import DirectoryLock
from .core.exports import DEFAULT as DEFAULT_EXPORTS
from .core.exports import DEFAULT_SHARES, NfsExports, SmbShares
from .core.metrics import HUB
from .core.placement import PlacementAuthorizer
from .core.registry import open_catalog
from .core.sites import SiteRegistry
from .core.types import SYSTEM, Feed, VolumeState
from .core.users import UserRegistry
from .errors import BackendUnavailable, ConfigError, LoomError, NotFound
from .fabric.identity import SiteIdentity, https_certificate, https_server_context
from .fabric.probe import check_links
from .fabric.server import FabricServer, TlsSite
from .hub.assimilate import ScanStats, path_of
from .hub.chunks import HubChunks
from .hub.coherence import read_leases
from .hub.deltastore import DeltaStore
from .hub.intents import IntentLog, SharedIntentLog
from .hub.lifecycle import Expirer
from .hub.namespace import HubNamespace
from .hub.versions import VersionStore
from .hub.watch import PosixWatcher
from .namespace.base import Namespace
from .namespace.governed import GovernedNamespace
from .namespace.sse import KeyStore
from .protocols.console import Console
from .protocols.console.sessions import Sessions
from .protocols.nfs import AccessGate, NfsServer
from .protocols.s3 import S3Gateway
from .protocols.smb import SmbServer
from .rest.admin import AdminApi, AdminRoutes, exports_of
from .rest.auth import HubAuthenticator, RegistryAuthenticator
from .rest.client import RestNamespace
from .rest.local import LocalReads
from .rest.plans import routes as plan_routes
from .rest.server import RestServer
from .spoke.cache import Cache
from .spoke.namespace import SpokeNamespace
from .spoke.prefetcher import Prefetcher
from .spoke.sealed import BlockCipher
from .spoke.sealed import load_key as load_cache_key

log = logging.getLogger(__name__)

SCANNED = Counter(
    "loomfs_assimilated_entries_total", "Entries scanned by imports and rescans", registry=HUB
)
FEED_POLL = 0.05
TRUST_REFRESH = 2.0
#: how often a gateway reads the volumes anyway, though no notice came (one lost with
#: the listener's connection)
VOLUMES_POLL = 5.0
#: seconds after which a chunk staged in a shared [hub] staging_dir is surely abandoned
STAGED_TTL_S = 86400.0
HEAD_SEQ = Gauge("loomfs_change_log_head", "Sequence number of the newest change", registry=HUB)
VOLUMES = Gauge("loomfs_volumes", "Volumes attached to this hub", registry=HUB)


HISTORY_FILE = "console-history.db"  # the console charts' samples (a day of them)


def console_sessions(config: Config) -> Sessions:
    """The web console's sessions, kept in the data directory over restarts."""
    return Sessions(store=config.site.data_dir / "console-sessions.db")


def audit_log(config: Config) -> AuditLog | None:
    """The site's audit log, if ``[audit] enabled`` (not started)."""
    if not config.audit.enabled:
        return None
    return AuditLog(
        config.audit_dir,
        site=config.site.name,
        key=load_key(config.audit.key_file),
        segment_size=parse_size(config.audit.segment_size),
    )


def own_names(config: Config) -> set[str]:
    """The names of this site, which no spoke may be pinned under: its configured name
    and its certificate's."""
    own = {config.site.name}
    with contextlib.suppress(NotFound):
        own.add(SiteIdentity.load(config.identity_dir).name)
    return own


def intent_log(catalog: Catalog, path: Path, durable: bool) -> IntentLog:
    """The log of changes under way: in the catalog's database where several gateways
    may share it, so that any of them repairs a dead one's; else the local file."""
    records = catalog.intent_records()
    return IntentLog(path, durable=durable) if records is None else SharedIntentLog(path, records)


class HubService:
    def __init__(self, config: Config, *, durable: bool = True) -> None:
        """``durable=False``: changes survive a crash of the process at once and power
        loss after ``sync`` (``fsync``), as a local file system's (a mount's own hub)."""
        self.config = config
        self.lock = DirectoryLock(config.site.data_dir, "data directory")  # one hub each
        self.catalog: Catalog = open_catalog(config.catalog_url)
        self.catalog.durable = durable
        self.placement = PlacementAuthorizer(self.catalog, SiteRegistry(self.catalog))
        self.namespace = HubNamespace(
            self.catalog,
            read_leases(
                config.hub.lease_ttl,
                config.site.data_dir / "leases.granted",
                self.catalog.read_lease_records(),
            ),
            self.placement,
            intents=intent_log(self.catalog, config.site.data_dir / "writes.intents", durable),
            versions=VersionStore(self.catalog, config.site.data_dir / "versions"),
        )
        #: the site's audit log ([audit] enabled): it buffers from now on and is written
        #: from ``start`` on, so the namespace can be given it before the hub starts
        self.audit = audit_log(config)
        # what every edge gets, the fabric link to spokes too: the namespace behind one
        # chain of authorizers (ACL rules for users, residency for sites) and audit; volume
        # administration and the hub's own machinery use the inner one, and every governed
        # call lands in the audit log
        self.authorizer = AclAuthorizer(self.catalog)
        self.nfs_exports = NfsExports(self.catalog, config.nfs.exports)
        self.smb_shares = SmbShares(self.catalog, config.smb.shares)
        self.governed = GovernedNamespace(
            self.namespace,
            [self.authorizer, self.placement],
            audit=self.audit,
            rules=self.authorizer,
            keys=KeyStore(config.site.data_dir / "sse", config.hub.kms_keys),
        )
        self.expirer = Expirer(self.governed, self.catalog, config.hub.lifecycle_day)
        self._watchers: dict[str, PosixWatcher] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        #: S3 parts and uploaded chunks: on storage every gateway reaches, when set
        self.staging_dir = config.hub.staging_dir or config.site.data_dir
        store_size = parse_size(config.hub.delta_store_size)
        self.chunks = HubChunks(
            self.namespace,
            self.staging_dir / "chunk-staging",
            gate=self.governed,
            delta_store=DeltaStore(config.site.data_dir / "delta-store.db", store_size)
            if store_size
            else None,
        )

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        self.lock.acquire()
        if self.audit is not None:
            self.audit.start()
        await self.catalog.open()
        # chunks of uploads a stopped hub never committed; in a shared directory, other
        # gateways' uploads may be under way: only those of a day ago are surely dead
        self.chunks.clear_staging(STAGED_TTL_S if self.config.hub.staging_dir else None)
        volumes = await self.namespace.load_volumes()
        await self.namespace.recover()  # before any watcher or client: no write is under way
        VOLUMES.set(len(volumes))
        HEAD_SEQ.set(await self.catalog.head_seq())
        for volume in volumes:
            await self._start_watcher(volume.mount)
        self._spawn(self._elected_forever())
        if (notices := self.catalog.volume_notices()) is not None:
            self._spawn(self._follow_volumes_forever(notices))
        if isinstance(self.namespace.intents, SharedIntentLog) and self.config.hub.repair_interval:
            self._spawn(self._repair_forever(self.config.hub.repair_interval))

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for watcher in self._watchers.values():
            await watcher.stop()
        self._watchers.clear()
        await self.namespace.close()
        self.chunks.close()
        await self.catalog.close()
        if self.audit is not None:  # last: whatever stopping recorded is written too
            await asyncio.to_thread(self.audit.close)
        self.lock.release()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- change detection ------------------------------------------------------------------

    async def _start_watcher(self, mount: str) -> None:
        mounted = self.namespace.mounts.get(mount)
        if not self.config.hub.watch or mounted is None or mount in self._watchers:
            return
        backend = mounted.backend
        if Capability.NOTIFY not in backend.capabilities:
            return
        assert isinstance(backend, PosixBackend)

        async def on_change(keys: set[str] | None) -> None:
            try:
                if keys is None:
                    await self.namespace.sync_volume(mount)
                    return
                await self.namespace.refresh_all(path_of(mount, key) for key in keys)
                HEAD_SEQ.set(await self.catalog.head_seq())
            except LoomError as exc:
                log.warning("could not record a change", extra={"mount": mount, "error": str(exc)})

        watcher = PosixWatcher(Path(backend.root), on_change, TEMP_PREFIX)
        await watcher.start()
        self._watchers[mount] = watcher

    async def _logged_sync(self, mount: str) -> ScanStats | None:
        try:
            stats = await self.namespace.sync_volume(mount)
        except LoomError as exc:
            log.error("scan failed", extra={"mount": mount, "error": str(exc)})
            return None
        SCANNED.inc(stats.scanned)
        HEAD_SEQ.set(await self.catalog.head_seq())
        log.info("scan done", extra={"scan": stats.as_dict()})
        return stats

    async def _elected_forever(self) -> None:
        """Once elected among the gateways over this catalog (at once for one hub), do
        what is done once per cluster: resume the imports a stopped gateway left, rescan,
        run the lifecycle rules; stop when no longer elected, and stand again."""
        while True:
            await self.catalog.elected()
            log.info("elected to rescan and run the lifecycle rules")
            duties: list[asyncio.Task[Any]] = []
            try:
                for volume in await self.catalog.volumes():
                    if volume.state is VolumeState.IMPORTING:
                        log.info(
                            "resuming import",
                            extra={"mount": volume.mount, "after": volume.checkpoint},
                        )
                        duties.append(asyncio.create_task(self._logged_sync(volume.mount)))
            except LoomError as exc:  # the database is away: stand again
                log.warning("could not read the volumes", extra={"error": str(exc)})
            if self.config.hub.rescan_interval > 0:
                duties.append(
                    asyncio.create_task(self._rescan_forever(self.config.hub.rescan_interval))
                )
            if self.config.hub.lifecycle_interval > 0:
                duties.append(
                    asyncio.create_task(self._expire_forever(self.config.hub.lifecycle_interval))
                )
            try:
                await self.catalog.unelected()
            finally:
                for duty in duties:
                    duty.cancel()
                await asyncio.gather(*duties, return_exceptions=True)
            log.warning("no longer elected: stopped rescans and lifecycle runs")

    async def _rescan_forever(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            for mount in list(self.namespace.mounts):
                await self._logged_sync(mount)

    async def _follow_volumes_forever(self, notices: Notices) -> None:
        """Mount the volumes other gateways add and unmount those they remove, as they
        commit: their import or removal is theirs, this gateway serves and watches."""
        while True:
            seen = notices.seen  # before the read: a change after it wakes
            try:
                added, gone = await self.namespace.follow_volumes()
            except LoomError as exc:  # the database is away: the next round reads again
                log.warning("could not follow the volumes", extra={"error": str(exc)})
                added, gone = [], []
            for mount in gone:
                if (watcher := self._watchers.pop(mount, None)) is not None:
                    await watcher.stop()
                log.info("volume removed elsewhere", extra={"mount": mount})
            for volume in added:
                await self._start_watcher(volume.mount)
                log.info("volume added elsewhere", extra={"mount": volume.mount})
            VOLUMES.set(len(self.namespace.mounts))
            await notices.after(seen, VOLUMES_POLL)

    async def _repair_forever(self, interval: float) -> None:
        """Repair the changes of gateways that died (a kill, a lost machine) soon, not
        at their restart: until then their paths' volume and catalog may disagree."""
        while True:
            await asyncio.sleep(interval)
            try:
                if repaired := await self.namespace.repair():
                    log.info("repaired a gone gateway's changes", extra={"paths": repaired})
            except LoomError as exc:  # the database is away: the next round tries again
                log.warning("could not repair", extra={"error": str(exc)})

    async def _expire_forever(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await self.expirer.run_once(time.time())
            except LoomError as exc:
                log.error("lifecycle run failed", extra={"error": str(exc)})

    # -- VolumeAdmin -----------------------------------------------------------------------

    async def add_volume(
        self, mount: str, url: str, progress: Callable[[ScanStats], None]
    ) -> ScanStats:
        # whichever edge asked: posix volumes only from [hub] volume_roots
        url = check_volume_url(url, self.config.hub.volume_roots)
        log.info("adding volume", extra={"mount": mount, "url": url})
        stats = await self.namespace.add_volume(mount, url, progress)
        SCANNED.inc(stats.scanned)
        VOLUMES.set(len(self.namespace.mounts))
        HEAD_SEQ.set(await self.catalog.head_seq())
        await self._start_watcher(paths.normalize(mount))
        log.info("volume imported", extra={"scan": stats.as_dict()})
        return stats

    async def rescan(self, mount: str, progress: Callable[[ScanStats], None]) -> ScanStats:
        stats = await self.namespace.sync_volume(mount, progress)
        SCANNED.inc(stats.scanned)
        HEAD_SEQ.set(await self.catalog.head_seq())
        log.info("rescan done", extra={"scan": stats.as_dict()})
        return stats

    async def remove_volume(self, mount: str) -> None:
        mount = paths.normalize(mount)
        watcher = self._watchers.pop(mount, None)
        if watcher is not None:
            await watcher.stop()
        await self.namespace.remove_volume(mount)
        VOLUMES.set(len(self.namespace.mounts))
        log.info("volume removed", extra={"mount": mount})

    async def list_volumes(self) -> list[dict[str, Any]]:
        return [
            {
                "mount": v.mount,
                "url": v.url,
                "state": v.state.value,
                "checkpoint": v.checkpoint,
                "created_ns": v.created_ns,
                "last_scan_ns": v.last_scan_ns,
            }
            for v in await self.catalog.volumes()
        ]

    async def feed(
        self,
        site: str | None,
        since: int,
        limit: int,
        *,
        ack: int = 0,
        wait: float = 0.0,
        gone: Callable[[], bool] = lambda: False,
    ) -> Feed:
        """Changes after ``since``, held up to ``wait`` seconds until there is one (a long
        poll). A spoke's poll also renews its read lease and acknowledges ``ack``."""
        lease = await self.namespace.leases.renew(site, ack) if site is not None else None
        deadline = time.monotonic() + wait
        while True:
            seen = self.catalog.commits_seen()  # before the read: a commit after it wakes
            changes = await self.catalog.changes(since, limit)
            if site is not None:  # what a placement policy hides from it, it doesn't learn
                changes = await self.placement.redact(site, changes)
            if changes or time.monotonic() >= deadline or gone():
                return Feed(changes, await self.catalog.head_seq(), lease)
            # the catalog may be written by other processes (other gateways): it tells of
            # their commits where it can (PostgreSQL), else it is polled (an indexed read)
            await self.catalog.changed(seen, FEED_POLL, deadline - time.monotonic())

    async def settle(self, seq: int) -> None:
        """Return once every leased spoke applied change ``seq`` (say a policy's evictions,
        logged by another process), with this hub already deciding by that policy."""
        await self.placement.reload(force=True)
        await self.namespace.leases.settle(seq)

    # -- serving ---------------------------------------------------------------------------

    def s3_gateway(self) -> S3Gateway:
        s3 = self.config.s3
        gateway = S3Gateway(
            self.governed,
            # a signed request per key lookup: remembered as long as ACL rules are
            UserRegistry(self.catalog, remember=acl.REFRESH),
            s3.buckets,
            staging=self.staging_dir / "s3-uploads",
            uploads=self.catalog.upload_records(),
            region=s3.region,
            bucket_root=s3.bucket_root,
            anonymous=s3.anonymous,
            site=self.config.site.name,
            max_object_size=s3.max_object_size,
            max_part_size=s3.max_part_size,
            max_upload_size=s3.max_upload_size,
            lifecycle_day=self.config.hub.lifecycle_day,
        )
        self.expirer.hooks.append(gateway.expire_uploads)
        return gateway

    def authenticator(self) -> RegistryAuthenticator:
        return RegistryAuthenticator(
            UserRegistry(self.catalog),
            site=self.config.site.name,
            anonymous=self.config.hub.anonymous,
        )

    def admin_api(self) -> AdminApi:
        """Administration as every edge gets it (REST, the console): governed, audited."""
        config = self.config
        reader = None
        if self.audit is not None:
            reader = AuditReader(config.audit_dir, load_key(config.audit.key_file))
        directory = Directory(self.catalog, own_names(config))
        return AdminApi(
            directory, self.governed, audit=reader, volumes=self, exports=exports_of(config),
            nfs=self.nfs_exports, smb=self.smb_shares,
        )  # fmt: skip

    def rest_server(self) -> RestServer:
        """The REST API as clients get it: the governed namespace, administration decided
        by the same governance; the web console at /ui over both."""
        api, authenticate = self.admin_api(), self.authenticator()
        console = Console(
            self.governed, authenticate.identify, site=self.config.site.name, admin=api,
            sessions=console_sessions(self.config), audit=self.audit,
            history=self.config.site.data_dir / HISTORY_FILE,
        )  # fmt: skip
        return RestServer(
            self.governed,
            self,
            site=self.config.site.name,
            authenticate=authenticate,
            governance=self.governed,
            routes=[*AdminRoutes(api).routes(), *console.routes()],
            health=self.health,
            running=[console.sampling],
        )

    async def serve(self, ready_file: Path | None = None) -> None:
        """Run until SIGTERM or SIGINT, then stop cleanly; the S3 gateway too when
        ``[s3] listen`` is set, and the fabric link for spokes when ``[fabric] listen`` is."""
        await self.start()
        try:
            local = LocalAdmin(self.config.site.data_dir)
            made = await local.bootstrap(
                UserRegistry(self.catalog), self.audit, self.config.site.name
            )
            if made is not None:
                log.info("made the local administrator", extra={"key_file": str(local.key_file)})
            server = self.rest_server()
            config, listen = self.config, self.config.listen_host_port
            listeners = [
                Listener(
                    "url", server.app(), listen, listener_tls(config, "hub", config.hub, listen)
                )
            ]
            if config.s3.listen:
                listen = host_port(config.s3.listen, "s3.listen")
                tls = listener_tls(config, "s3", config.s3, listen)
                listeners.append(Listener("s3", self.s3_gateway().app(), listen, tls))
            if self.config.fabric.listen:
                fabric = await self._fabric_server()
                listen = host_port(self.config.fabric.listen, "fabric.listen")
                listeners.append(Listener("fabric", fabric.app(), listen, fabric.ssl_context()))
            sockets = [  # governed
                *sftp_listeners(self.config, self.governed, self.catalog),
                *nfs_listeners(
                    self.config,
                    self.governed,
                    gate=self.governed,
                    live=self.nfs_exports,
                    inline_reads=True,
                ),
                *smb_listeners(
                    self.config, self.governed, self.catalog, hub=True, live=self.smb_shares
                ),
            ]
            await serve_until_signal(listeners, ready_file, "hub", sockets, local=local)
        finally:
            await self.stop()

    async def health(self) -> dict[str, health.Check]:
        config = self.config
        certs = {"site certificate": config.identity_dir / "site.pem"}
        if config.hub.tls_cert is not None:
            certs["HTTPS certificate"] = config.hub.tls_cert
        return await health.hub_checks(
            self.catalog, self.namespace, config.site.data_dir,
            min_free=parse_size(config.site.min_free),
            certs={what: path for what, path in certs.items() if path.exists()},
        )  # fmt: skip

    def fabric_server(self, identity: SiteIdentity, trusted: Mapping[str, bytes]) -> FabricServer:
        """The fabric link as spokes get it: placement policies for their site, ACL rules
        for the users they forward, chunks, audit."""
        return FabricServer(
            self.governed, self, identity, trusted,
            chunks=self.chunks, audit=self.audit,
            users=UserRegistry(self.catalog), groups_of=self.authorizer.groups_of,
            governance=self.governed,
        )  # fmt: skip

    async def _fabric_server(self) -> FabricServer:
        identity = SiteIdentity.load(self.config.identity_dir)
        sites = SiteRegistry(self.catalog)
        fabric = self.fabric_server(identity, await sites.trusted())

        async def follow_trust() -> None:
            while True:  # pins and revocations made with `loomfs site` take effect here
                await asyncio.sleep(TRUST_REFRESH)
                with contextlib.suppress(LoomError):
                    fabric.trust(await sites.trusted())

        self._spawn(follow_trust())
        return fabric


class Listener(NamedTuple):
    name: str
    app: web.Application
    address: tuple[str, int]
    ssl: ssl.SSLContext | None = None


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name other than localhost, or a wildcard: reachable from afar
        return False


def listener_tls(
    config: Config, name: str, section: TlsSettings, address: tuple[str, int]
) -> ssl.SSLContext | None:
    """The TLS that the listener of config section ``name`` on ``address`` serves with, by
    that section's ``tls`` keys; None: plain HTTP."""
    host = address[0]
    if section.tls_cert is not None and section.tls_key is not None:
        return https_server_context(section.tls_cert, section.tls_key)
    if section.tls == "on" or (section.tls == "auto" and not _loopback(host)):
        hosts = [host, *(host_port(other, "listen")[0] for other in _listen_addresses(config))]
        cert, key = https_certificate(config.identity_dir, config.site.name, hosts)
        sha256 = fingerprint(cert.read_bytes())
        # in the message too: a text log shows no fields, and this is what clients are told
        log.info(
            "the [%s] listener serves HTTPS with the site's self-signed certificate %s "
            "(SHA-256 %s): clients trust that file",
            name, cert, sha256,
            extra={"listener": name, "cert": str(cert), "sha256": sha256},
        )  # fmt: skip
        return https_server_context(cert, key)
    if not _loopback(host):
        where = f"{host}:{address[1]}"
        log.warning(
            "the [%s] listener on %s has no TLS: credentials and data cross the network in "
            "clear",
            name, where,
            extra={"listener": name, "address": where, "tls": section.tls},
        )  # fmt: skip
    return None


def _listen_addresses(config: Config) -> list[str]:
    """Every HOST:PORT this site's HTTP listeners may bind: what its certificate names."""
    found = [config.hub.listen, config.spoke.listen, config.s3.listen]
    return [listen for listen in found if listen]


class SocketServer(Protocol):
    """A server that is not an aiohttp app (SFTP over SSH, NFS over ONC RPC): bound, then
    closed."""

    async def start(self, host: str, port: int) -> int:
        """Listen (port 0: a free one) and return the bound port."""

    async def stop(self) -> None: ...


class SocketListener(NamedTuple):
    name: str
    scheme: str
    server: SocketServer
    address: tuple[str, int]


def sftp_listeners(config: Config, namespace: Namespace, catalog: Catalog) -> list[SocketListener]:
    """The SFTP server where ``[sftp] listen`` is set (users from ``catalog``'s registry)."""
    sftp = config.sftp
    if not sftp.listen:
        return []
    try:  # asyncssh is an extra: only a site that serves SFTP needs it
        from .protocols.sftp import SftpServer  # noqa: PLC0415
    except ImportError as exc:
        raise ConfigError(
            f"[sftp] listen is set but {exc.name} is missing: pip install 'loomfs[sftp]'"
        ) from exc
    server = SftpServer(
        namespace,
        UserRegistry(catalog),
        sftp.host_key or config.identity_dir / "ssh_host_ed25519_key",
        spool=config.site.data_dir / "sftp-spool",
        root=sftp.root,
        umask=sftp.umask,
        site=config.site.name,
    )
    return [SocketListener("sftp", "sftp", server, host_port(sftp.listen, "sftp.listen"))]


def nfs_listeners(
    config: Config,
    namespace: Namespace,
    *,
    gate: AccessGate | None = None,
    live: NfsExports | None = None,
    inline_reads: bool = False,
) -> list[SocketListener]:
    """The NFSv3 server where ``[nfs] listen`` is set; no exports configured: '/' to
    loopback clients only. ``gate`` answers ACCESS (a hub's governed namespace); ``live``:
    the exports added at run time too (a hub's); ``inline_reads``: the namespace's reads
    need no task (a hub's: no link, no timeouts), so the RPC edge may answer them inline."""
    nfs = config.nfs
    if not nfs.listen:
        return []
    server = NfsServer(
        namespace,
        nfs.exports or DEFAULT_EXPORTS,
        state_dir=config.site.data_dir / "nfs",
        spool_dir=config.site.data_dir / "nfs-spool",
        uid_map=nfs.uid_map,
        site=config.site.name,
        commit_delay=nfs.commit_delay,
        gate=gate,
        rpcbind=host_port(nfs.rpcbind, "nfs.rpcbind") if nfs.rpcbind else None,
        live=live,
        inline_reads=inline_reads,
    )
    return [SocketListener("nfs", "nfs", server, host_port(nfs.listen, "nfs.listen"))]


def smb_listeners(
    config: Config,
    namespace: Namespace,
    catalog: Catalog,
    *,
    hub: bool,
    live: SmbShares | None = None,
) -> list[SocketListener]:
    """Samba's smbd over a mount of ``namespace`` where ``[smb] listen`` is set (users and
    their SMB passwords from ``catalog``'s registry). smbd resolves share paths (as root,
    before it becomes the user) as the site itself, so a share may be private: at a hub
    loomfs, audited as smb; at a spoke the spoke, which its hub sees as ``site:NAME`` (an
    internal principal's calls go as the site). ``live``: the shares added at run time
    too (a hub's)."""
    smb = config.smb
    if not smb.listen:
        return []
    shares = smb.shares or DEFAULT_SHARES
    server = SmbServer(
        namespace, UserRegistry(catalog), shares,
        state_dir=config.site.data_dir / "smb", site=config.site.name, smbd=smb.smbd,
        resolver=replace(SYSTEM, site=config.site.name, protocol="smb" if hub else "internal"),
        extended_attributes=smb.extended_attributes, live=live,
    )  # fmt: skip
    return [SocketListener("smb", "smb", server, host_port(smb.listen, "smb.listen"))]


async def serve_until_signal(
    listeners: list[Listener],
    ready_file: Path | None,
    what: str,
    sockets: Sequence[SocketListener] = (),
    *,
    local: LocalAdmin | None = None,
) -> None:
    """Serve each app (and each socket server) on its address until SIGTERM or SIGINT;
    ``ready_file`` gets the bound URLs as JSON once all listen (port 0 picks a free port),
    and so does ``local``'s record of where this site's hub serves, while it does."""
    runners: list[web.AppRunner] = []
    started: list[SocketServer] = []
    urls: dict[str, str] = {}
    listening = False
    try:
        for listener in listeners:
            runner = web.AppRunner(listener.app, access_log=None)
            await runner.setup()
            runners.append(runner)
            host, port = listener.address
            # TLS (the fabric link): a site that logs the handshakes it refuses
            site_class = web.TCPSite if listener.ssl is None else TlsSite
            site = site_class(runner, host, port, ssl_context=listener.ssl)
            await site.start()
            bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            scheme = "https" if listener.ssl is not None else "http"
            urls[listener.name] = f"{scheme}://{host}:{bound}"
        for socket in sockets:
            host, port = socket.address
            bound = await socket.server.start(host, port)
            started.append(socket.server)
            urls[socket.name] = f"{socket.scheme}://{host}:{bound}"
        log.info(f"{what} listening", extra=urls)
        listening = True
        # before anyone is told it is ready: a SIGTERM right after must stop it cleanly
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        if ready_file is not None:  # whole or not at all: a watcher may read it at once
            partial = ready_file.with_name(ready_file.name + ".tmp")
            partial.write_text(json.dumps(urls))
            partial.replace(ready_file)
        if local is not None:
            local.record_serving(urls)
        await stop.wait()
    finally:
        if listening:  # else the error that stopped it says it all
            log.info(f"{what} stopping")
        if local is not None:
            local.stopped()
        for server in started:
            await server.stop()
        for runner in runners:
            await runner.cleanup()
        with contextlib.suppress(FileNotFoundError):
            if ready_file is not None:
                ready_file.unlink()


class SpokeService:
    """A spoke: attaches exports of a hub over the fabric link and serves them here."""

    def __init__(self, config: Config) -> None:
        self.config = config
        spoke = config.spoke
        if not spoke.hub or not spoke.hub_cert or not spoke.attach:
            raise ConfigError("a spoke needs the hub's URL, its certificate and what to attach")
        self.identity = identity = SiteIdentity.load(config.identity_dir)
        try:
            hub_cert = spoke.hub_cert.read_bytes()
        except OSError as exc:
            raise ConfigError(f"cannot read the hub certificate {spoke.hub_cert}: {exc}") from None
        self.tls = identity.client_context(hub_cert)
        client = RestNamespace(spoke.hub, ssl_context=self.tls, forward=True)
        self.authenticate = HubAuthenticator(client, site=identity.name, anonymous=spoke.anonymous)
        cipher = None
        if spoke.cache_key_file is not None:
            cipher = BlockCipher(load_cache_key(spoke.cache_key_file, create=True))
        cache_dir = spoke.cache_dir or config.site.data_dir / "cache"
        # before the journal is read: a second spoke on it would replay the same writes
        self.lock = DirectoryLock(cache_dir, "cache directory")
        self.lock.acquire()
        cache = Cache(
            cache_dir,
            parse_size(spoke.cache_size),
            link=client,
            cipher=cipher,
        )
        self.namespace = SpokeNamespace(
            client, cache, spoke.attach, site=identity.name, write_back=spoke.write_back
        )
        self.prefetcher = Prefetcher(self.namespace) if spoke.prefetch else None

    async def start(self) -> None:
        """Attach the hub's exports and start prefetching: all a mount that runs this
        spoke in its own process needs (``serve`` adds the protocols). A link that can't
        be made for want of trust or at a wrong address is a ``ConfigError`` saying what to
        fix; a hub that is only unreachable now is not: the spoke serves its cache."""
        spoke = self.config.spoke
        assert spoke.hub is not None and spoke.hub_cert is not None  # checked in __init__
        try:
            await check_links(
                spoke.hub, self.tls, site=self.identity.name,
                site_cert=self.identity.cert_path, hub_cert=spoke.hub_cert,
            )  # fmt: skip
        except BackendUnavailable as exc:
            log.warning("starting offline: %s", exc)
        await self.namespace.start()
        if self.prefetcher is not None:
            self.prefetcher.start()

    async def stop(self) -> None:
        if self.prefetcher is not None:
            await self.prefetcher.close()
        await self.namespace.close()
        self.lock.release()

    def rest_server(self) -> RestServer:
        """The spoke's REST API (its prefetcher's plan routes where it prefetches) and
        its web console at /ui."""
        prefetcher = self.prefetcher
        console = Console(
            self.namespace, self.authenticate.identify, site=self.namespace.site,
            spoke=self.namespace, prefetch=prefetcher.report if prefetcher is not None else None,
            sessions=console_sessions(self.config),
            history=self.config.site.data_dir / HISTORY_FILE,
        )  # fmt: skip
        # a loader on this machine reads cached files from the cache files, each open
        # decided as the REST read it stands for
        local = LocalReads(self.namespace, self.authenticate.principal_of)
        on = self.config.spoke.local_reads
        return RestServer(
            self.namespace,
            spoke=self.namespace,
            site=self.namespace.site,
            authenticate=self.authenticate,
            routes=[
                *(plan_routes(prefetcher) if prefetcher is not None else ()),
                *console.routes(),
                *(local.routes() if on else ()),
            ],
            health=self.health,
            running=[console.sampling, *([local.serving] if on else [])],
        )

    async def health(self) -> dict[str, health.Check]:
        spoke = self.config.spoke
        assert spoke.hub is not None and spoke.hub_cert is not None  # checked in __init__
        certs = {
            "pinned hub certificate": spoke.hub_cert,
            "site certificate": self.identity.cert_path,
        }
        if spoke.tls_cert is not None:
            certs["HTTPS certificate"] = spoke.tls_cert
        probe = functools.partial(
            check_links, spoke.hub, self.tls, site=self.identity.name,
            site_cert=self.identity.cert_path, hub_cert=spoke.hub_cert,
        )  # fmt: skip
        return await health.spoke_checks(
            self.namespace, probe=probe, min_free=parse_size(self.config.site.min_free),
            certs=certs,
        )  # fmt: skip

    async def serve(self, ready_file: Path | None = None) -> None:
        # the spoke's own catalog holds its users (SFTP and SMB logins) and nothing else yet
        logins = self.config.sftp.listen or self.config.smb.listen
        users = open_catalog(self.config.catalog_url) if logins else None
        try:
            await self.start()
            server = self.rest_server()
            listen = host_port(self.config.spoke.listen, "spoke.listen")
            sockets: list[SocketListener] = []
            if users is not None:
                await users.open()
                sockets = [
                    *sftp_listeners(self.config, self.namespace, users),
                    *smb_listeners(self.config, self.namespace, users, hub=False),
                ]
            sockets += nfs_listeners(self.config, self.namespace)
            tls = listener_tls(self.config, "spoke", self.config.spoke, listen)
            listeners = [Listener("url", server.app(), listen, tls)]
            await serve_until_signal(listeners, ready_file, "spoke", sockets)
        finally:
            await self.stop()
            if users is not None:
                await users.close()
