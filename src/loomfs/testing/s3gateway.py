"""A hub process serving its S3 gateway over a posix volume, for conformance runs and
benchmarks (testing layer).

The hub's catalog gets the users and access keys first, then ``loomfs hub serve`` starts
with ``[s3]`` on a free port and buckets made by CreateBucket below ``/s3`` (a posix
volume in ``scratch/volume``). Stopped by its own pid, like every LoomfsProcess.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from ..core.registry import open_catalog
from ..core.users import UserRegistry
from .hubproc import HubProcess

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

BUCKET_ROOT = "/s3"


def gateway_client(endpoint: str, access_key: str, secret: str) -> S3Client:
    """boto3 against a loomfs S3 gateway: path-style addressing (buckets are namespace
    directories, not host names) and no retries, so a refusal is seen as it is."""
    import boto3  # noqa: PLC0415 - the tests' and benches' dependency, not the package's
    from botocore.config import Config  # noqa: PLC0415

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=access_key,
        aws_secret_access_key=secret,
        config=Config(retries={"max_attempts": 1}, s3={"addressing_style": "path"}),
    )


async def register_users(catalog_url: str, users: Iterable[tuple[str, str, str]]) -> None:
    """(user id, access key, secret) into the catalog's user registry."""
    catalog = open_catalog(catalog_url)
    await catalog.open()
    try:
        registry = UserRegistry(catalog)
        for user_id, key, secret in users:
            await registry.add_user(user_id)
            await registry.add_access_key(user_id, (key, secret))
    finally:
        await catalog.close()


@contextmanager
def s3_gateway_hub(
    scratch: Path,
    users: Iterable[tuple[str, str, str]],
    extra_config: str = "",
    s3_config: str = "",
) -> Iterator[HubProcess]:
    """The running hub: ``hub.urls["s3"]`` is the gateway's URL, ``hub.pid`` its process.

    ``extra_config`` is appended to the hub's TOML config (a ``[hub]`` or ``[log]``
    section, say), ``s3_config`` to its ``[s3]`` section (``anonymous = true``, say).
    """
    data = scratch / "hub"
    volume = scratch / "volume"
    volume.mkdir(parents=True)
    data.mkdir()
    config = scratch / "loomfs.toml"
    config.write_text(
        f'[s3]\nlisten = "127.0.0.1:0"\nbucket_root = "{BUCKET_ROOT}"\n{s3_config}{extra_config}'
    )
    asyncio.run(register_users(f"sqlite://{data / 'catalog.db'}", users))
    with HubProcess(data, {"LOOMFS_CONFIG": str(config)}) as hub:
        subprocess.run(
            [sys.executable, "-m", "loomfs.cli", "--hub", hub.url, "volume", "add",
             BUCKET_ROOT, f"posix://{volume}"],
            check=True, capture_output=True,
            env={**os.environ, "LOOMFS_SITE__DATA_DIR": str(data)},  # the hub's own CLI
        )  # fmt: skip
        yield hub
