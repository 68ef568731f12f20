"""Does training wait for data? A DLIO-style loop through a spoke over a WAN (bench).

A PyTorch DataLoader (``loomfs.torch.FileDataset``, worker processes) reads every file of a
data set per epoch in a shuffled order and "computes" each batch by sleeping, as MLPerf
Storage's DLIO does. The same loop runs

- ``local``: on the files on local disk (a plain dataset over the same directory);
- ``lru``: through a spoke with the prefetcher off (``[spoke] prefetch = false``, LRU cache);
- ``adaptive``: through a spoke with the prefetcher on but no plan published (plain random
  sampler): predictions on, and a random order should turn them down;
- ``plan``: through a spoke with ``PlanSampler`` publishing each epoch's order;
- ``lru-seq`` and ``predict``: as ``lru`` and ``adaptive`` with a sequential sampler (files
  in name order, each epoch the same): the order the spoke's predictors learn without a plan.

The spoke reaches its hub through an emulated WAN, default 100 MB/s and 20 ms each way:
``--link kernel`` (the default; root) puts the hub in a network namespace of its own behind
a veth pair the kernel shapes (``KernelLink``: ``tbf`` for the rate, a splicing relay for
the delay), ``--link python`` is the ``LinkEmulator`` proxy, which copies every byte in
this process; the emulator's own CPU is printed per mode. Its cache is smaller than the
data set (eviction matters), each run starts cold, and epoch 2 is reshuffled. The stall
bound of an epoch is max(compute, bytes / bandwidth): no loader can beat it. Goal: the
plan's epochs <= 1.10x local and within 10% of the bound.

    PYTHONPATH=src python bench/train_stall.py [--quick] [--json out.json] [--modes ...]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader, Dataset, DistributedSampler

import loomfs.torch as lt
from loomfs.testing.kwan import KernelLink
from loomfs.testing.sites import spoke_site

MB = 1_000_000
MiB = 1 << 20


class LocalFiles(Dataset[bytes]):
    """The all-local baseline: the same files, read from the local disk."""

    def __init__(self, root: Path) -> None:
        self.files = sorted(p for p in root.iterdir() if p.is_file())

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> bytes:
        return self.files[index].read_bytes()


def epochs(
    ds: Dataset[bytes],
    sampler_of: Any,
    *,
    epochs: int,
    batch: int,
    workers: int,
    compute: float,
    link: tuple[Callable[[], int], float] | None = None,
) -> list[float]:
    """Seconds per epoch of the loop; each batch's samples are checked for size. ``link``:
    the bytes the link carried to the spoke so far, and its rate: printed per epoch, as
    MB and as the share of the epoch the link was busy (near 100%: the link is the
    bottleneck, and every byte beyond the data set costs time)."""
    sampler = sampler_of(ds)
    loader = DataLoader(
        ds, sampler=sampler, batch_size=batch, num_workers=workers,
        collate_fn=lambda items: items, persistent_workers=True,
    )  # fmt: skip
    times: list[float] = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        began = time.perf_counter()
        carried = link[0]() if link else 0
        waited = 0.0
        batches = iter(loader)
        while True:
            asked = time.perf_counter()
            items = next(batches, None)
            waited += time.perf_counter() - asked
            if items is None:
                break
            assert all(len(item) > 0 for item in items)
            time.sleep(compute)  # the accelerator's step
        times.append(time.perf_counter() - began)
        busy = ""
        if link:
            carried = link[0]() - carried
            busy = f", link {carried / MB:.0f} MB, busy {carried / link[1] / times[-1]:.0%}"
        print(f"    epoch {epoch + 1}: {times[-1]:.2f} s, {waited:.2f} s waiting for data{busy}")
    return times


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small data set, for CI")
    parser.add_argument("--files", type=int, help="files in the data set")
    parser.add_argument("--file-kib", type=int, help="size of each file")
    parser.add_argument("--rate", type=float, default=100, help="link MB/s")
    parser.add_argument("--latency-ms", type=float, default=20, help="one-way link latency")
    parser.add_argument(
        "--unshaped", action="store_true",
        help="no rate limit on the link (--rate still sizes compute and the bound): "
        "where loomfs's own ceiling is",
    )  # fmt: skip
    parser.add_argument("--cache", type=float, default=0.6, help="cache size / data set")
    parser.add_argument("--compute", type=float, default=1.1, help="compute / transfer time")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--modes", default="local,lru,adaptive,plan,lru-seq,predict")
    parser.add_argument("--link", choices=("kernel", "python"), default="kernel")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    files = args.files or (120 if args.quick else 300)
    size = (args.file_kib or (512 if args.quick else 1024)) * 1024
    rate = args.rate * MB
    shaped = None if args.unshaped else rate
    total = files * size
    transfer = total / rate
    batches = -(-files // args.batch)
    compute = args.compute * transfer / batches
    bound = max(compute * batches, transfer)
    cache = f"{int(total * args.cache)}"
    print(
        f"{files} files x {size // 1024} KiB = {total / MB:.0f} MB; link {args.rate:.0f} MB/s"
        f"{' (nominal: unshaped)' if args.unshaped else ''}, "
        f"{args.latency_ms:.0f} ms; cache {args.cache:.0%}; compute {compute * 1000:.1f} ms "
        f"x {batches} batches; stall bound {bound:.2f} s/epoch"
    )

    results: dict[str, Any] = {"files": files, "size": size, "bound_s": bound, "modes": {}}
    with tempfile.TemporaryDirectory(prefix="train-stall-") as tmp_name:
        tmp = Path(tmp_name)
        data = tmp / "data"
        data.mkdir()
        for i in range(files):
            (data / f"s{i:05d}.bin").write_bytes(os.urandom(size))

        def shuffled(ds: Dataset[bytes]) -> DistributedSampler[bytes]:
            return DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=7)

        def in_order(ds: Dataset[bytes]) -> DistributedSampler[bytes]:
            return DistributedSampler(ds, num_replicas=1, rank=0, shuffle=False)

        loop = {"epochs": 2, "batch": args.batch, "workers": args.workers, "compute": compute}
        for run, mode in enumerate(args.modes.split(",")):
            report: dict[str, Any] = {}
            if mode == "local":
                times = epochs(LocalFiles(data), shuffled, **loop)
            else:
                with spoke_site(
                    tmp / f"{run}-{mode}", data, "/data", rate=shaped,
                    latency=args.latency_ms / 1000, cache_size=cache,
                    prefetch=mode not in ("lru", "lru-seq"),
                    kernel=args.link == "kernel",
                ) as site:  # fmt: skip
                    ds: lt.FileDataset[bytes] = lt.FileDataset(f"loomfs://{site.address}/data")

                    def planned(ds: lt.FileDataset[bytes]) -> lt.PlanSampler:
                        return lt.PlanSampler(shuffled(ds), dataset=ds, job="bench")

                    sampler = {"plan": planned, "lru-seq": in_order, "predict": in_order}
                    carried = (lambda: site.link.down.bytes, rate)
                    times = epochs(ds, sampler.get(mode, shuffled), **loop, link=carried)
                    if mode not in ("lru", "lru-seq"):
                        report = site.prefetch_report()
                    if isinstance(site.link, KernelLink):
                        emulator = site.link.cpu_seconds()
                        print(f"    link emulator CPU {emulator:.2f} s "
                              f"({emulator / sum(times):.1%} of a core)")  # fmt: skip
            results["modes"][mode if mode not in results["modes"] else f"{mode}-{run}"] = {
                "epochs_s": times,
                "spoke": report,
            }
            extra = ""
            if report:
                extra = (
                    f"  hit {report['hit_ratio'] or 0:.2f}, stall {report['stall_s']:.1f} s, "
                    f"wasted {report['wasted_bytes'] / MB:.0f} MB, "
                    f"predicted {report['predicted_bytes'] / MB:.0f} MB "
                    f"({report['predicted_hits']} hits), "
                    f"link {report['bandwidth'] / MB:.0f} MB/s (measured)"
                )
            print(f"{mode:>9}: " + "  ".join(f"{t:6.2f} s" for t in times) + extra)

    local = results["modes"].get("local", {}).get("epochs_s")
    print("\nepoch time / all-local and / stall bound (epoch 1, epoch 2):")
    for mode, got in results["modes"].items():
        times = got["epochs_s"]
        pairs = zip(times, local or times, strict=True)
        vs_local = "  ".join(f"{t / base:5.2f}x" for t, base in pairs) if local else "-"
        vs_bound = "  ".join(f"{t / bound:5.2f}x" for t in times)
        print(f"{mode:>9}: local {vs_local}   bound {vs_bound}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
