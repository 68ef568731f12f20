"""Measure FastCDC size windows on the transfer corpora (bench layer, issue 6).

For each candidate window, the loomfs bytes of the dataset v1->v2 update and of the
fine-tuning checkpoint updates (the two corpora where chunk size decides dedup), and the
chunk+hash throughput of the pipeline. The winner is ``DEFAULT_WINDOW`` in loomfs.chunks.

Run: ``PYTHONPATH=src python bench/chunk_window.py [--quick] [--corpora DIR]``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path
from typing import BinaryIO

from corpora import build
from loomfs.chunks.cdc import ChunkWindow
from loomfs.chunks.chunkmap import ID_SIZE, ChunkMap
from loomfs.chunks.codec import FileReference, decode_frame
from loomfs.chunks.pipeline import ChunkPipeline
from loomfs.chunks.plan import ChunkToSend, choose_reference, plan_transfer
from transfer import StepResult, changed_files

KIB = 1 << 10
WINDOWS = [
    ChunkWindow(4 * KIB, 8 * KIB, 64 * KIB),
    ChunkWindow(8 * KIB, 16 * KIB, 128 * KIB),
    ChunkWindow(16 * KIB, 32 * KIB, 256 * KIB),
    ChunkWindow(32 * KIB, 64 * KIB, 512 * KIB),
    ChunkWindow(64 * KIB, 128 * KIB, 1024 * KIB),
]

# Per file, a request also names the path and the version: count the path and 16 bytes of
# version and size, the chunk map, and one id per requested chunk.
FILE_HEADER = 16


class LoomfsReceiver:
    """What the receiver holds (chunk ids and file versions) and what reaching each next
    snapshot costs on the wire, counted with the chunk library alone (no link): enough to
    compare windows, and fast."""

    def __init__(self, pipeline: ChunkPipeline) -> None:
        self.pipeline = pipeline
        self.held_ids: set[bytes] = set()
        self.held_files: dict[str, tuple[ChunkMap, Path]] = {}

    def step(self, snapshot: Path, changed: list[Path], result: StepResult) -> None:
        """Bring the receiver to ``snapshot``; only ``changed`` files (new, or a new version
        at their path) cost anything: the hub keeps maps per version and the spoke knows
        which versions it holds."""
        versions = {name: held for name, (held, _) in self.held_files.items()}
        arrived: dict[str, tuple[ChunkMap, Path]] = {}
        for path in changed:
            name = path.relative_to(snapshot).as_posix()
            started = time.perf_counter()
            new = self.pipeline.map_file(path)
            mapped = time.perf_counter()
            base = choose_reference(name, new, versions)
            ref_map, ref_path = self.held_files[base] if base is not None else (None, None)
            plan = plan_transfer(new, self.held_ids, ref_map)
            with tempfile.TemporaryFile() as spool:
                # Frames are spooled to disk, not collected: a file's frames can be as large
                # as the file. The receiver's decoding runs after the clock stops.
                sizes = [
                    spool.write(frame) for frame in self.pipeline.encode_file(path, plan, ref_path)
                ]
                encoded = time.perf_counter()
                spool.seek(0)
                self._receive(spool, plan, sizes, ref_path, result)
            result.seconds["loomfs_map"] = result.seconds.get("loomfs_map", 0) + mapped - started
            result.seconds["loomfs"] = result.seconds.get("loomfs", 0) + encoded - started
            map_bytes = len(new.serialize()) + len(name.encode()) + FILE_HEADER
            result.loomfs += map_bytes + ID_SIZE * len(plan) + sum(sizes)
            self.held_ids.update(send.entry.id for send in plan)
            arrived[name] = (new, path)
        self.held_files.update(arrived)

    @staticmethod
    def _receive(
        spool: BinaryIO,
        plan: list[ChunkToSend],
        sizes: list[int],
        reference: Path | None,
        result: StepResult,
    ) -> None:
        """Decode and verify every frame as the receiver would."""
        with FileReference(reference) if reference else nullcontext() as ref:
            for send, size in zip(plan, sizes, strict=True):
                frame = spool.read(size)
                decode_frame(frame, send.entry.id, ref)


def updates(steps: list[Path], window: ChunkWindow) -> tuple[int, int, float]:
    """Bytes of all updates after the first snapshot, bytes mapped, and mapping seconds."""
    with ChunkPipeline(workers=2, window=window) as pipeline:
        receiver = LoomfsReceiver(pipeline)
        wire = 0
        totals = StepResult(0)
        for index, snapshot in enumerate(steps):
            result = StepResult(index)
            changed = changed_files(snapshot, steps[index - 1] if index else None)
            receiver.step(snapshot, changed, result)
            totals.copy += sum(path.stat().st_size for path in changed)
            totals.seconds["map"] = totals.seconds.get("map", 0) + result.seconds["loomfs_map"]
            if index:
                wire += result.loomfs
    return wire, totals.copy, totals.seconds["map"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--corpora", type=Path, help="reuse corpora built here (else a temp dir)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="loomfs-window-") as tmp:
        root = args.corpora or Path(tmp) / "corpora"
        if not (root / "dataset").exists():
            build(root, quick=args.quick)
        corpora = {name: sorted((root / name).glob("step-*")) for name in ("dataset", "finetune")}
        print(
            "| window min/avg/max KiB | mean chunk KiB | dataset update MB | finetune updates MB "
            "| chunk+hash MB/s |"
        )
        print("|---|---|---|---|---|")
        for window in WINDOWS:
            row = []
            mapped = seconds = 0.0
            for steps in corpora.values():
                wire, size, map_seconds = updates(steps, window)
                row.append(wire)
                mapped += size
                seconds += map_seconds
            mean = window.avg_size + window.min_size
            print(
                f"| {window.min_size // KIB}/{window.avg_size // KIB}/{window.max_size // KIB} "
                f"| ~{mean // KIB} | {row[0] / 1e6:.2f} | {row[1] / 1e6:.2f} "
                f"| {mapped / seconds / 1e6:.0f} |"
            )


if __name__ == "__main__":
    main()
