"""Measure FastCDC size windows on the transfer corpora (bench layer, issue 6).

For each candidate window, the loomfs bytes of the dataset v1->v2 update and of the
fine-tuning checkpoint updates (the two corpora where chunk size decides dedup), and the
chunk+hash throughput of the pipeline. The winner is ``DEFAULT_WINDOW`` in loomfs.chunks.

Run: ``PYTHONPATH=src python bench/chunk_window.py [--quick] [--corpora DIR]``.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from corpora import build
from loomfs.chunks import ChunkPipeline, ChunkWindow
from transfer import LoomfsReceiver, StepResult, changed_files

KIB = 1 << 10
WINDOWS = [
    ChunkWindow(4 * KIB, 8 * KIB, 64 * KIB),
    ChunkWindow(8 * KIB, 16 * KIB, 128 * KIB),
    ChunkWindow(16 * KIB, 32 * KIB, 256 * KIB),
    ChunkWindow(32 * KIB, 64 * KIB, 512 * KIB),
    ChunkWindow(64 * KIB, 128 * KIB, 1024 * KIB),
]


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
