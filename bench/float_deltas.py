"""Where the update bytes of a checkpoint series go, and how far a float coder could go.

Bench layer, issue 6, corpus 2 of ``corpora.py`` (fine-tuning checkpoints: frozen backbone,
head and low-rank adapters trained with AdamW, 20 steps apart). For each update the chunks
loomfs would send are planned and encoded as the hub does (``plan_transfer`` +
``encode_delta`` against the previous checkpoint), and their frame bytes are split by
tensor family: frozen backbone, trained weights, AdamW ``exp_avg`` and ``exp_avg_sq``,
and the zip/pickle framing. Side by side, per family, on whole tensors aligned with their
old values: plain byte-plane zstd, XOR then byte planes (the codec before SUB), SUB
(zigzag integer difference) then byte planes, the same at zstd level 19, and an order-0
entropy floor: the smallest of plain, XOR and SUB byte planes each coded at its own
empirical entropy, i.e. what an ideal per-tensor entropy coder would need with no model
of the training.

Run: ``PYTHONPATH=src python bench/float_deltas.py [--width 1024] [--checkpoints 4]``.
"""

from __future__ import annotations

import argparse
import io
import itertools
import tempfile
import time
import zipfile
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import zstandard

from corpora import checkpoints
from loomfs.chunks.cdc import chunk_map_of
from loomfs.chunks.codec import BytesReference, encode_delta, subtract
from loomfs.chunks.plan import plan_transfer

Sums = defaultdict[str, float]
FAMILIES = ("frozen", "trained", "exp_avg", "exp_avg_sq", "framing")


def tensor_spans(data: bytes) -> dict[str, tuple[int, int, str]]:
    """(start, end, family) of every tensor storage of a torch.save zip by its member
    name (less the archive's own name, which changes with the file's): each is one
    stored zip member, found from its local header."""
    state = torch.load(io.BytesIO(data), weights_only=True)
    family: dict[bytes, str] = {}
    for key, tensor in state["model"].items():
        family[tensor.numpy().tobytes()] = "frozen" if ".base." in key else "trained"
    for moments in state["optimizer"]["state"].values():
        for key, tensor in moments.items():
            if tensor.dim():
                family[tensor.numpy().tobytes()] = key
    spans = {}
    for info in zipfile.ZipFile(io.BytesIO(data)).infolist():
        at = info.header_offset
        name_length = int.from_bytes(data[at + 26 : at + 28], "little")
        extra_length = int.from_bytes(data[at + 28 : at + 30], "little")
        start = at + 30 + name_length + extra_length
        kind = family.get(data[start : start + info.file_size])
        if kind is not None:
            spans[info.filename.split("/", 1)[1]] = (start, start + info.file_size, kind)
    return spans


def planes(words: np.ndarray) -> list[bytes]:
    return [(words >> (8 * i) & 0xFF).astype(np.uint8).tobytes() for i in range(4)]


def entropy_bytes(plane: bytes) -> float:
    counts = np.bincount(np.frombuffer(plane, np.uint8), minlength=256)
    p = counts[counts > 0] / len(plane)
    return float(-(p * np.log2(p)).sum()) * len(plane) / 8


def coded(words: np.ndarray, coder: Callable[[bytes], float]) -> float:
    return sum(coder(plane) for plane in planes(words))


