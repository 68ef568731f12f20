"""The audit log: the chain verifies, every kind of tampering is named where it happened, a
crash is told apart from tampering, and nothing acknowledged is lost."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import REGISTRY

from loomfs.config import Config
from loomfs.core.audit import (
    GENESIS,
    TORN_OP,
    AuditLog,
    AuditReader,
    Finding,
    archive,
    parse_anchor,
)
from loomfs.core.audit import _seal as reseal  # the attacker's tool: the same sealing
from loomfs.core.types import Principal
from loomfs.errors import BackendUnavailable, ConfigError
from loomfs.fabric.identity import SiteIdentity
from loomfs.fabric.server import FabricServer
from loomfs.service import HubService

ALICE = Principal("alice", frozenset({"research"}), site="eu-west", protocol="s3")
BOB = Principal("bob", site="us-east", protocol="fuse")
KEY = b"k" * 32


def write_log(
    directory: Path, n: int, *, key: bytes | None = None, segment_size: int = 1 << 20
) -> None:
    """``n`` records, alternating alice and bob, in batches of 10 (so that small segments
    rotate often)."""
    with AuditLog(directory, site="hub", key=key, segment_size=segment_size, batch_size=10) as log:
        for i in range(n):
            who = ALICE if i % 2 == 0 else BOB
            log.record(who, "read" if i % 3 else "stat", f"/data/{i % 7}/f{i}", "ok", nbytes=i)
            if i % 10 == 9:
                log.flush()


def lines_of(path: Path) -> list[str]:
    return path.read_text().splitlines(keepends=True)


def findings(directory: Path, key: bytes | None = None) -> list[Finding]:
    return AuditReader(directory, key).verify().findings


def test_chain_verifies_across_rotation_and_archiving(tmp_path: Path) -> None:
    directory = tmp_path / "audit"
    write_log(directory, 500, segment_size=4096)
    reader = AuditReader(directory)
    assert len(reader.segments()) > 5
    report = reader.verify()
    assert report.ok and report.findings == [] and report.records == 500
    assert report.head_seq == 500 and (500, report.head_hash) == reader.head()
    # each segment starts where the one before ended
    first_lines = [json.loads(lines_of(p)[0]) for p in reader.segments()]
    assert first_lines[0]["prev"] == GENESIS
    assert [h["first_seq"] for h in first_lines] == sorted(h["first_seq"] for h in first_lines)
    archived = archive(directory)
    assert len(archived) == len(first_lines) - 1  # the newest stays open
    again = AuditReader(directory).verify()
    assert again.ok and again.records == 500 and again.head_hash == report.head_hash
    assert [r.seq for r in AuditReader(directory).records()] == list(range(1, 501))
    # the writer goes on after archiving, in the chain
    write_log(directory, 20)
    final = AuditReader(directory).verify()
    assert final.ok and final.records == 520


FIELDS = ["seq", "time_ns", "site", "protocol", "user", "op", "path", "nbytes", "result",
          "detail", "prev", "hash"]  # fmt: skip


@pytest.mark.parametrize("name", FIELDS)
def test_an_edit_of_any_field_is_named(tmp_path: Path, name: str) -> None:
    directory = tmp_path / "audit"
    write_log(directory, 50)
    (segment,) = AuditReader(directory).segments()
    lines = lines_of(segment)
    record = json.loads(lines[20])  # line 21: seq 20
    changed = record[name] + 1 if isinstance(record[name], int) else record[name][::-1] + "x"
    field = f'"{name}":'
    lines[20] = lines[20].replace(field + json.dumps(record[name]), field + json.dumps(changed))
    assert json.loads(lines[20])[name] == changed
    segment.write_text("".join(lines))
    assert findings(directory) == [
        Finding("edited", segment.name, 21, changed if name == "seq" else 20, _message(directory))
    ]


def _message(directory: Path) -> str:
    return AuditReader(directory).verify().findings[0].message


def test_removed_reordered_and_rehashed_records_are_named(tmp_path: Path) -> None:
    directory = tmp_path / "audit"
    write_log(directory, 50)
    (segment,) = AuditReader(directory).segments()
    original = lines_of(segment)

    del_one = original[:10] + original[11:]  # seq 10 (line 11) gone
    segment.write_text("".join(del_one))
    (found,) = findings(directory)
    assert (found.kind, found.line, found.seq) == ("removed", 11, 11)
    assert "seq 10..10 missing" in found.message

    swapped = original[:]
    swapped[30], swapped[31] = swapped[31], swapped[30]  # seq 30 and 31
    segment.write_text("".join(swapped))
    (found,) = findings(directory)
    assert (found.kind, found.line, found.seq) == ("reordered", 31, 31)

    # an attacker without a key rewrites one record and recomputes its hash: the next
    # record's link still names the original
    record = json.loads(original[40])
    record.pop("hash")
    record["user"] = "mallory"
    rehashed = original[:]
    rehashed[40] = reseal(record, None)
    segment.write_text("".join(rehashed))
    (found,) = findings(directory)
    assert (found.kind, found.line, found.seq) == ("edited", 41, 40)
    assert "re-hashed" in found.message


def test_rewriting_the_whole_tail_needs_the_key_or_is_caught_by_the_anchor(
    tmp_path: Path,
) -> None:
    """The threat model: a plain chain can be recomputed from an edit to the end; an
    anchor kept elsewhere or a key stops that."""
    for key in (None, KEY):
        directory = tmp_path / ("keyed" if key else "plain")
        write_log(directory, 30, key=key)
        anchor = AuditReader(directory, key).head()
        (segment,) = AuditReader(directory, key).segments()
        lines = lines_of(segment)
        prev = json.loads(lines[9])["hash"]
        for i in range(10, len(lines)):  # rewrite from seq 10 on, re-chaining everything
            record = json.loads(lines[i])
            record.pop("hash")
            record["prev"] = prev
            if i == 10:
                record["path"] = "/innocent"
            lines[i] = reseal(record, None)  # the attacker has no key
            prev = json.loads(lines[i])["hash"]
        segment.write_text("".join(lines))
        report = AuditReader(directory, key).verify()
        if key is None:
            assert report.ok  # undetectable from the log alone: that is what anchors are for
            anchored = AuditReader(directory).verify(anchor)
            assert not anchored.ok
            assert anchored.findings[0].kind == "edited" and anchored.findings[0].seq == 30
        else:
            assert not report.ok and report.findings[0].kind == "edited"
            assert report.findings[0].line == 11


def test_a_keyed_log_needs_its_key_and_refuses_a_downgrade(tmp_path: Path) -> None:
    directory = tmp_path / "audit"
    write_log(directory, 10, key=KEY)
    assert AuditReader(directory, KEY).verify().ok
    with pytest.raises(ConfigError, match="keyed"):
        AuditReader(directory).verify()
    assert findings(directory, b"w" * 32)[0].kind == "edited"  # another key: nothing fits
    plain = tmp_path / "plain"
    write_log(plain, 10)
    assert findings(plain, KEY)[0].kind == "downgraded"


def test_a_removed_middle_segment_is_named(tmp_path: Path) -> None:
    directory = tmp_path / "audit"
    write_log(directory, 200, segment_size=2048)
    segments = AuditReader(directory).segments()
    gone = segments[2]
    first_gone = json.loads(lines_of(gone)[0])["first_seq"]
    after = json.loads(lines_of(segments[3])[0])["first_seq"]
    gone.unlink()
    (found,) = findings(directory)
    assert (found.kind, found.segment, found.line, found.seq) == (
        "removed", segments[3].name, 1, after,
    )  # fmt: skip
    assert f"seq {first_gone}..{after - 1} missing" in found.message
    segments[0].unlink()  # the oldest too: the start of the chain is gone
    assert [f.kind for f in findings(directory)] == ["removed", "removed"]


def test_a_torn_tail_is_a_crash_not_tampering_and_the_log_goes_on(tmp_path: Path) -> None:
    directory = tmp_path / "audit"
    write_log(directory, 40)
    (segment,) = AuditReader(directory).segments()
    with segment.open("r+b") as f:  # the last record, cut mid-line as a crash leaves it
        f.truncate(segment.stat().st_size - 30)
    report = AuditReader(directory).verify()
    (found,) = report.findings
    assert report.ok and found.kind == "torn" and found.line == 41  # header + 39 whole
    assert report.records == 39
    write_log(directory, 5)  # restart: a new segment, first a record of the recovery
    reader = AuditReader(directory)
    assert len(reader.segments()) == 2
    report = reader.verify()
    (found,) = report.findings
    assert report.ok and found.kind == "torn" and "recovered" in found.message
    records = list(reader.records())
    assert [r.seq for r in records] == list(range(1, 46))
    assert records[39].op == TORN_OP and records[39].result == "torn"
    # the same cut in a segment that is not the last, without a recovery record, is not
    # a crash: someone removed the end of the segment
    second = reader.segments()[1]
    lines = lines_of(second)
    second.write_text(lines[0] + "".join(lines[2:]))
    kinds = [f.kind for f in findings(directory)]
    assert "truncated" in kinds


def test_any_text_is_one_line_that_verifies(tmp_path: Path) -> None:
    odd = 'a "quoted"\nnew line, tab\t, backslash \\, ünïcödé, 🚀, \x00'
    directory = tmp_path / "audit"
    with AuditLog(directory, site="hub") as log:
        log.record(Principal(odd, site=odd, protocol=odd), odd, "/" + odd, odd, detail=odd)
        log.record(ALICE, "read", "/x" * 5000, "ok", detail="d" * 5000)  # cut, still one line
    (segment,) = AuditReader(directory).segments()
    assert len(lines_of(segment)) == 3
    first, long = AuditReader(directory).records()
    assert (first.user, first.site, first.op, first.path, first.detail) == (
        odd, odd, odd, "/" + odd, odd,
    )  # fmt: skip
    assert len(long.path) == len(long.detail) == 4096
    # the writer's fast encoding is exactly the canonical form a verifier could rebuild
    record = json.loads(lines_of(segment)[1])
    stored = record.pop("hash")
    assert reseal(record, None) == lines_of(segment)[1] and stored in lines_of(segment)[1]
    assert AuditReader(directory).verify().findings == []


def test_a_crash_while_rotating_is_torn_too(tmp_path: Path) -> None:
    directory = tmp_path / "audit"
    write_log(directory, 20)
    (directory / "audit-0000000000000021.jsonl").touch()  # created, header never written
    report = AuditReader(directory).verify()
    assert report.ok and [f.kind for f in report.findings] == ["torn"]
    write_log(directory, 3)
    report = AuditReader(directory).verify()
    assert report.ok and [f.kind for f in report.findings] == ["torn"]
    assert report.records == 24 and "recovered" in report.findings[0].message
    newest = AuditReader(directory).segments()[-1]
    assert newest.name == "audit-0000000000000021-1.jsonl"


def test_wrong_types_are_recorded_not_lost(tmp_path: Path) -> None:
    directory = tmp_path / "audit"
    with AuditLog(directory, site="hub") as log:
        log.record(ALICE, 7, "/p", None, nbytes="many")  # type: ignore[arg-type]
    (record,) = AuditReader(directory).records()
    assert (record.op, record.result, record.nbytes) == ("7", "None", -1)
    assert AuditReader(directory).verify().findings == []


def test_query_filters(tmp_path: Path) -> None:
    directory = tmp_path / "audit"
    with AuditLog(directory, site="hub") as log:
        log.record(ALICE, "read", "/datasets/eu/a.bin", "ok", nbytes=100)
        log.record(BOB, "read", "/datasets/eu/b.bin", "denied", detail="acl")
        log.flush()
        middle = AuditReader(directory).head()
        log.record(ALICE, "write", "/datasets/eu-other/c", "ok", nbytes=5)
        log.record(ALICE, "stat", "/datasets/eu", "NotFound")
    reader = AuditReader(directory)
    times = {r.seq: r.time_ns for r in reader.records()}

    def seqs(**filters: object) -> list[int]:
        return [r.seq for r in reader.query(**filters)]  # type: ignore[arg-type]

    assert seqs(user="alice") == [1, 3, 4]
    assert seqs(site="us-east") == [2]
    assert seqs(op="read") == [1, 2]
    assert seqs(result="denied") == [2]
    assert seqs(path_prefix="/datasets/eu") == [1, 2, 4]  # not /datasets/eu-other
    assert seqs(path_prefix="/datasets/eu/") == [1, 2, 4]
    assert seqs(since=times[3]) == [3, 4]
    assert seqs(until=times[3]) == [1, 2]
    assert seqs(user="alice", op="read", since=times[1], until=times[2] + 1) == [1]
    assert middle[0] == 2
    first = next(reader.query(user="alice"))
    assert (first.protocol, first.nbytes, first.path) == ("s3", 100, "/datasets/eu/a.bin")
    assert _cli(tmp_path / "elsewhere", "verify").returncode == 2  # no log there: said so


def test_query_since_skips_old_segments_and_misses_nothing(tmp_path: Path) -> None:
    directory = tmp_path / "audit"
    write_log(directory, 300, segment_size=2048)
    reader = AuditReader(directory)
    everything = list(reader.records())
    for r in everything[::37]:
        assert [x.seq for x in reader.query(since=r.time_ns)] == [
            x.seq for x in everything if x.time_ns >= r.time_ns
        ]


def test_kill_9_loses_nothing_acknowledged_and_the_log_goes_on(tmp_path: Path) -> None:
    """A process records as fast as it can and prints each seq once ``flush`` returned;
    it is killed mid-stream. Every printed seq is on disk; after a torn write (what a
    power cut adds to a kill), a restart reports it as torn and appends after it."""
    directory = tmp_path / "audit"
    child = (
        "import sys\n"
        "from loomfs.core.audit import AuditLog\n"
        "from loomfs.core.types import Principal\n"
        "log = AuditLog(__import__('pathlib').Path(sys.argv[1]), site='hub', batch_size=50,"
        " interval=0.01, segment_size=64 << 10).start()\n"
        "who = Principal('alice', site='eu', protocol='s3')\n"
        "i = 0\n"
        "while True:\n"
        "    for _ in range(37):\n"
        "        i += 1\n"
        "        log.record(who, 'read', f'/f/{i}', 'ok', nbytes=i)\n"
        "    print(log.flush(), flush=True)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", child, str(directory)],
        stdout=subprocess.PIPE, start_new_session=True, text=True,
    )  # fmt: skip
    acked = 0
    try:
        assert proc.stdout is not None
        while acked < 3000:
            line = proc.stdout.readline()
            assert line, "the writer died before it was killed"
            acked = int(line)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    reader = AuditReader(directory)
    report = reader.verify()
    assert report.ok and report.head_seq >= acked
    newest = reader.segments()[-1]
    with newest.open("ab") as f:  # the next batch's write, cut short
        f.write(b'{"detail":"","nbytes":1,"op":"re')
    with AuditLog(directory, site="hub") as log:
        log.record(BOB, "stat", "/after", "ok")
    report = AuditReader(directory).verify()
    assert report.ok
    assert [f.kind for f in report.findings] == ["torn"]
    seqs = [r.seq for r in AuditReader(directory).records()]
    assert seqs == list(range(1, len(seqs) + 1)) and len(seqs) >= acked + 2
    last_two = list(AuditReader(directory).records())[-2:]
    assert [r.op for r in last_two] == [TORN_OP, "stat"]


def _metric(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


async def test_many_tasks_and_threads_record_at_once(tmp_path: Path) -> None:
    directory = tmp_path / "audit"
    records, batches = _metric("loomfs_audit_records_total"), _metric("loomfs_audit_batches_total")
    flushes = _metric("loomfs_audit_flush_seconds_count")
    # a small buffer bound: recorders block on the writer instead of losing records
    log = AuditLog(directory, site="hub", batch_size=16, max_buffer=64).start()

    async def task(n: int) -> None:
        for i in range(200):
            log.record(Principal(f"task{n}"), "read", f"/t/{n}/{i}", "ok", detail=str(i))
            if i % 10 == 0:
                await asyncio.sleep(0)

    def thread(n: int) -> None:
        for i in range(500):
            log.record(Principal(f"thread{n}"), "write", f"/w/{n}/{i}", "ok", detail=str(i))

    threads = [threading.Thread(target=thread, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    await asyncio.gather(*(task(n) for n in range(50)))
    for t in threads:
        await asyncio.to_thread(t.join)
    log.close()
    with pytest.raises(BackendUnavailable):
        log.record(ALICE, "read", "/late", "ok")  # closed: refused, not dropped silently
    report = AuditReader(directory).verify()
    assert report.ok and report.findings == [] and report.records == 50 * 200 + 4 * 500
    assert _metric("loomfs_audit_records_total") - records == report.records
    written = _metric("loomfs_audit_batches_total") - batches
    assert 1 < written < report.records  # batched, one fsync for many records
    assert _metric("loomfs_audit_flush_seconds_count") - flushes == written
    per_writer: dict[str, list[int]] = {}
    for r in AuditReader(directory).records():
        per_writer.setdefault(r.user, []).append(int(r.detail))
    assert len(per_writer) == 54
    assert all(order == sorted(order) and len(set(order)) == len(order) for order in
               per_writer.values())  # fmt: skip


def test_a_full_disk_is_reported_never_silent(tiny_fs: Path) -> None:
    log = AuditLog(tiny_fs / "audit", site="hub", batch_size=100, max_buffer=1000).start()
    with pytest.raises(BackendUnavailable):
        for i in range(100_000):  # ~20 MiB of records into a 1 MiB file system
            log.record(ALICE, "read", f"/p/{i}", "ok", detail="x" * 200)
            if i % 500 == 0:
                log.flush()
    with pytest.raises(BackendUnavailable, match="could not be written"):
        log.close()
    report = AuditReader(tiny_fs / "audit").verify()
    assert report.ok and report.records > 0  # what was written is intact


def test_one_writer_per_directory(tmp_path: Path) -> None:
    with AuditLog(tmp_path / "audit", site="hub"), pytest.raises(ConfigError, match="another"):
        AuditLog(tmp_path / "audit", site="hub").start()


def test_bad_anchor_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="SEQ:HASH"):
        parse_anchor("12")
    assert parse_anchor(f"3:{'a' * 64}") == (3, "a" * 64)


async def test_the_hub_records_a_revoked_site_it_refuses(tmp_path: Path) -> None:
    config = Config.model_validate(
        {"site": {"data_dir": str(tmp_path / "hub")}, "hub": {"rescan_interval": 0}}
    )
    hub = HubService(config)
    await hub.start()
    runner = None
    try:
        assert hub.audit is not None and config.audit_dir == tmp_path / "hub" / "audit"
        hub_id = SiteIdentity.create(tmp_path / "hub-id", "hub")
        spoke = SiteIdentity.create(tmp_path / "spoke-id", "gpu-west")
        server = FabricServer(
            hub.namespace, hub, hub_id, {"gpu-west": spoke.cert_pem}, audit=hub.audit
        )
        runner = aiohttp.web.AppRunner(server.app())
        await runner.setup()
        site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server.ssl_context())
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        url = f"https://127.0.0.1:{port}/v1/stat/"
        context = spoke.client_context(hub_id.cert_pem)
        async with aiohttp.ClientSession() as session:
            async with session.get(url, ssl=context) as response:
                assert response.status == 200
            server.trust({})  # `loomfs site revoke gpu-west`
            async with session.get(url, ssl=context) as response:
                assert response.status == 401
    finally:
        if runner is not None:
            await runner.cleanup()
        await hub.stop()
    (denied,) = AuditReader(config.audit_dir).query(result="denied")
    assert (denied.op, denied.protocol, denied.path) == ("connect", "fabric", "/v1/stat/")
    assert denied.site.startswith("cert:") and "not trusted" in denied.detail
    assert AuditReader(config.audit_dir).verify().ok


def test_audit_can_be_off_and_a_started_log_must_not_be_dropped(tmp_path: Path) -> None:
    config = Config.model_validate(
        {"site": {"data_dir": str(tmp_path)}, "audit": {"enabled": False}}
    )
    assert HubService(config).audit is None
    never_started = AuditLog(tmp_path / "audit", site="hub")
    never_started.record(ALICE, "read", "/x", "ok")
    with pytest.raises(BackendUnavailable, match="before start"):
        never_started.flush()
    with pytest.raises(BackendUnavailable, match="never started"):
        never_started.close()


def _cli(
    data_dir: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, **(env or {}), "LOOMFS_SITE__DATA_DIR": str(data_dir)}
    environment.pop("LOOMFS_CONFIG", None)
    return subprocess.run(
        [sys.executable, "-m", "loomfs.cli", "audit", *args],
        env=environment, capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip


def test_cli_query_and_verify(tmp_path: Path) -> None:
    directory = tmp_path / "audit"  # the default: <data_dir>/audit
    write_log(directory, 30)
    result = _cli(tmp_path, "query", "--user", "alice", "--since", "1h", "--json")
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(rows) == 15 and {r["user"] for r in rows} == {"alice"}
    assert set(rows[0]) >= {"seq", "time_ns", "site", "protocol", "op", "path", "nbytes",
                            "result", "detail", "prev", "hash"}  # fmt: skip
    table = _cli(tmp_path, "query", "--user", "bob", "--op", "stat")
    assert table.returncode == 0 and "/data/" in table.stdout and "alice" not in table.stdout
    assert _cli(tmp_path, "query", "--since", "yesterday").returncode == 2
    head = _cli(tmp_path, "head").stdout.strip()
    verified = _cli(tmp_path, "verify", "--anchor", head)
    assert verified.returncode == 0 and "ok 30 records" in verified.stdout
    (segment,) = AuditReader(directory).segments()
    lines = lines_of(segment)
    lines[5] = lines[5].replace('"alice"', '"carol"')
    segment.write_text("".join(lines))
    broken = _cli(tmp_path, "verify")
    assert broken.returncode == 1
    assert f"edited: {segment.name} line 6 seq 5" in broken.stdout and "BROKEN" in broken.stdout


def test_cli_verifies_a_keyed_log_with_the_configured_key(tmp_path: Path) -> None:
    write_log(tmp_path / "audit", 10, key=KEY)
    unkeyed = _cli(tmp_path, "verify")
    assert unkeyed.returncode == 2 and "key_file" in " ".join(unkeyed.stderr.split())
    key_file = tmp_path / "audit.key"
    key_file.write_bytes(KEY)
    keyed = _cli(tmp_path, "verify", env={"LOOMFS_AUDIT__KEY_FILE": str(key_file)})
    assert keyed.returncode == 0, keyed.stdout + keyed.stderr
    key_file.write_bytes(b"short")
    short = _cli(tmp_path, "verify", env={"LOOMFS_AUDIT__KEY_FILE": str(key_file)})
    assert short.returncode == 2 and "too short" in " ".join(short.stderr.split())
