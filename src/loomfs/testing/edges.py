"""A hub process serving its S3 and SFTP edges to one user, for fault tests that write
through either (testing layer)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

import asyncssh

from ..core.registry import open_catalog
from ..core.types import Principal
from ..core.users import UserRegistry
from ..rest.client import RestNamespace
from .hubproc import HubProcess
from .s3gateway import gateway_client, register_users
from .sftp import make_key

if TYPE_CHECKING:
    from mypy_boto3_s3.type_defs import CompletedPartTypeDef

#: (user, access key, secret) of the one user; the same user logs in over SFTP by key
USER = ("fay", "FAYACCESSKEY00000000", "fay-secret-" + "s" * 29)
PART = 5 << 20  # the least a multipart upload's first part may be
BUCKET = "bkt"
ANONYMOUS = Principal(user="anonymous")
OPS = ("s3-put", "s3-multipart", "sftp")
#: every edge ``Edge.write`` writes through: REST too
ALL_OPS = (*OPS, "rest")


class Edge:
    """The S3 and SFTP edges of a hub process, as ``USER`` (an access key, an SSH key),
    and its REST API (as the anonymous caller, whom a fresh hub lets write)."""

    def __init__(self, hub: HubProcess, ssh_key: Path) -> None:
        self.hub, self.ssh_key = hub, ssh_key

    async def write(
        self, op: str, key: str, body: bytes, meta: dict[str, str] | None = None
    ) -> None:
        """``body`` at ``key`` in bucket ``BUCKET``, by ``op``: an S3 PUT, a two-part S3
        upload (its first part ``PART`` bytes), an SFTP put, a REST PUT. An S3 write
        sends ``meta`` as its user metadata (x-amz-meta-*)."""
        if op == "rest":
            client = RestNamespace(self.hub.url)
            try:
                await client.write_bytes(ANONYMOUS, f"/s3/{BUCKET}/{key}", body)
            finally:
                await client.close()
            return
        if op == "sftp":
            port = int(self.hub.urls["sftp"].rpartition(":")[2])
            async with (
                asyncssh.connect(
                    "127.0.0.1",
                    port,
                    username=USER[0],
                    client_keys=[str(self.ssh_key)],
                    known_hosts=None,
                    agent_path=None,
                ) as ssh,  # fmt: skip
                ssh.start_sftp_client() as sftp,
                sftp.open(f"/s3/{BUCKET}/{key}", "wb") as file,
            ):
                await file.write(body)
            return
        s3 = gateway_client(self.hub.urls["s3"], *USER[1:])
        if op == "s3-put":
            await asyncio.to_thread(
                s3.put_object, Bucket=BUCKET, Key=key, Body=body, Metadata=meta or {}
            )
            return
        made = await asyncio.to_thread(
            s3.create_multipart_upload, Bucket=BUCKET, Key=key, Metadata=meta or {}
        )
        upload = made["UploadId"]
        parts: list[CompletedPartTypeDef] = []
        for number, part in enumerate((body[:PART], body[PART:]), 1):
            done = await asyncio.to_thread(
                s3.upload_part, Bucket=BUCKET, Key=key, UploadId=upload, PartNumber=number,
                Body=part,
            )  # fmt: skip
            parts.append({"PartNumber": number, "ETag": done["ETag"]})
        await asyncio.to_thread(
            s3.complete_multipart_upload,
            Bucket=BUCKET, Key=key, UploadId=upload, MultipartUpload={"Parts": parts},
        )  # fmt: skip


async def edge_site(
    site: Path, volume: Path, config: Path, env: dict[str, str], existing: bytes
) -> tuple[HubProcess, Edge]:
    """A hub with its data in ``site`` serving S3 and SFTP, its bucket ``BUCKET`` holding
    ``existing`` at key ``existing`` on the posix volume ``volume`` at /s3; ``config`` is
    where its config file is written."""
    (volume / BUCKET).mkdir(parents=True)
    (volume / BUCKET / "existing").write_bytes(existing)
    site.mkdir(exist_ok=True)
    ssh_key = config.with_name(USER[0])
    public = make_key(ssh_key)
    await register_users(f"sqlite://{site / 'catalog.db'}", [USER])
    catalog = open_catalog(f"sqlite://{site / 'catalog.db'}")
    await catalog.open()
    try:
        await UserRegistry(catalog).add_ssh_key(USER[0], public)
    finally:
        await catalog.close()
    config.write_text(
        '[s3]\nlisten = "127.0.0.1:0"\nbucket_root = "/s3"\n[sftp]\nlisten = "127.0.0.1:0"\n'
    )
    roots = {"LOOMFS_HUB__VOLUME_ROOTS": str(volume.parent)}
    hub = HubProcess(site, {**roots, **env, "LOOMFS_CONFIG": str(config)}).start()
    try:
        admin = RestNamespace(hub.url, credentials=hub.admin)
        try:
            await admin.add_volume("/s3", f"posix://{volume}")
        finally:
            await admin.close()
    except BaseException:
        hub.stop()
        raise
    return hub, Edge(hub, ssh_key)