def families_of_update(old: bytes, new: bytes, sums: dict[str, Sums]) -> float:
    """Add one update's numbers to ``sums``; return the seconds encode_delta took."""
    spans, old_spans = tensor_spans(new), tensor_spans(old)
    old_map, new_map = chunk_map_of(io.BytesIO(old)), chunk_map_of(io.BytesIO(new))
    reference = BytesReference(old)
    # Which family every byte belongs to, and whether it changed: a chunk's frame bytes are
    # charged to the families of its changed bytes (a chunk reaching into frozen weights
    # costs nearly nothing for them: their difference is zeros). A longer file name
    # (step-1000.pt after step-900.pt) moves every member a byte, so tensors are paired
    # by member name, not by offset.
    owner = np.full(len(new), FAMILIES.index("framing"), np.uint8)
    changed = np.ones(len(new), bool)
    for name, (start, end, kind) in spans.items():
        owner[start:end] = FAMILIES.index(kind)
        was = old_spans[name][0]
        changed[start:end] = np.frombuffer(new, np.uint8, end - start, start) != np.frombuffer(
            old, np.uint8, end - start, was
        )
    seconds = 0.0
    for send in plan_transfer(new_map, old_map.ids(), old_map):
        entry = send.entry
        data = new[entry.offset : entry.end]
        started = time.perf_counter()
        assert send.delta_from is not None  # same layout: every chunk has an estimate
        frame = encode_delta(data, reference, send.delta_from)
        seconds += time.perf_counter() - started
        sums["bytes"]["encoded raw"] += len(data)
        who = owner[entry.offset : entry.end]
        if changed[entry.offset : entry.end].any():
            who = who[changed[entry.offset : entry.end]]
        shares = np.bincount(who, minlength=len(FAMILIES)) / len(who)
        for index, share in enumerate(shares):
            sums[FAMILIES[index]]["loomfs"] += share * len(frame)
    level3 = zstandard.ZstdCompressor(level=3)
    level19 = zstandard.ZstdCompressor(level=19)
    for name, (start, end, kind) in spans.items():
        row = sums[kind]
        row["raw"] += end - start
        was = old_spans[name][0]
        new_words = np.frombuffer(new, "<u4", (end - start) // 4, start)
        old_words = np.frombuffer(old, "<u4", (end - start) // 4, was)
        if (new_words == old_words).all():
            continue
        row["changed"] += end - start
        xored = new_words ^ old_words
        moved = subtract(new[start:end], old[was : was + end - start], 4, was)
        subbed = np.frombuffer(moved, "<u4")
        row["plain z3"] += coded(new_words, lambda p: len(level3.compress(p)))
        row["XOR z3"] += coded(xored, lambda p: len(level3.compress(p)))
        row["SUB z3"] += coded(subbed, lambda p: len(level3.compress(p)))
        row["SUB z19"] += coded(subbed, lambda p: len(level19.compress(p)))
        row["floor"] += min(coded(w, entropy_bytes) for w in (new_words, xored, subbed))
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=1024, help="model width (corpus 2: 1024)")
    parser.add_argument("--checkpoints", type=int, default=4, help="checkpoints (corpus 2: 10)")
    args = parser.parse_args()
    torch.set_num_threads(2)
    sums: dict[str, Sums] = {name: defaultdict(float) for name in (*FAMILIES, "bytes")}
    with tempfile.TemporaryDirectory(prefix="loomfs-float-") as tmp:
        steps = checkpoints(Path(tmp), args.width, args.checkpoints, seed=6, frozen_backbone=True)
        # Checkpoint k is written into snapshot k as step-<100 (k + 1)>.pt.
        files = [step / f"step-{(k + 1) * 100}.pt" for k, step in enumerate(steps)]
        seconds = 0.0
        for old_path, new_path in itertools.pairwise(files):
            seconds += families_of_update(old_path.read_bytes(), new_path.read_bytes(), sums)
    updates = len(files) - 1
    columns = ("raw", "changed", "loomfs", "plain z3", "XOR z3", "SUB z3", "SUB z19", "floor")
    print(f"{updates} updates of a width-{args.width} checkpoint, MB per update")
    print("| family | " + " | ".join(columns) + " |")
    print("|---|" + "---|" * len(columns))
    total: Sums = defaultdict(float)
    for name in FAMILIES:
        for column, value in sums[name].items():
            total[column] += value
        cells = " | ".join(f"{sums[name][c] / updates / 1e6:.3f}" for c in columns)
        print(f"| {name} | {cells} |")
    cells = " | ".join(f"{total[c] / updates / 1e6:.3f}" for c in columns)
    print(f"| all | {cells} |")
    tensors = total["changed"]
    print(
        f"\nchanged tensors: loomfs frames {_share(sums, 'loomfs')} | "
        + " | ".join(f"{c} {total[c] / tensors:.3f}" for c in columns[3:])
        + " of their raw size"
    )
    encoded = sums["bytes"]["encoded raw"]
    rate = encoded / seconds / 1e6
    print(f"encode_delta, one thread: {rate:.0f} MB/s over {encoded / 1e6:.1f} MB")


def _share(sums: dict[str, Sums], column: str) -> str:
    tensors = sum(sums[name]["changed"] for name in FAMILIES)
    frames = sum(sums[name][column] for name in FAMILIES if name != "framing")
    return f"{frames / tensors:.3f}"


if __name__ == "__main__":
    main()
