"""The Python SDK over a real hub and spoke: ``loomfs://`` through fsspec (its own operations,
pandas and pyarrow), FileDataset + PlanSampler + DataLoader with worker processes, the plan
reaching the spoke and the prefetcher fetching ahead of reads, checkpoints (also through
torch.distributed.checkpoint), and what bad input gets."""

from __future__ import annotations

import io
import os
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import torch.distributed as dist
from fsspec.tests.abstract import (
    AbstractCopyTests,
    AbstractFixtures,
    AbstractGetTests,
    AbstractOpenTests,
    AbstractPipeTests,
    AbstractPutTests,
)
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.utils.data import DataLoader, DistributedSampler, SequentialSampler

import loomfs.torch as lt
from loomfs.core.types import EntryKind
from loomfs.errors import ConfigError, InvalidArgument, InvalidPath
from loomfs.prefetch.plan import Plan
from loomfs.sdk.fsspec import FSSPEC_TYPE, LoomFileSystem
from loomfs.testing.hubproc import HubProcess
from loomfs.testing.ports import free_port
from loomfs.testing.private import PRIVATE, PrivateSite, private_site
from loomfs.testing.sites import SpokeSite, spoke_site

KiB, MiB = 1 << 10, 1 << 20
FILES = 24


def sample(i: int) -> bytes:
    return (f"sample {i:03d} ".encode() * 20000)[: 64 * KiB + i]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SpokeSite]:
    tmp = tmp_path_factory.mktemp("sdk")
    data = tmp / "data"
    (data / "train").mkdir(parents=True)
    for i in range(FILES):
        (data / "train" / f"s{i:03d}.bin").write_bytes(sample(i))
    frame = pd.DataFrame({"x": range(100), "name": [f"n{i}" for i in range(100)]})
    pq.write_table(pa.Table.from_pandas(frame), data / "table.parquet")
    frame.to_csv(data / "table.csv", index=False)
    with spoke_site(tmp, data, "/data", latency=0.002, write_back=True) as made:
        yield made


def fs() -> LoomFileSystem:
    return LoomFileSystem(sites={})


def test_the_entry_point_is_declared_and_the_scheme_resolves() -> None:
    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    target = project["project"]["entry-points"]["fsspec.specs"]["loomfs"]
    module, _, name = target.partition(":")
    assert getattr(__import__(module, fromlist=[name]), name) is LoomFileSystem
    assert fsspec.get_filesystem_class("loomfs") is LoomFileSystem


