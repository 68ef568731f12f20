"""Site configuration (core layer): one TOML file, overridable from the environment.

Every key can be set as ``LOOMFS_<SECTION>__<KEY>`` (``LOOMFS_HUB__LISTEN=0.0.0.0:7070``;
a list or table key as JSON, a list of paths also joined by ':');
the file is found through ``--config``, ``LOOMFS_CONFIG`` or ``./loomfs.toml``. Secrets do
not belong here: S3 credentials come from the AWS credential chain, database passwords
from ``~/.pgpass``, so this file can be shown and logged. The one exception, a CLI user's
own ``[client] secret_key``, is a ``SecretStr`` (never shown); ``LOOMFS_SECRET_KEY`` is
the better place for it.
"""

from __future__ import annotations

import ipaddress
import json
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Self, get_origin

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from .errors import ConfigError

ENV_PREFIX = "LOOMFS_"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _joined(cls: type, value: object) -> object:
    """A list of paths as the environment gives it: joined by ':'."""
    return [p for p in value.split(os.pathsep) if p] if isinstance(value, str) else value


class TlsSettings(_Section):
    """HTTPS for a section's listener (``[hub]``, ``[spoke]``, ``[s3]``)."""

    #: "auto": HTTPS where tls_cert/tls_key are set, else, on an address beyond loopback,
    #: with a self-signed certificate made once in <data_dir>/identity/https.pem (its
    #: SHA-256 fingerprint is logged at start: clients trust that file), else plain HTTP;
    #: "on": HTTPS also on loopback; "off": plain HTTP (behind a TLS proxy: a WARNING at
    #: start beyond loopback)
    tls: Literal["auto", "on", "off"] = "auto"
    #: PEM files of the listener's certificate (its chain) and private key
    tls_cert: Path | None = None
    tls_key: Path | None = None

    @model_validator(mode="after")
    def _pair(self) -> Self:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key go together")
        if self.tls_cert is not None and self.tls == "off":
            raise ValueError('tls = "off" serves no certificate: remove tls_cert and tls_key')
        return self


class SiteSection(_Section):
    name: str = "hub"
    data_dir: Path = Path.home() / ".local" / "share" / "loomfs"
    #: below this much free space in the data directory (a spoke's cache directory too),
    #: /readyz answers 503
    min_free: str = "256M"


class CatalogSection(_Section):
    #: default: a SQLite file in the site's data directory
    url: str | None = None


class HubSection(TlsSettings):
    listen: str = "127.0.0.1:7070"
    #: seconds between rescans of every volume (S3 changes are found this way); 0 = never
    rescan_interval: float = 600.0
    #: seconds between looks for changes left half done by a gateway that died, when
    #: several share the catalog's database (PostgreSQL); 0 = only at start
    repair_interval: float = 2.0
    #: seconds between runs of the lifecycle rules (S3 lifecycle expiration); 0 = never
    lifecycle_interval: float = 3600.0
    #: seconds a lifecycle rule's "day" lasts (shortened only to test expiration)
    lifecycle_day: float = 86400.0
    #: ids of the keys SSE-KMS may name (the first: where a write names none), kept as
    #: files under <data_dir>/sse/kms, made on first use: a local stand-in for a KMS
    kms_keys: list[str] = []
    #: follow posix volumes with inotify
    watch: bool = True
    #: seconds a spoke's read lease lasts; commits wait at most this long for a silent spoke
    lease_ttl: float = 15.0
    #: REST callers without credentials act as user "anonymous" (only open paths allow
    #: them anything); false: every REST request needs HTTP Basic credentials
    anonymous: bool = True
    #: bytes of the versions spokes hold that the hub keeps (zstd frames, LRU) in
    #: <data_dir>/delta-store.db, to send files changed in place as deltas; 0 = none
    delta_store_size: str = "2G"
    #: directories posix volumes may be assimilated from: a volume at or under one of
    #: them (after '..' and symlinks are resolved); none (the default): no posix volume
    #: can be added. In the environment, joined by ':' (LOOMFS_HUB__VOLUME_ROOTS=/a:/b)
    volume_roots: list[Path] = []
    #: where S3 multipart parts and uploaded chunks wait for their commit; several
    #: gateways over one catalog give it one directory on storage they all reach, so an
    #: upload may go on through any of them. None: <data_dir>, this gateway's alone
    staging_dir: Path | None = None

    _roots = field_validator("volume_roots", mode="before")(_joined)

    @field_validator("volume_roots")
    @classmethod
    def _absolute(cls, roots: list[Path]) -> list[Path]:
        for root in roots:
            if not root.is_absolute():
                raise ValueError(f"a volume root is an absolute directory, not {str(root)!r}")
        return roots


