"""``make demo``: one namespace over a local directory and an S3 bucket, end to end.

Starts a real SeaweedFS S3 server and a loomfs hub on the embedded default (SQLite,
local directories), assimilates a generated dataset directory and a bucket, lists and
reads through the CLI and the REST API, writes through loomfs, changes files behind its
back, shows that the hub noticed, and stops everything it started.
"""

from __future__ import annotations

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

from rich.console import Console

from .testing.ports import stop_process
from .testing.seaweedfs import SeaweedFS

console = Console(highlight=False, soft_wrap=True)
WORK = Path(".demo").resolve()


def step(title: str) -> None:
    console.rule(f"[bold cyan]{title}")


def sh(*args: str, env: dict[str, str]) -> str:
    console.print(f"[bold green]$[/] loomfs {shlex.join(args)}")
    result = subprocess.run(
        [sys.executable, "-m", "loomfs.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.stdout:
        console.print(result.stdout.rstrip(), markup=False)
    if result.returncode != 0:
        console.print(result.stderr.rstrip(), markup=False)
        raise SystemExit(f"demo step failed: loomfs {shlex.join(args)}")
    return result.stdout


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
            "LOOMFS_SITE__DATA_DIR": str(WORK / "site"),
            "LOOMFS_LOG__FORMAT": "json",
        }
        ready = WORK / "hub.json"
        step("Starting a loomfs hub (SQLite catalog, embedded default)")
        hub_log = (WORK / "hub.log").open("wb")
        hub = subprocess.Popen(
            [sys.executable, "-m", "loomfs.cli", "hub", "serve", "--listen", "127.0.0.1:0",
             "--ready-file", str(ready)],
            env=env, stdout=hub_log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:
            if not wait_for(ready.exists, 30):
                raise SystemExit(f"hub did not start; see {WORK / 'hub.log'}")
            url = json.loads(ready.read_text())["url"]
            env["LOOMFS_HUB"] = url
            console.print(f"hub at {url}; structured log in {WORK / 'hub.log'}")
            run_demo(env, url, sample, s3, bucket)
        finally:
            step("Stopping everything the demo started")
            stop_process(hub)
            hub_log.close()
    console.print("[bold]done.[/] (SeaweedFS and the hub are stopped; files are in .demo/)")


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