def test_sites_resolve_through_config_or_host_port(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "loomfs.toml"
    config.write_text('[client]\nsites = {gpu-west = "http://10.1.2.3:7071/"}\n')
    monkeypatch.setenv("LOOMFS_CONFIG", str(config))
    configured = LoomFileSystem(skip_instance_cache=True)
    assert configured.client("loomfs://gpu-west/data/x").base_url == "http://10.1.2.3:7071"
    assert configured.client("127.0.0.1:9/x").base_url == "http://127.0.0.1:9"
    with pytest.raises(InvalidPath, match=r"unknown loomfs site 'nowhere'.*gpu-west"):
        configured.client("loomfs://nowhere/data")


def test_fsspec_operations_at_the_spoke(site: SpokeSite) -> None:
    f, root = fs(), f"loomfs://{site.address}/data"
    names = f.ls(f"{root}/train", detail=False)
    assert len(names) == FILES and names[0] == f"{site.address}/data/train/s000.bin"
    info = f.info(f"{root}/train/s005.bin")
    assert info["type"] == "file" and info["size"] == len(sample(5)) and info["version"] > 0
    assert f.info(f"{root}/train")["type"] == "directory"
    assert f.cat_file(f"{root}/train/s005.bin", 10, 30) == sample(5)[10:30]
    assert f.cat_file(f"{root}/train/s005.bin", -7) == sample(5)[-7:]
    with f.open(f"{root}/train/s007.bin", block_size=4 * KiB) as ranged:
        ranged.seek(50 * KiB)
        assert ranged.read(100) == sample(7)[50 * KiB : 50 * KiB + 100]

    f.makedirs(f"{root}/out/a/b", exist_ok=True)
    f.makedirs(f"{root}/out/a/b", exist_ok=True)
    with pytest.raises(FileExistsError):
        f.makedirs(f"{root}/out/a/b", exist_ok=False)
    f.mkdir(f"{root}/out/c")
    big = os.urandom(3 * MiB + 17)
    with f.open(f"{root}/out/a/big.bin", "wb", block_size=MiB) as out:  # several blocks
        for start in range(0, len(big), 300 * KiB):
            out.write(big[start : start + 300 * KiB])
    assert f.cat_file(f"{root}/out/a/big.bin") == big
    f.pipe_file(f"{root}/out/c/small", b"pipe")
    assert f.exists(f"{root}/out/c/small") and not f.exists(f"{root}/out/c/none")
    f.mv(f"{root}/out/c/small", f"{root}/out/c/moved")
    assert not f.exists(f"{root}/out/c/small") and f.cat(f"{root}/out/c/moved") == b"pipe"
    # exclusive creation, at the hub (a write-back spoke acknowledges before it can know)
    at_hub = f"loomfs://{site.hub.url.removeprefix('http://')}/data/out/c/moved"
    with pytest.raises(FileExistsError), f.open(at_hub, "xb") as excl:
        excl.write(b"no")
    assert f.cat(f"{root}/out/c/moved") == b"pipe"  # the refused write changed nothing
    f.rm(f"{root}/out", recursive=True)
    assert not f.exists(f"{root}/out")
    with pytest.raises(FileNotFoundError):
        f.cat_file(f"{root}/out/a/big.bin")


def test_pandas_and_pyarrow_read_through_loomfs(site: SpokeSite) -> None:
    root = f"loomfs://{site.address}/data"
    table = pd.read_parquet(f"{root}/table.parquet")
    assert list(table["x"]) == list(range(100)) and table["name"][42] == "n42"
    csv = pd.read_csv(f"{root}/table.csv")
    assert csv.shape == (100, 2) and csv["name"][99] == "n99"
    dataset = pq.read_table(f"{site.address}/data/table.parquet", filesystem=fs())
    assert dataset.num_rows == 100
    table.to_csv(f"{root}/written.csv", index=False)  # pandas writes through loomfs too
    assert pd.read_csv(f"{root}/written.csv").equals(csv)


def test_dataloader_with_workers_reads_the_right_bytes_and_the_plan_guides_the_spoke(
    site: SpokeSite,
) -> None:
    ds = lt.FileDataset(f"loomfs://{site.address}/data/train", decode=lambda b: b)
    assert len(ds) == FILES
    sampler = lt.PlanSampler(
        DistributedSampler(ds, num_replicas=1, rank=0, seed=7), dataset=ds, job="train-a"
    )
    assert sampler.job == "train-a/0"
    loader = DataLoader(
        ds, sampler=sampler, batch_size=4, num_workers=2, collate_fn=lambda batch: batch
    )
    order = list(iter(sampler.sampler))
    seen = [item for batch in loader for item in batch]
    assert seen == [sample(i) for i in order]  # every sample, its bytes, in the plan's order
    assert sampler.position == FILES
    got = site.prefetch_report()
    assert "train-a/0" in got["job_ids"]
    assert got["policy"] == "plan" and got["demand_reads"] >= FILES
    sampler.end()
    deadline = time.monotonic() + 30
    while "train-a/0" in site.prefetch_report()["job_ids"]:
        assert time.monotonic() < deadline, "the end of the plan never reached the spoke"
        time.sleep(0.05)


def test_the_prefetcher_fetches_what_the_plan_reads_next(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    for i in range(12):
        (data / f"f{i:02d}.bin").write_bytes(os.urandom(256 * KiB))
    with spoke_site(tmp_path, data, "/ahead") as ahead:
        ds: lt.FileDataset[bytes] = lt.FileDataset(f"loomfs://{ahead.address}/ahead")
        sampler = lt.PlanSampler(SequentialSampler(ds), dataset=ds, job="ahead")
        it = iter(sampler)
        first = next(it)  # publishes the plan; nothing has been read yet
        deadline = time.monotonic() + 60
        while ahead.prefetch_report()["prefetched_files"] < len(ds):
            assert time.monotonic() < deadline, ahead.prefetch_report()
            time.sleep(0.05)
        before = ahead.link.down.bytes
        # a loader on the spoke's machine: the bytes come from the cache files
        assert ds.fs.local_reader(ds.files[0]) is not None
        for index in [first, *it]:
            assert ds[index] == (data / f"f{index:02d}.bin").read_bytes()
        # every file was cached before it was read: the reads crossed the link with no data
        assert ahead.link.down.bytes - before < 12 * 64 * KiB
        got = ahead.prefetch_report()
        assert got["hits"] == got["demand_reads"] == len(ds)
        assert got["prefetched_bytes"] == 12 * 256 * KiB and got["wasted_bytes"] == 0


def test_checkpoints_round_trip_and_are_durable_after_sync(site: SpokeSite) -> None:
    url = f"loomfs://{site.address}/data/ckpt/step-10.pt"
    weights = torch.arange(100_000, dtype=torch.float32)
    state = {"w": weights, "step": 10}
    fs().makedirs(f"{site.address}/data/ckpt", exist_ok=True)
    lt.save_checkpoint(state, url)
    lt.sync_site(url)  # write-back spoke: now committed at the hub
    back = lt.load_checkpoint(url)
    assert back["step"] == 10 and torch.equal(back["w"], weights)
    at_hub = site.hub.url.removeprefix("http://")
    raw = fs().cat_file(f"loomfs://{at_hub}/data/ckpt/step-10.pt")
    assert torch.equal(torch.load(io.BytesIO(raw))["w"], weights)


def test_distributed_checkpoint_through_fsspec(site: SpokeSite, tmp_path: Path) -> None:
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1
    )
    try:
        url = f"loomfs://{site.address}/data/dcp/run1"
        state = {"model": {"w": torch.randn(64, 32), "b": torch.zeros(32)}}
        dcp_save(state, storage_writer=FsspecWriter(url))
        into = {"model": {"w": torch.empty(64, 32), "b": torch.ones(32)}}
        dcp_load(into, storage_reader=FsspecReader(url))
        assert torch.equal(into["model"]["w"], state["model"]["w"])
        assert torch.equal(into["model"]["b"], state["model"]["b"])
    finally:
        dist.destroy_process_group()


def test_bad_plans_are_refused_and_change_nothing(site: SpokeSite) -> None:
    def publish(blob: bytes, files: list[str]) -> dict[str, object]:
        return site.call(site.spoke.url, lambda client: client.publish_plan(blob, files))

    jobs = site.prefetch_report()["job_ids"]
    with pytest.raises(InvalidArgument, match="not zlib"):
        publish(b"garbage", ["/data/train/s000.bin"])
    with pytest.raises(InvalidArgument, match="beyond its 1 files"):
        publish(Plan("bad", 0, (0, 5)).encode(), ["/data/train/s000.bin"])
    assert site.prefetch_report()["job_ids"] == jobs


def test_a_site_without_a_prefetcher_does_not_stop_training(site: SpokeSite) -> None:
    # the hub has no plan routes: publishing and heartbeats fail, and are only logged
    hub = site.hub.url.removeprefix("http://")
    ds: lt.FileDataset[bytes] = lt.FileDataset(f"loomfs://{hub}/data/train")
    sampler = lt.PlanSampler(SequentialSampler(ds), dataset=ds, job="nowhere", heartbeat_s=0)
    assert [ds[i] for i in sampler] == [sample(i) for i in range(FILES)]


@pytest.mark.slow
class TestFsspecAbstractSuite(  # fsspec's own suite is untyped
    AbstractFixtures,  # type: ignore[misc]
    AbstractCopyTests,  # type: ignore[misc]
    AbstractGetTests,  # type: ignore[misc]
    AbstractPutTests,  # type: ignore[misc]
    AbstractOpenTests,  # type: ignore[misc]
    AbstractPipeTests,  # type: ignore[misc]
):
    """fsspec's shared tests (as s3fs runs them against a real server), over the REST API."""

    @pytest.fixture
    def fs(self, site: SpokeSite) -> LoomFileSystem:
        return fs()

    @pytest.fixture
    def fs_path(self, site: SpokeSite) -> Iterator[str]:
        root = f"{site.hub.url.removeprefix('http://')}/data/abstract"
        fs().makedirs(root, exist_ok=True)
        yield root
        fs().rm(root, recursive=True)


def test_a_walk_that_cannot_reach_its_site_fails_rather_than_finding_nothing() -> None:
    """fsspec omits every OSError in a walk; a dataset over a hub that is down would then
    be "no files" (or, mid-walk, a silently short one)."""
    gone = f"127.0.0.1:{free_port()}/data"  # nothing listens there
    with pytest.raises(OSError) as refused:
        fresh().find(gone)
    assert not isinstance(refused.value, FileNotFoundError)


def test_every_kind_has_an_fsspec_type() -> None:
    assert set(FSSPEC_TYPE) == set(EntryKind)
    assert FSSPEC_TYPE[EntryKind.FIFO] == FSSPEC_TYPE[EntryKind.SOCKET] == "other"


# -- credentials: who the SDK and datasets are at the site --------------------------------

PRIVATE_FILES = {"a.txt": b"only alice", "sub/b.txt": b"alice again"}


@pytest.fixture(scope="module")
def private(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PrivateSite, str]]:
    """A hub whose /vol/private only alice may read; (the site, its loomfs:// root)."""
    made = private_site(tmp_path_factory.mktemp("private"), PRIVATE_FILES)
    with HubProcess(made.data_dir, made.env) as hub:
        yield made, f"loomfs://{hub.url.removeprefix('http://')}{PRIVATE}"


