"""Tests of the chunk layer: cut stability, chunk map wire form, frames, planning, pipeline."""

from __future__ import annotations

import array
import asyncio
import io
import math
import random
import struct
from pathlib import Path

import pytest
import torch
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from loomfs.chunks.cdc import DEFAULT_WINDOW, ChunkWindow, chunk_map_of, iter_chunks
from loomfs.chunks.chunkmap import ChunkEntry, ChunkMap, get_varint
from loomfs.chunks.codec import (
    BytesReference,
    FrameKind,
    add_back,
    chunk_id,
    decode_frame,
    encode_chunk,
    encode_delta,
    frame_length,
    pack,
    subtract,
    unpack,
    xor,
)
from loomfs.chunks.pipeline import ChunkPipeline
from loomfs.chunks.plan import choose_reference, plan_transfer
from loomfs.chunks.records import read_uploads, record
from loomfs.errors import Conflict, CorruptData, LoomError

SMALL = ChunkWindow(min_size=1 << 10, avg_size=2 << 10, max_size=8 << 10)


def text(size: int, seed: int = 0) -> bytes:
    """Compressible, non-repetitive bytes (JSONL-like rows of words and numbers)."""
    rng = random.Random(seed)
    words = ["loom", "chunk", "spoke", "hub", "gpu", "shard", "row", "token", "weight"]
    out = bytearray()
    while len(out) < size:
        row = " ".join(rng.choice(words) for _ in range(rng.randint(3, 12)))
        out += f'{{"n": {rng.random():.6f}, "text": "{row}"}}\n'.encode()
    return bytes(out[:size])