class S3Section(TlsSettings):
    #: HOST:PORT of the S3 gateway; unset = no gateway
    listen: str | None = None
    #: the region clients sign for (SigV4 credential scope)
    region: str = "us-east-1"
    #: bucket name -> namespace directory
    buckets: dict[str, str] = {}
    #: a namespace directory whose subdirectories are buckets too (CreateBucket makes them)
    bucket_root: str | None = None
    #: unsigned requests run as user "anonymous" (allowed what the access rules give
    #: everyone: S3 ACLs public-read, public-read-write); false: every request is signed
    anonymous: bool = False
    max_object_size: int = 5 << 30
    max_part_size: int = 5 << 30
    #: the largest object a multipart upload may complete (S3's: 5 TiB)
    max_upload_size: int = 5 << 40


class SftpSection(_Section):
    #: HOST:PORT of the SFTP server; unset = no SFTP
    listen: str | None = None
    #: the server's private host key; default: generated on first start in
    #: <data_dir>/identity/ssh_host_ed25519_key
    host_key: Path | None = None
    #: the namespace directory each user sees as '/' (users cannot leave it); '{user}'
    #: is replaced by the user's name, for per-user homes such as /home/{user}
    root: str = "/"
    #: permission bits taken away from what clients create (the modes they send, or
    #: 0777 for a directory and 0666 for a file when they send none), as a local umask
    #: does; octal: 0o022 in TOML, "022" in TOML or the environment. chmod is not masked
    umask: int = 0o022

    @field_validator("umask", mode="before")
    @classmethod
    def _octal(cls, value: object) -> object:
        return int(value, 8) if isinstance(value, str) else value

    @field_validator("umask")
    @classmethod
    def _bits(cls, umask: int) -> int:
        if not 0 <= umask <= 0o777:
            raise ValueError(f"a umask is permission bits, 0 to 0o777, not {umask:#o}")
        return umask


class SmbShare(_Section):
    #: the namespace directory the share is
    path: str
    #: "ro": the share refuses changes whatever the user's rights; "rw": her rights decide
    access: Literal["rw", "ro"] = "rw"


class SmbSection(_Section):
    #: HOST:PORT Samba's smbd listens on (run by loomfs as a child); unset = no SMB
    listen: str | None = None
    #: share name -> namespace directory; none: one share "loomfs" of the whole namespace
    shares: dict[str, SmbShare] = {}
    #: SMB extended attributes are the entries' tags; false: none over SMB. With them,
    #: Samba asks every entry of a listing for its EAs (one namespace call each): 100k
    #: entries list in ~80 s with, ~13 s without (docs/SMB.md)
    extended_attributes: bool = True
    #: the smbd binary (Debian's samba package)
    smbd: str = "smbd"


class ClientSection(_Section):
    hub: str = "http://127.0.0.1:7070"
    #: credentials the CLI sends (HTTP Basic); env LOOMFS_ACCESS_KEY / LOOMFS_SECRET_KEY
    #: win. Unset: the CLI is the anonymous caller, except that administration commands
    #: sent to the hub of this data directory use its local administrator's key
    #: (<data_dir>/admin.key, see ``core.admin``).
    access_key: str | None = None
    secret_key: SecretStr | None = None
    #: the certificate (PEM) that a hub's or spoke's HTTPS certificate is checked against:
    #: its self-signed https.pem, or the CA that signed its files; env LOOMFS_CA_CERT wins.
    #: Unset: the system's CAs
    ca_cert: Path | None = None

    def credentials(
        self,
        env: Mapping[str, str] | None = None,
        *,
        key: str | None = None,
        secret: str | None = None,
    ) -> tuple[str, str] | None:
        """(access key id, secret) a client authenticates with: ``key`` and ``secret``
        where given (the SDK's storage options), else the environment's, else this
        section's; None: anonymous."""
        env = os.environ if env is None else env
        if key is None and secret is None:
            key = env.get("LOOMFS_ACCESS_KEY") or self.access_key
            secret = env.get("LOOMFS_SECRET_KEY") or (
                self.secret_key.get_secret_value() if self.secret_key else None
            )
        if not key and not secret:
            return None
        if not key or not secret:
            raise ConfigError(
                "credentials need both an access key id and its secret ([client] access_key "
                "and secret_key, LOOMFS_ACCESS_KEY and LOOMFS_SECRET_KEY, or the SDK's key "
                "and secret)"
            )
        return key, secret

    def trusted_cert(self, env: Mapping[str, str] | None = None) -> Path | None:
        """The certificate a client checks HTTPS sites against; None: the system's CAs."""
        env = os.environ if env is None else env
        found = env.get("LOOMFS_CA_CERT")
        return Path(found) if found else self.ca_cert

    #: site name -> REST URL, for ``loomfs://SITE/path`` URLs (the Python SDK)
    sites: dict[str, str] = {}