def fresh(**options: Any) -> LoomFileSystem:
    """A filesystem of these options only, not one fsspec made earlier for the same ones
    (whose credentials came from the environment of then)."""
    return LoomFileSystem(sites={}, skip_instance_cache=True, **options)


def test_key_and_secret_read_what_the_rules_give_their_user(
    private: tuple[PrivateSite, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    site, root = private
    for name in ("LOOMFS_ACCESS_KEY", "LOOMFS_SECRET_KEY", "LOOMFS_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    alice = fresh(key=site.key, secret=site.secret)
    assert alice.cat_file(f"{root}/a.txt") == PRIVATE_FILES["a.txt"]
    assert sorted(alice.find(root)) == sorted(
        f"{root.removeprefix('loomfs://')}/{n}" for n in PRIVATE_FILES
    )
    # the CLI's credentials (its environment, then [client]) when no storage option says
    for name, value in site.credentials.items():
        monkeypatch.setenv(name, value)
    assert fresh().cat_file(f"{root}/sub/b.txt") == PRIVATE_FILES["sub/b.txt"]
    for name in site.credentials:
        monkeypatch.delenv(name)
    config = site.config.parent / "client.toml"
    config.write_text(f'[client]\naccess_key = "{site.key}"\nsecret_key = "{site.secret}"\n')
    monkeypatch.setenv("LOOMFS_CONFIG", str(config))
    assert fresh().cat_file(f"{root}/a.txt") == PRIVATE_FILES["a.txt"]
    monkeypatch.delenv("LOOMFS_CONFIG")
    # the anonymous caller and a wrong secret are refused, never shown an empty directory
    for refused in (fresh(), fresh(key=site.key, secret="x" * 40)):
        with pytest.raises(PermissionError):
            refused.cat_file(f"{root}/a.txt")
        with pytest.raises(PermissionError):
            refused.ls(root)
        with pytest.raises(PermissionError):
            refused.find(root)
        with pytest.raises(PermissionError):
            refused.pipe_file(f"{root}/new.txt", b"x")
    with pytest.raises(ConfigError, match="both an access key id and its secret"):
        fresh(key=site.key)
    assert not (site.config.parent / "volume" / "private" / "new.txt").exists()


def test_a_dataset_reads_with_its_credentials_in_every_worker(
    private: tuple[PrivateSite, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    site, root = private
    for name in ("LOOMFS_ACCESS_KEY", "LOOMFS_SECRET_KEY", "LOOMFS_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    options = {"key": site.key, "secret": site.secret, "skip_instance_cache": True}
    ds: lt.FileDataset[bytes] = lt.FileDataset(root, storage_options=options)
    expected = [PRIVATE_FILES[n] for n in sorted(PRIVATE_FILES)]
    assert [ds[i] for i in range(len(ds))] == expected
    loader = DataLoader(ds, batch_size=None, num_workers=1)  # the options pickle with it
    assert list(loader) == expected
    with pytest.raises(PermissionError):  # a read grant: no writes
        lt.save_checkpoint({"w": 1}, f"{root}/ckpt.pt", storage_options=options)
    with pytest.raises(PermissionError):  # not "no files under": the listing was refused
        lt.FileDataset(root, storage_options={"skip_instance_cache": True})
