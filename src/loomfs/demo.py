"""``make demo``: one namespace over a local directory and an S3 bucket, extended to a
GPU site over an emulated WAN, end to end.

Starts a real SeaweedFS S3 server and a loomfs hub on the embedded default (SQLite,
local directories), assimilates a generated dataset directory and a bucket, lists and
reads through the CLI and the REST API, writes through loomfs, changes files behind its
back and shows that the hub noticed. Then a spoke attaches the dataset through a shaped
link: cold and warm reads, a write at the spoke, a change at the hub, the link cut. It
stops everything it started.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shlex
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

from rich.console import Console

from .testing.fuse import MountProcess
from .testing.hubproc import HubProcess, SpokeProcess, spoke_args
from .testing.loop import LoopThread
from .testing.seaweedfs import SeaweedFS
from .testing.sftp import make_key, sftp_batch
from .testing.wan import LinkEmulator

console = Console(highlight=False, soft_wrap=True)
WORK = Path(".demo").resolve()


def step(title: str) -> None:
    console.rule(f"[bold cyan]{title}")


def sh(*args: str, env: dict[str, str], stdin: bytes | None = None) -> str:
    console.print(f"[bold green]$[/] loomfs {shlex.join(args)}")
    result = subprocess.run(
        [sys.executable, "-m", "loomfs.cli", *args],
        env=env, input=stdin, capture_output=True, check=False,
    )  # fmt: skip
    out, err = result.stdout.decode(errors="replace"), result.stderr.decode(errors="replace")
    if out:
        console.print(out.rstrip(), markup=False)
    if result.returncode != 0:
        console.print(err.rstrip(), markup=False)
        raise SystemExit(f"demo step failed: loomfs {shlex.join(args)}")
    return out


def make_sample(root: Path) -> None:
    rng = random.Random(7)
    for split, shards in (("train", 8), ("val", 2)):
        (root / split).mkdir(parents=True)
        for i in range(shards):
            rows = [
                json.dumps(
                    {"id": f"{split}-{i}-{j}", "text": f"sample {j}", "label": rng.randint(0, 9)}
                )
                for j in range(200)
            ]
            (root / split / f"shard-{i:04d}.jsonl").write_text("\n".join(rows) + "\n")
    (root / "README.txt").write_text(
        "A generated sample dataset, assimilated in place by loomfs.\n"
    )


def wait_for(predicate: object, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.2)
    return False


def main() -> None:
    shutil.rmtree(WORK, ignore_errors=True)
    sample = WORK / "data" / "sample"
    make_sample(sample)
    step("Starting a SeaweedFS S3 server (the existing bucket to assimilate)")
    with SeaweedFS() as s3:
        bucket = "s3sample"
        s3.create_bucket(bucket)
        client = s3.client()
        for i in range(20):
            client.put_object(Bucket=bucket, Key=f"images/{i:03d}.jpg", Body=os.urandom(2048))
        client.put_object(Bucket=bucket, Key="labels.csv", Body=b"image,label\n000.jpg,3\n")
        console.print(f"SeaweedFS S3 at {s3.endpoint}, bucket {bucket!r} with 21 objects")
        env = {
            **os.environ,
            "AWS_ACCESS_KEY_ID": s3.access_key,
            "AWS_SECRET_ACCESS_KEY": s3.secret_key,
            "AWS_DEFAULT_REGION": "us-east-1",
            "LOOMFS_SITE__DATA_DIR": str(WORK / "hub"),
            # the directories the hub may assimilate: the demo's own data, nothing else
            "LOOMFS_HUB__VOLUME_ROOTS": str(WORK / "data"),
        }
        step("Two sites: a hub and a GPU site, each with its key; the hub pins the spoke")
        spoke_env = {**os.environ, "LOOMFS_SITE__DATA_DIR": str(WORK / "spoke")}
        sh("site", "init", "--name", "hub-eu", "--label", "region=eu-west", env=env)
        sh("site", "init", "--name", "gpu-west", "--label", "region=us-west", env=spoke_env)
        pem = str(WORK / "spoke/identity/site.pem")
        sh("site", "add", "gpu-west", "--cert", pem, "--offline", env=env)  # hub not up yet
        step("Starting the hub (SQLite catalog, embedded default; fabric link on mutual TLS)")
        listeners = {
            "LOOMFS_FABRIC__LISTEN": "127.0.0.1:0",
            "LOOMFS_HUB__LEASE_TTL": "5",
            "LOOMFS_S3__LISTEN": "127.0.0.1:0",
            "LOOMFS_S3__BUCKET_ROOT": "/datasets",  # each dataset directory is a bucket
            "LOOMFS_SFTP__LISTEN": "127.0.0.1:0",
        }
        with HubProcess(WORK / "hub", {**env, **listeners}) as hub:
            env["LOOMFS_HUB"] = hub.url
            console.print(f"hub at {hub.url}, fabric at {hub.urls['fabric']}")
            console.print(f"structured log in {hub.log_path}")
            console.print(
                f"local administrator's key in {WORK / 'hub/admin.key'} (mode 0600): this "
                "machine's CLI administers the hub with it"
            )
            run_demo(env, hub.url, sample, s3, bucket)
            run_protocols_demo(env, hub)
            run_spoke_demo(env, spoke_env, hub, sample)
            step("Stopping everything the demo started")
    console.print("[bold]done.[/] (SeaweedFS, the hub and the spoke are stopped; files in .demo/)")


def timed(title: str, *args: str, env: dict[str, str], link: LinkEmulator) -> None:
    before = link.down.bytes
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "loomfs.cli", *args], env=env, capture_output=True, check=False
    )
    elapsed = time.perf_counter() - start
    status = "ok" if result.returncode == 0 else result.stderr.decode().strip()
    console.print(
        f"[bold green]$[/] loomfs {shlex.join(args)}   [dim]# {title}[/]\n"
        f"  {len(result.stdout):,} bytes out in {elapsed:.2f}s; "
        f"{link.down.bytes - before:,} bytes crossed the WAN; {status}",
        markup=True,
    )


def run_protocols_demo(env: dict[str, str], hub: HubProcess) -> None:
    step("Every tool, the same file: in with `aws s3 cp`, out with `cat` on a FUSE mount and sftp")
    key = WORK / "alice_ed25519"
    make_key(key, "alice@demo")
    added = sh("user", "add", "alice", "--ssh-key", f"{key}.pub", env=env)
    secrets = dict(line.split(":", 1) for line in added.splitlines() if ":" in line)
    aws_env = {
        **env,
        "AWS_ACCESS_KEY_ID": secrets["access key id"].strip(),
        "AWS_SECRET_ACCESS_KEY": secrets["secret access key"].strip(),
    }
    upload = WORK / "from-aws.txt"
    upload.write_text("uploaded with the aws CLI\n")
    aws = str(Path(sys.executable).with_name("aws"))
    command = [
        aws,
        "--endpoint-url",
        hub.urls["s3"],
        "s3",
        "cp",
        "--no-progress",
        str(upload),
        "s3://sample/",
    ]
    console.print(f"[bold green]$[/] {shlex.join(command)}")
    subprocess.run(command, env=aws_env, check=True)

    mount_config = WORK / "mount.toml"
    mount_config.write_text(f"[site]\ndata_dir = {json.dumps(str(WORK / 'mount'))}\n")
    mountpoint = WORK / "mnt"
    with MountProcess(mount_config, mountpoint, "--hub", hub.url):
        on_mount = mountpoint / "datasets/sample/from-aws.txt"
        console.print(f"[bold green]$[/] cat {on_mount}")
        console.print(on_mount.read_text(), end="", markup=False)

    port = int(urlsplit(hub.urls["sftp"]).port or 0)
    got = sftp_batch(port, "alice", key, "get /datasets/sample/from-aws.txt via-sftp.txt", cwd=WORK)
    if got.returncode != 0:
        raise SystemExit(f"sftp get failed: {got.stderr}")
    console.print("[bold green]$[/] sftp alice@hub: get /datasets/sample/from-aws.txt")
    console.print((WORK / "via-sftp.txt").read_text(), end="", markup=False)


def run_spoke_demo(
    env: dict[str, str], spoke_env: dict[str, str], hub: HubProcess, sample: Path
) -> None:
    big = sample / "train" / "images.bin"
    big.write_bytes(os.urandom(30_000_000))
    sh("volume", "rescan", "/datasets/sample", env=env)
    fabric = urlsplit(hub.urls["fabric"])
    with LoopThread() as loop:
        link = loop.run(
            LinkEmulator(fabric.hostname or "", fabric.port or 0, rate=25e6, latency=0.02).start()
        )
        step("A spoke at the GPU site, over an emulated WAN (25 MB/s, 40 ms round trip)")
        args = spoke_args(WORK / "hub", f"https://127.0.0.1:{link.port}", "/datasets/sample")
        spoke = SpokeProcess(WORK / "spoke", spoke_env, args).start()
        at = {**spoke_env, "LOOMFS_HUB": spoke.url}
        try:
            console.print(f"spoke REST API at {spoke.url}, cache in {WORK / 'spoke/cache'}")
            sh("ls", "-l", "/datasets/sample/train", env=at)
            step("Cold read fetches only what is read; a warm read crosses nothing")
            shard = "/datasets/sample/train/images.bin"
            timed("1 MB of a 30 MB file", "cat", shard, "--offset", "10000000",
                  "--length", "1000000", env=at, link=link)  # fmt: skip
            timed("cold: the rest of it", "cat", shard, env=at, link=link)
            timed("warm", "cat", shard, env=at, link=link)
            sh("warm", "/datasets/sample/val", env=at)
            step("A write at the spoke appears at the hub (journal first, then committed)")
            sh("put", "-", "/datasets/sample/from-gpu.txt", env=at, stdin=b"written at gpu-west\n")
            console.print(f"at the hub, on disk: {(sample / 'from-gpu.txt').read_text().strip()!r}")
            step("A change at the hub is seen at the spoke's next open (leases, change feed)")
            sh("put", "-", "/datasets/sample/README.txt", env=env, stdin=b"edited at the hub\n")
            sh("cat", "/datasets/sample/README.txt", env=at)
            step("The link is cut: cached files are still served, writes are journaled")
            loop.run(asyncio.to_thread(link.cut))
            timed("cached file, link down", "cat", shard, env=at, link=link)
            timed("never read here, link down", "cat", "/datasets/sample/train/shard-0001.jsonl",
                  env=at, link=link)  # fmt: skip
            sh("put", "-", "/datasets/sample/offline.txt", env=at, stdin=b"written offline\n")
            link.restore()
            sh("sync", env=at)
            console.print(f"at the hub after reconnect: {(sample / 'offline.txt').read_text()!r}")
        finally:
            spoke.stop()
            loop.run(link.stop())


def run_demo(env: dict[str, str], url: str, sample: Path, s3: SeaweedFS, bucket: str) -> None:
    step("Assimilate two volumes into one tree (metadata only: no data is read or copied)")
    sh("volume", "add", "/datasets/sample", f"posix://{sample}", env=env)
    sh("volume", "add", "/datasets/s3sample", f"s3://{bucket}?endpoint={s3.endpoint}", env=env)
    sh("volume", "list", env=env)
    step("The unified tree")
    sh("ls", "/datasets", env=env)
    sh("ls", "-l", "/datasets/sample/train", env=env)
    sh("ls", "/datasets/s3sample", env=env)
    sh("cat", "/datasets/sample/README.txt", env=env)
    sh("cat", "/datasets/s3sample/labels.csv", env=env)
    step("The same through the REST API (OpenAPI at /openapi.json)")
    with urllib.request.urlopen(f"{url}/v1/stat/datasets/s3sample/labels.csv") as resp:
        console.print(
            f"GET /v1/stat/datasets/s3sample/labels.csv -> {resp.read().decode()}", markup=False
        )
    request = urllib.request.Request(
        f"{url}/v1/files/datasets/sample/README.txt", headers={"Range": "bytes=0-8"}
    )
    with urllib.request.urlopen(request) as resp:
        console.print(
            f"GET /v1/files/... Range: bytes=0-8 -> {resp.status} {resp.read()!r}", markup=False
        )
    step("Write through loomfs: the data lands in the original storage, in its original form")
    notes = WORK / "notes.txt"
    notes.write_text("written through loomfs\n")
    sh("put", str(notes), "/datasets/sample/notes.txt", env=env)
    console.print(
        f"on disk: {(sample / 'notes.txt').read_text().strip()!r}  ({sample / 'notes.txt'})"
    )
    sh("put", str(notes), "/datasets/s3sample/notes.txt", env=env)
    body = s3.client().get_object(Bucket=bucket, Key="notes.txt")["Body"].read()
    console.print(f"in the bucket (plain boto3): {body.decode().strip()!r}")
    sh("tag", "/datasets/sample/train", "split=train", "owner=ml-team", env=env)
    step("Change a file behind loomfs's back in the directory: inotify notices")
    shard = "/datasets/sample/train/shard-0000.jsonl"
    before = json.loads(sh("stat", shard, env=env))["version"]
    with (sample / "train" / "shard-0000.jsonl").open("a") as f:
        f.write('{"id": "late", "text": "appended by another tool", "label": 1}\n')

    def noticed() -> bool:
        with urllib.request.urlopen(f"{url}/v1/stat{shard}") as resp:
            return bool(json.loads(resp.read())["version"] != before)

    if not wait_for(noticed, 10):
        raise SystemExit("the hub did not notice the change")
    after = json.loads(sh("stat", shard, env=env))["version"]
    console.print(f"[bold]version {before} -> {after}[/]")
    step("Change an object behind loomfs's back in the bucket: a rescan notices")
    labels = "/datasets/s3sample/labels.csv"
    before = json.loads(sh("stat", labels, env=env))["version"]
    s3.client().put_object(
        Bucket=bucket, Key="labels.csv", Body=b"image,label\n000.jpg,4\n001.jpg,2\n"
    )
    s3.client().delete_object(Bucket=bucket, Key="images/019.jpg")
    sh("volume", "rescan", "/datasets/s3sample", env=env)
    after = json.loads(sh("stat", labels, env=env))["version"]
    console.print(f"[bold]version {before} -> {after}[/]")
    sh("cat", labels, env=env)
    sh("changes", "--limit", "8", env=env)


if __name__ == "__main__":
    main()