def noise(size: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(size)


def cut(data: bytes, window: ChunkWindow = SMALL, read_size: int = 1 << 20) -> ChunkMap:
    return chunk_map_of(io.BytesIO(data), window, read_size)


def test_chunks_cover_the_input_within_the_window() -> None:
    data = noise(300_000)
    pieces = list(iter_chunks(io.BytesIO(data), SMALL, 64 << 10))
    assert b"".join(bytes(p) for p in pieces) == data
    assert all(len(p) <= SMALL.max_size for p in pieces)
    assert all(len(p) >= SMALL.min_size for p in pieces[:-1])


@pytest.mark.parametrize("read_size", [16 << 10, 17 << 10, 64 << 10, 1 << 20])
def test_streaming_cut_equals_whole_buffer_cut(read_size: int) -> None:
    data = text(200_000, seed=1) + noise(200_000, seed=2)
    streamed = cut(data, read_size=read_size)
    whole = ChunkMap.from_lengths(
        [(c.length, chunk_id(c.data)) for c in SMALL.chunker().cut_buf(data)]
    )
    assert streamed == whole


def test_read_size_must_hold_two_chunks() -> None:
    with pytest.raises(ValueError):
        list(iter_chunks(io.BytesIO(b"x"), SMALL, SMALL.max_size))


def test_boundaries_survive_a_small_insert() -> None:
    data = noise(400_000, seed=3)
    edited = data[:200_000] + b"inserted row\n" + data[200_000:]
    before, after = cut(data), cut(edited)
    shared = before.ids() & after.ids()
    # Only the chunk holding the insert (and maybe its neighbour) may differ.
    assert len(shared) >= len(after) - 2


def test_empty_input_has_an_empty_map() -> None:
    empty = cut(b"")
    assert len(empty) == 0
    assert empty.size == 0
    assert ChunkMap.deserialize(empty.serialize()) == empty


ids = st.binary(min_size=32, max_size=32)
maps = st.lists(st.tuples(st.integers(1, 1 << 40), ids), max_size=50).map(ChunkMap.from_lengths)


@given(maps)
@settings(max_examples=200, deadline=None)
def test_chunk_map_round_trip(chunk_map: ChunkMap) -> None:
    wire = chunk_map.serialize()
    assert ChunkMap.deserialize(wire) == chunk_map
    assert len(wire) <= 5 + 10 + len(chunk_map) * (32 + 6)


@given(maps.filter(len), st.data())
@settings(max_examples=100, deadline=None)
def test_damaged_chunk_map_raises(chunk_map: ChunkMap, data: st.DataObject) -> None:
    wire = chunk_map.serialize()
    cut_at = data.draw(st.integers(0, len(wire) - 1))
    with pytest.raises(CorruptData):
        ChunkMap.deserialize(wire[:cut_at])
    with pytest.raises(CorruptData):
        ChunkMap.deserialize(wire + b"\0")


def test_chunk_map_rejects_gaps() -> None:
    with pytest.raises(ValueError):
        ChunkMap([ChunkEntry(0, 10, bytes(32)), ChunkEntry(11, 10, bytes(32))])


NUMERIC_DELTAS = (FrameKind.XOR, FrameKind.SUB)


def kind_of(frame: bytes) -> FrameKind:
    return FrameKind(frame[0] & 0x0F)


def _compressor_plain(data: bytes) -> bytes:
    return zstandard.ZstdCompressor(level=3).compress(data)


def test_compressible_chunk_is_sent_compressed() -> None:
    data = text(64 << 10)
    frame = encode_chunk(data)
    assert kind_of(frame) == FrameKind.ZSTD
    assert len(frame) < len(data) // 2
    assert decode_frame(frame, chunk_id(data)) == data


def test_incompressible_chunk_is_sent_raw() -> None:
    data = noise(64 << 10)
    frame = encode_chunk(data)
    assert kind_of(frame) == FrameKind.RAW
    assert len(frame) - len(data) < 8
    assert decode_frame(frame, chunk_id(data)) == data


def test_delta_costs_about_the_edits() -> None:
    old = noise(64 << 10, seed=4)
    new = bytearray(old)
    for at in range(1000, len(new), 8000):  # 8 scattered 16-byte edits
        new[at : at + 16] = noise(16, seed=at)
    new_bytes = bytes(new)
    # The old bytes sit 30000 bytes in, the planner guessed 20000: the encoder finds them.
    reference = BytesReference(text(30_000) + old + text(30_000, seed=1))
    frame = encode_delta(new_bytes, reference, estimate=20_000)
    assert kind_of(frame) == FrameKind.DELTA
    assert len(frame) < 1000
    assert decode_frame(frame, chunk_id(new_bytes), reference) == new_bytes


def test_delta_needs_the_same_reference() -> None:
    old = noise(32 << 10, seed=5)
    new = old[:1000] + b"edit" + old[1004:]
    frame = encode_delta(new, BytesReference(old), estimate=0)
    with pytest.raises(CorruptData):
        decode_frame(frame, chunk_id(new))
    with pytest.raises(CorruptData):
        decode_frame(frame, chunk_id(new), BytesReference(noise(32 << 10, seed=6)))
    with pytest.raises(CorruptData):
        decode_frame(frame, chunk_id(new), BytesReference(old[:100]))


def test_useless_reference_falls_back_to_plain_frames() -> None:
    data = noise(32 << 10, seed=7)
    assert kind_of(encode_delta(data, BytesReference(noise(32 << 10, seed=8)), 0)) == FrameKind.RAW
    assert kind_of(encode_delta(data, BytesReference(b""), 0)) == FrameKind.RAW


@pytest.mark.parametrize("data", [text(50_000), noise(50_000)], ids=["text", "noise"])
def test_damaged_frames_raise_and_return_nothing(data: bytes) -> None:
    frame = encode_chunk(data)
    expected = chunk_id(data)
    for cut_at in (0, 1, 2, len(frame) // 2, len(frame) - 1):
        with pytest.raises(CorruptData):
            decode_frame(frame[:cut_at], expected)
    for flip_at in (len(frame) // 3, len(frame) - 1):
        damaged = bytearray(frame)
        damaged[flip_at] ^= 0x40
        with pytest.raises(CorruptData):
            decode_frame(bytes(damaged), expected)
    with pytest.raises(CorruptData):
        decode_frame(frame, chunk_id(b"another chunk"))
    with pytest.raises(CorruptData):
        decode_frame(bytes([9]) + frame[1:], expected)


def test_corrupt_data_is_a_retryable_loom_error() -> None:
    assert issubclass(CorruptData, LoomError)
    assert CorruptData.retryable


def test_frames_split_from_a_batch() -> None:
    chunks = [text(10_000, seed=1), noise(10_000), text(3_000, seed=2)]
    batch = b"".join(encode_chunk(c) for c in chunks)
    pos = 0
    decoded = []
    for chunk in chunks:
        size = frame_length(batch, pos)
        decoded.append(decode_frame(batch[pos : pos + size], chunk_id(chunk)))
        last, pos = pos, pos + size
    assert decoded == chunks
    assert pos == len(batch)
    with pytest.raises(CorruptData):
        frame_length(batch[:-1], last)


@given(st.binary(max_size=300), st.sampled_from([0, 2, 4]))
def test_byte_planes_round_trip(data: bytes, width: int) -> None:
    assert unpack(memoryview(pack(data, width, 1)), width, len(data)) == data


def test_tensor_like_chunks_are_shuffled() -> None:
    rng = random.Random(14)
    values = array.array("f", (rng.gauss(0, 0.02) for _ in range(16_384)))
    data = values.tobytes()
    frame = encode_chunk(data)
    assert kind_of(frame) == FrameKind.ZSTD
    assert frame[0] >> 4 == 4
    assert len(frame) < len(_compressor_plain(data))
    assert decode_frame(frame, chunk_id(data)) == data


def test_a_tensor_that_moved_a_little_is_sent_as_a_numeric_delta() -> None:
    rng = random.Random(15)
    old_values = [rng.gauss(0, 0.02) for _ in range(16_384)]
    old = array.array("f", old_values).tobytes()
    new = array.array("f", (v + rng.gauss(0, 1e-5) for v in old_values)).tobytes()
    held = b"\1" * 100 + old + b"\2" * 100
    frame = encode_delta(new, BytesReference(held), estimate=100)
    assert kind_of(frame) in NUMERIC_DELTAS
    assert len(frame) < 0.7 * len(encode_chunk(new))
    assert decode_frame(frame, chunk_id(new), BytesReference(held)) == new
    with pytest.raises(CorruptData):
        decode_frame(frame, chunk_id(new), BytesReference(held[:-200]))


def test_a_delta_judges_a_tensor_by_more_than_its_middle() -> None:
    """A tensor chunk whose middle 4 KiB holds other bytes (a header, an int buffer) is
    still found numeric by the delta's larger sample, and sent as a numeric delta."""
    rng = random.Random(16)
    old_values = [rng.gauss(0, 0.02) for _ in range(24_576)]
    new_values = [v + rng.gauss(0, 1e-5) for v in old_values]
    middle = rng.randbytes(6_000)
    half = len(old_values) // 2 * 4
    old = array.array("f", old_values).tobytes()
    new = array.array("f", new_values).tobytes()
    old, new = old[:half] + middle + old[half:], new[:half] + middle + new[half:]
    frame = encode_delta(new, BytesReference(old), estimate=0)
    assert kind_of(frame) in NUMERIC_DELTAS
    assert decode_frame(frame, chunk_id(new), BytesReference(old)) == new


@given(st.binary(max_size=300), st.binary(max_size=300), st.sampled_from([2, 4]), st.integers(0, 9))
def test_word_differences_round_trip(data: bytes, other: bytes, width: int, offset: int) -> None:
    base = (other * (len(data) // max(len(other), 1) + 1))[: len(data)] or bytes(len(data))
    moved = subtract(data, base, width, offset)
    assert len(moved) == len(data)
    assert add_back(moved, base, width, offset) == data


def floats(values: list[float]) -> bytes:
    return array.array("f", values).tobytes()


def test_sub_frames_are_exact_for_odd_lengths_and_special_values() -> None:
    """Float32 values that took small steps, with NaN, infinities, signed zeros and
    denormals among them, cut at an odd length and at an odd place of the reference:
    SUB pairs each float with its old value by the reference offset and decodes to the
    same bytes."""
    rng = random.Random(21)
    old_values = [rng.gauss(0, 0.05) for _ in range(12_000)]
    special = [math.nan, math.inf, -math.inf, 0.0, -0.0, 1e-45, -1e-45, 3.4e38]
    old_values[100 : 100 + len(special)] = special
    new_values = [v * (1 + rng.gauss(0, 1e-6)) for v in old_values]
    new_values[200:203] = [-math.inf, math.nan, -0.0]  # values that flipped sign or class
    held = b"\7" * 64 + floats(old_values) + b"\7" * 64
    new = floats(new_values)
    for start, end in ((0, len(new)), (3, len(new) - 5), (1, len(new) - 2)):
        piece = new[start:end]
        frame = encode_delta(piece, BytesReference(held), estimate=64 + start)
        assert kind_of(frame) == FrameKind.SUB
        assert frame[0] >> 4 == 4
        assert len(frame) < 0.5 * len(piece)
        assert decode_frame(frame, chunk_id(piece), BytesReference(held)) == piece


def test_sub_works_in_half_precision_words() -> None:
    rng = random.Random(22)
    old_values = [rng.gauss(0, 1) for _ in range(30_000)]
    old = _half(old_values)
    new = _half([v + rng.gauss(0, 1e-3) for v in old_values])
    frame = encode_delta(new, BytesReference(old), estimate=0)
    assert kind_of(frame) in NUMERIC_DELTAS
    assert decode_frame(frame, chunk_id(new), BytesReference(old)) == new


def _half(values: list[float]) -> bytes:
    return b"".join(struct.pack("<e", value) for value in values)


def test_non_numeric_data_never_gets_a_numeric_delta() -> None:
    old_text = text(64 << 10, seed=3)
    new_text = old_text[:20_000] + b"a small edit" + old_text[20_012:]
    assert kind_of(encode_delta(new_text, BytesReference(old_text), 0)) == FrameKind.DELTA
    random_new = noise(64 << 10, seed=9)
    assert kind_of(encode_delta(random_new, BytesReference(noise(64 << 10, seed=10)), 0)) in (
        FrameKind.RAW,
        FrameKind.ZSTD,
    )


def test_sub_without_a_word_size_is_refused() -> None:
    rng = random.Random(23)
    old = floats([rng.gauss(0, 0.05) for _ in range(8_000)])
    new = floats([v * 1.000001 for v in array.array("f", old)])
    frame = bytearray(encode_delta(new, BytesReference(old), 0))
    assert kind_of(bytes(frame)) == FrameKind.SUB
    frame[0] = FrameKind.SUB  # width nibble 0: no word size to subtract in
    with pytest.raises(CorruptData):
        decode_frame(bytes(frame), chunk_id(new), BytesReference(old))


def test_sub_is_chosen_and_pays_on_a_checkpoint_pair() -> None:
    """Two torch.save checkpoints of a small model 20 AdamW steps apart: the chunks
    that changed go mostly as SUB frames, and those cost less than XOR would."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 64))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    saved = []
    for _ in range(2):
        for _ in range(20):
            loss = model(torch.randn(8, 256)).square().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        buffer = io.BytesIO()
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, buffer)
        saved.append(buffer.getvalue())
    old, new = saved
    old_map, new_map = cut(old, DEFAULT_WINDOW), cut(new, DEFAULT_WINDOW)
    reference = BytesReference(old)
    sub_bytes = xor_bytes = 0
    for send in plan_transfer(new_map, old_map.ids(), old_map):
        assert send.delta_from is not None
        data = new[send.entry.offset : send.entry.end]
        frame = encode_delta(data, reference, send.delta_from)
        assert decode_frame(frame, send.entry.id, reference) == data
        if kind_of(frame) == FrameKind.SUB:
            ref_at = get_varint(memoryview(frame), get_varint(memoryview(frame), 1)[1])[0]
            sub_bytes += len(frame)
            xor_bytes += len(pack(xor(data, old[ref_at : ref_at + len(data)]), 4, 3))
    assert sub_bytes > len(new) // 4  # most of what changed went as SUB
    assert sub_bytes < 0.98 * xor_bytes


def test_unknown_shuffle_width_raises() -> None:
    data = text(10_000)
    frame = bytearray(encode_chunk(data))
    frame[0] = FrameKind.ZSTD | 3 << 4
    with pytest.raises(CorruptData):
        decode_frame(bytes(frame), chunk_id(data))


def test_plan_sends_only_missing_chunks_once() -> None:
    a, b, c = text(40_000, seed=1), text(40_000, seed=2), text(40_000, seed=3)
    held_map = cut(a + b)
    new_map = cut(c + a + c + b)
    plan = plan_transfer(new_map, held_map.ids())
    sent = [send.entry.id for send in plan]
    assert len(sent) == len(set(sent))
    assert not set(sent) & held_map.ids()
    assert set(sent) | held_map.ids() >= new_map.ids()
    # c appears twice but goes once; most of a and b is held already.
    assert sum(s.entry.length for s in plan) < 40_000 + 3 * SMALL.max_size


def deliver_with_delta(old: bytes, new: bytes) -> tuple[int, int]:
    """Plan ``new`` against a receiver holding ``old``, encode every planned chunk as a
    delta, check that each decodes to the right bytes, and return (chunks in ``new``,
    bytes on the wire)."""
    old_map, new_map = cut(old), cut(new)
    plan = plan_transfer(new_map, old_map.ids(), reference=old_map)
    reference = BytesReference(old)
    wire = 0
    for send in plan:
        assert send.delta_from is not None
        assert 0 <= send.delta_from <= len(old)
        data = new[send.entry.offset : send.entry.end]
        frame = encode_delta(data, reference, send.delta_from)
        assert decode_frame(frame, send.entry.id, reference) == data
        wire += len(frame)
    return len(new_map), wire


def test_plan_windows_follow_anchors_in_the_reference() -> None:
    old = noise(200_000, seed=9)
    new = old[:100_000] + b"x" * 5_000 + old[100_000:]
    _, wire = deliver_with_delta(old, new)
    # One insert of compressible bytes into incompressible ones: about the insert is sent.
    assert wire < 2_000


def test_dense_scattered_edits_cost_about_their_size() -> None:
    old = text(300_000, seed=10)
    rng = random.Random(11)
    new = bytearray(old)
    edits = 600  # about one per 500 bytes: nearly every chunk changes, no anchors left
    for _ in range(edits):
        at = rng.randrange(len(new))
        new[at:at] = b"EDIT%04d" % rng.randrange(10_000)
    new_bytes = bytes(new)
    changed = len(cut(new_bytes).ids() - cut(old).ids())
    chunks, wire = deliver_with_delta(old, new_bytes)
    assert changed >= 0.95 * chunks
    plain = len(encode_chunk(new_bytes))
    assert wire < edits * 8 * 4
    assert wire < plain / 3


def test_pipeline_maps_and_encodes_like_the_sequential_path(tmp_path: Path) -> None:
    old_path, new_path = tmp_path / "old", tmp_path / "new"
    old = text(1_500_000, seed=12) + noise(500_000, seed=13)
    new = old[:700_000] + b"changed" + old[700_100:]
    old_path.write_bytes(old)
    new_path.write_bytes(new)
    with ChunkPipeline(workers=2, window=SMALL, read_size=256 << 10) as pipeline:
        old_map = pipeline.map_file(old_path)
        new_map = pipeline.map_file(new_path)
        assert new_map == cut(new)
        plan = plan_transfer(new_map, old_map.ids(), reference=old_map)
        frames = list(pipeline.encode_file(new_path, plan, reference=old_path))
    assert len(frames) == len(plan)
    reference = BytesReference(old)
    for send, frame in zip(plan, frames, strict=True):
        assert (
            decode_frame(frame, send.entry.id, reference) == new[send.entry.offset : send.entry.end]
        )
    assert sum(map(len, frames)) < 2_000


def test_pipeline_refuses_a_file_changed_since_mapping(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(text(100_000))
    with ChunkPipeline(workers=2, window=SMALL, read_size=256 << 10) as pipeline:
        chunk_map = pipeline.map_file(path)
        path.write_bytes(text(100_000, seed=99))
        with pytest.raises(Conflict):
            list(pipeline.encode_file(path, plan_transfer(chunk_map, set())))


def test_reference_is_same_path_then_shared_chunks_then_similar_name() -> None:
    a, b = text(60_000, seed=20), text(60_000, seed=21)
    held = {"ckpt/step-100.pt": cut(a), "ckpt/other.bin": cut(b), "data/x.pt": cut(b)}
    assert choose_reference("ckpt/other.bin", cut(a), held) == "ckpt/other.bin"
    assert choose_reference("ckpt/renamed.pt", cut(b), held) in {"ckpt/other.bin", "data/x.pt"}
    unrelated = cut(text(60_000, seed=22))
    assert choose_reference("ckpt/step-200.pt", unrelated, held) == "ckpt/step-100.pt"
    assert choose_reference("new/step-200.pt", unrelated, held) is None


def test_a_checkpoint_series_takes_the_nearest_step_for_its_base() -> None:
    """Checkpoints share their frozen layers' chunks; one more chunk shared by chance
    does not make an older step the base, a copy sharing all its chunks still wins, and
    with nothing shared the nearest step by number does (``step-100`` and ``step-300``
    are as like ``step-400`` letter for letter)."""

    def version(*ids: bytes) -> ChunkMap:
        return ChunkMap.from_lengths([(1000, i) for i in ids])

    frozen = [bytes([n]) * 32 for n in range(200)]
    own = [bytes([n, 1]) * 16 for n in range(20)]
    new = version(*frozen, *own)
    held = {
        "ckpt/step-100.pt": version(*frozen),
        "ckpt/step-200.pt": version(*frozen, own[0]),  # one chunk more, cut by chance
        "ckpt/step-300.pt": version(*frozen),
    }
    assert choose_reference("ckpt/step-400.pt", new, held) == "ckpt/step-300.pt"
    copied = {**held, "ckpt/old-copy.pt": version(*frozen, *own)}
    assert choose_reference("ckpt/step-400.pt", new, copied) == "ckpt/old-copy.pt"
    nothing_shared = version(*(bytes([n, 2]) * 16 for n in range(20)))
    assert choose_reference("ckpt/step-400.pt", nothing_shared, held) == "ckpt/step-300.pt"
    assert choose_reference("ckpt/step-1000.pt", nothing_shared, held) == "ckpt/step-300.pt"


def test_estimates_hold_far_from_the_only_anchor() -> None:
    # One unchanged chunk at the start, then inserts everywhere: 600 KB of cheap filler
    # over 1.2 MB. Counting from that one anchor would put most chunks more than the
    # search radius off; interpolating to the file's end keeps every estimate close.
    head, body = noise(20_000, seed=24), text(1_200_000, seed=25)
    edited = b"".join(body[at : at + 400] + b"#" * 200 for at in range(0, len(body), 400))
    old, new = head + body, head + edited
    chunks, wire = deliver_with_delta(old, new)
    assert chunks > 100
    assert wire < len(encode_chunk(new)) / 3


def test_pipeline_consumer_may_stop_early(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(text(3_000_000, seed=26))
    with ChunkPipeline(workers=2, window=SMALL, read_size=256 << 10) as pipeline:
        plan = plan_transfer(pipeline.map_file(path), set())
        frames = pipeline.encode_file(path, plan)
        first = next(frames)
        frames.close()  # workers are drained before the descriptor is closed
        assert decode_frame(first, plan[0].entry.id) == path.read_bytes()[: plan[0].entry.length]


async def test_an_upload_body_ends_after_its_last_record_whenever_the_end_arrives() -> None:
    """The body's end may reach the hub after its last record's bytes (chunked transfer,
    another segment): the reader waits for it instead of taking it for a truncation."""
    pieces = [noise(40_000, seed=n) for n in range(3)]
    body = b"".join(record(encode_chunk(p), chunk_id(p)) for p in pieces)
    reader = asyncio.StreamReader()
    reader.feed_data(body)
    asyncio.get_running_loop().call_later(0.05, reader.feed_eof)
    got = [(cid, decode_frame(frame, cid)) async for cid, frame in read_uploads(reader.readexactly)]
    assert got == [(chunk_id(p), p) for p in pieces]
    cut = asyncio.StreamReader()
    cut.feed_data(body[:-10])
    cut.feed_eof()
    with pytest.raises(EOFError):
        _ = [r async for r in read_uploads(cut.readexactly)]