class LogSection(_Section):
    level: str = "INFO"
    #: "json" (one structured line per event) or "text" (for humans: the message, then
    #: the event's fields as key=value)
    format: str = "json"


class FabricSection(_Section):
    #: HOST:PORT where spokes reach this hub over mutual TLS; unset = no spokes
    listen: str | None = None


class SpokeSection(TlsSettings):
    #: the hub's fabric URL (https://host:port) and its pinned certificate; a hub of
    #: several gateways: their URLs, comma-separated (one identity, so one certificate)
    hub: str | None = None
    hub_cert: Path | None = None
    #: namespace paths of the hub that this spoke serves; in the environment, joined by
    #: ':' or as JSON (LOOMFS_SPOKE__ATTACH=/a:/b)
    attach: list[str] = []
    cache_dir: Path | None = None  # default: <data_dir>/cache
    cache_size: str = "10G"
    #: return from writes once the journal is durable, upload in the background
    write_back: bool = False
    #: where this spoke serves the REST API (the same API as a hub's)
    listen: str = "127.0.0.1:7071"
    #: 32-byte key sealing the cache at rest (AES-GCM); created on first start if missing
    cache_key_file: Path | None = None
    #: as [hub] anonymous, for this spoke's REST API (credentials are checked by the hub)
    anonymous: bool = True
    #: follow the plans data loaders publish (prefetch, evict by next use); off = LRU only
    prefetch: bool = True
    #: a loader on this machine (``loomfs.torch.FileDataset``) reads cached files from the
    #: cache files, on descriptors this spoke hands over a local socket after deciding
    #: each open as a REST read; false: every read goes over HTTP
    local_reads: bool = True

    _attached = field_validator("attach", mode="before")(_joined)


class AuditSection(_Section):
    #: record every access and policy decision in a hash-chained log
    enabled: bool = True
    dir: Path | None = None  # default: <data_dir>/audit
    #: a segment is closed and a new one started past this size
    segment_size: str = "16M"
    #: a secret (at least 16 bytes) that keys the chain, so that only its holder can
    #: recompute it; keep it away from whoever can write the log
    key_file: Path | None = None


class FuseSection(_Section):
    #: false: as on a local file system, a change through a mount that runs its site's hub
    #: (``loomfs mount`` without --hub) survives a crash of the mount once the call
    #: returned, and power loss once fsync(2) or sync(1) returned; true: every change is
    #: flushed to disk before the call returns (several times slower to create files)
    durable_each_change: bool = False
    #: true: a file opened for reading whose bytes sit whole in a local file (a posix
    #: volume, a spoke's cache) is read by the kernel straight from that file, at the
    #: local disk's speed (FUSE passthrough: Linux 6.9+, root). While such reads are open,
    #: a change made in place behind loomfs's back shows to them at once, as on the
    #: volume itself; false: every read goes through loomfs, which fails such a read
    #: (ESTALE)
    passthrough: bool = True
    #: microseconds the mount's loop polls for the next request before it sleeps: a
    #: program that sends it right after a reply (a loop of creates) finds the loop awake
    #: (1.4x the creates per second here), at the price of up to this much CPU each time
    #: the mount runs out of work; 0: sleep at once
    poll_us: int = Field(default=100, ge=0, le=10_000)


class NfsExport(_Section):
    #: addresses or networks that may mount the export and use its handles; others get
    #: MNT3ERR_ACCES / NFS3ERR_ACCES
    clients: list[str] = ["127.0.0.0/8", "::1/128"]
    access: Literal["rw", "ro"] = "rw"
    #: "root": uid 0 is the anonymous user; "all": everyone is; "none": root is root
    squash: Literal["root", "all", "none"] = "root"
    #: AUTH_NONE calls are served (as the anonymous user); false: AUTH_SYS only
    anonymous: bool = False

    @field_validator("clients")
    @classmethod
    def _networks(cls, clients: list[str]) -> list[str]:
        for client in clients:
            try:
                ipaddress.ip_network(client, strict=False)
            except ValueError:
                raise ValueError(f"not an address or network: {client!r}") from None
        return clients


class NfsSection(_Section):
    #: HOST:PORT of the NFSv3 and MOUNT server (one port, no portmapper); unset = no NFS
    listen: str | None = None
    #: namespace directory -> who may mount it and how; none: "/" to loopback only
    exports: dict[str, NfsExport] = {}
    #: AUTH_SYS uid -> loomfs user; an unmapped uid is the anonymous user
    uid_map: dict[int, str] = {}
    #: seconds after its last write that an uncommitted (UNSTABLE) write is committed
    commit_delay: float = Field(default=2.0, gt=0)
    #: HOST:PORT of a portmapper to register NFS and MOUNT with ("127.0.0.1:111" for the
    #: local rpcbind), for clients that are not given the port; unset: none
    rpcbind: str | None = None


class Config(_Section):
    site: SiteSection = SiteSection()
    catalog: CatalogSection = CatalogSection()
    hub: HubSection = HubSection()
    s3: S3Section = S3Section()
    fabric: FabricSection = FabricSection()
    spoke: SpokeSection = SpokeSection()
    client: ClientSection = ClientSection()
    sftp: SftpSection = SftpSection()
    nfs: NfsSection = NfsSection()
    smb: SmbSection = SmbSection()
    log: LogSection = LogSection()
    audit: AuditSection = AuditSection()
    fuse: FuseSection = FuseSection()

    @property
    def identity_dir(self) -> Path:
        return self.site.data_dir / "identity"

    @property
    def catalog_url(self) -> str:
        return self.catalog.url or f"sqlite://{self.site.data_dir.resolve() / 'catalog.db'}"

    @property
    def audit_dir(self) -> Path:
        return self.audit.dir or self.site.data_dir / "audit"

    @property
    def listen_host_port(self) -> tuple[str, int]:
        return host_port(self.hub.listen, "hub.listen")


def host_port(listen: str, key: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    try:
        return host or "127.0.0.1", int(port)
    except ValueError:
        raise ConfigError(f"{key} must be HOST:PORT, not {listen!r}") from None


def _apply_env(data: dict[str, Any], env: Mapping[str, str]) -> None:
    for name, value in env.items():
        if not name.startswith(ENV_PREFIX) or "__" not in name or name == "LOOMFS_CONFIG":
            continue
        section, _, key = name[len(ENV_PREFIX) :].lower().partition("__")
        data.setdefault(section, {})[key] = _env_value(name, section, key, value)


def _env_value(name: str, section: str, key: str, value: str) -> object:
    """A list or table key's value from the environment: JSON (LOOMFS_S3__BUCKETS=
    '{"data": "/data"}'); a list that isn't JSON is left to its key's validator (paths
    joined by ':')."""
    field = Config.model_fields.get(section)
    model = field.annotation if field is not None else None
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        return value  # an unknown section or key: validation names it
    if key not in model.model_fields:
        return value
    kind = get_origin(model.model_fields[key].annotation)
    if kind is dict or (kind is list and value.lstrip().startswith("[")):
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            shape = '{"name": "value"}' if kind is dict else '["a", "b"]'
            raise ConfigError(f"{name} is not JSON ({exc}); say {shape}") from None
    return value


def load_config(path: Path | None = None, env: Mapping[str, str] | None = None) -> Config:
    env = os.environ if env is None else env
    if path is None and env.get("LOOMFS_CONFIG"):
        path = Path(env["LOOMFS_CONFIG"])
    if path is None and Path("loomfs.toml").is_file():
        path = Path("loomfs.toml")
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = tomllib.loads(path.read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {path}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    _apply_env(data, env)
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
        )
        raise ConfigError(f"invalid configuration ({path or 'defaults'}): {problems}") from None


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """'200G', '512M', '1.5T' or a plain byte count."""
    value = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = value[-1:] if value[-1:] in _UNITS else ""
    try:
        number = float(value[: len(value) - len(unit)])
    except ValueError:
        raise ConfigError(f"not a size: {text!r} (say 200G, 512M or a byte count)") from None
    if number < 0:
        raise ConfigError(f"a size can't be negative: {text!r}")
    return int(number * _UNITS[unit])
