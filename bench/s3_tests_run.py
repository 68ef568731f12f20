"""ceph/s3-tests against the loomfs S3 gateway, and the result in docs/COMPATIBILITY.md (bench).

Fetches nothing: give it a checkout of https://github.com/ceph/s3-tests (kept outside this
repository) and a Python that has s3-tests' requirements installed. It starts a hub with
the gateway on a free port over a posix volume in a scratch directory (buckets made by
CreateBucket live below ``[s3] bucket_root``), registers the three users the suite signs
as with the keys its config names, writes that config with every section the suite reads,
runs the core selection of issue 7 plus ``test_headers.py`` (with ``--whole``: all of
``test_s3.py``, no selection, as issue 17 measures), and writes the pass rate, by feature
group with ``--whole``, and the reason of every failure.

    python bench/s3_tests_run.py --checkout /tmp/s3tests --python /tmp/s3tests-venv/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from loomfs.testing.s3gateway import s3_gateway_hub
from loomfs.testing.seaweedfs import SeaweedFS, find_weed

MARKERS = (
    "not (bucket_logging or bucket_logging_cleanup or lifecycle or lifecycle_expiration or "
    "lifecycle_transition or encryption or sse_s3 or bucket_encryption or bucket_policy or "
    "tagging or object_ownership or cloud_transition or cloud_restore or checksum or iam_user "
    "or iam_account or fails_on_aws or fails_on_rgw)"
)
KEYWORDS = (
    "not (version or object_lock or acl or cors or policy or website or sse or encryption or "
    "lifecycle or logging or tagging or ownership or torrent or append or restore or "
    "public_block or checksum or post_object or anon or select)"
)
# (section, user id, display name, access key, secret): as s3tests.conf.SAMPLE
USERS = (
    ("s3 main", "testid", "M. Tester", "0555b35654ad1656d804",
     "h7GhxuBLTrlhVUyxSPUKUV8r/2EI4ngqJxD7iBdBYLhwluN30JaT3Q=="),
    ("s3 alt", "johndoe", "john.doe", "NOPQRSTUVWXYZABCDEFG",
     "nopqrstuvwxyzabcdefghijklmnabcdefghijklm"),
    ("s3 tenant", "testx", "testx$tenanteduser", "HIJKLMNOPQRSTUVWXYZA",
     "opqrstuvwxyzabcdefghijklmnopqrstuvwxyzab"),
    ("iam", "iamuser", "youruseridhere", "ABCDEFGHIJKLMNOPQRST",
     "abcdefghijklmnopqrstuvwxyzabcdefghijklmn"),
    ("iam root", "RGW11111111111111111", "root1", "AAAAAAAAAAAAAAAAAAaa",
     "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"),
    ("iam alt root", "RGW22222222222222222", "root2", "BBBBBBBBBBBBBBBBBBbb",
     "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"),
)  # fmt: skip


LC_DAY_S = 5  # seconds a lifecycle "day" lasts in the suite and the hub

# Feature groups of the whole suite, by a word in the test's name: (word, group), first wins
GROUPS = (
    ("object_lock", "object lock"),
    ("versioning", "versioning"),
    ("version", "versioning"),
    ("lifecycle", "lifecycle"),
    ("policy", "bucket policy"),
    ("public_block", "public access block"),
    ("block_public", "public access block"),
    ("encrypt", "encryption (SSE)"),
    ("sse", "encryption (SSE)"),
    ("tagging", "tagging"),
    ("tags", "tagging"),
    ("cors", "CORS"),
    ("post_object", "POST object"),
    ("checksum", "checksums"),
    ("acl", "ACLs"),
    ("logging", "bucket logging"),
    ("ownership", "ownership controls"),
    ("multipart", "multipart"),
    ("copy", "copy"),
    ("list", "listing"),
    ("select", "S3 Select"),
    ("torrent", "torrent"),
    ("restore", "restore / cloud"),
    ("cloud", "restore / cloud"),
    ("iam", "IAM"),
)


def group_of(name: str) -> str:
    if name.startswith("headers:"):
        return "headers"
    lowered = name.lower()
    return next((group for word, group in GROUPS if word in lowered), "other objects and buckets")


# Why whole groups of tests fail: (pattern in the test name or failure, cause), first wins
WALK = (
    "a grant on an object lets its grantee list the bucket, showing that key only: the "
    "namespace shows the way down to a grant in a private tree, where S3 refuses "
    "ListObjects without READ on the bucket"
)
HOOKED = (
    "the suite sets or removes a header in a hook that runs before botocore signs, and "
    "signing replaces or adds it: the request arrives validly signed"
)
NAMES = (
    "the registry keeps no display names: an Owner's DisplayName is the user name, so the "
    "suite's grants, which it sorts by DisplayName, come in another order (or, with a group "
    "grantee, which has none, cannot be sorted)"
)
CAUSES = (
    ("logging", "bucket logging is not implemented (its tests first set a bucket policy "
     "with conditions, which the namespace's rules cannot express)"),
    ("test_access_bucket_private_object", WALK),
    ("100_continue", "Expect: 100-continue is answered once the signature checks: an "
     "anonymous PUT into a private bucket gets 100 and then AccessDenied, when the write "
     "reaches the namespace"),
    ("M. Tester", NAMES),
    ("'<' not supported between instances of 'NoneType'", NAMES),
    ("'FULL_CONTROL'", NAMES),
    ("prefix of this key is an object", "a key cannot be both an object and a prefix ('a' "
     "and 'a/b'): keys are paths in a file tree"),
    ("holds no data", "a key ending in '/' is a directory and cannot hold data"),
    ("Timeout", "the hub namespace holds a path's write lock while a body streams in; the "
     "test's single-threaded client starts a second PUT of the same key from inside the "
     "first and both wait for ever (separate clients are merely serialized)"),
    ("contentlength_none", "a body with chunked Transfer-Encoding and no Content-Length is "
     "accepted, since the core test_object_write_with_chunked_transfer_encoding needs it"),
    ("bad_authorization_", HOOKED),
    ("bad_date_none_aws2", HOOKED + " (a V2 signer sends Date, never x-amz-date)"),
    ("tenant", "RGW's tenants ('tenant:bucket' names) are not supported"),
    ("cannot be expressed", "a policy or ACL the namespace's access rules cannot express is "
     "refused (MalformedPolicy, or 501 for an ACL)"),
    ("MalformedPolicy", "a bucket policy the namespace's rules cannot express is refused: a "
     "Deny or an Allow for everyone of one action where the rules grant a set, an account "
     "principal, a resource outside the bucket"),
    ("ownership", "ownership controls are not kept (PutBucketOwnershipControls is 501)"),
    ("unordered", "RGW's allow-unordered listing extension"),
    ("x-rgw", "RGW's own usage statistics and headers"),
    ("usage", "RGW's own usage statistics and headers"),
    ("bucket_create_naming", "a bucket name S3 refuses (an IP address, '.-' or '-.') is "
     "accepted"),
    ("recreate", "CreateBucket of a bucket the caller owns succeeds, as AWS us-east-1 "
     "answers; RGW refuses it when it carries an ACL"),
    ("test_post_object", "an anonymous POST form with an acl field: setting an ACL needs "
     "admin on the path, which the anonymous writer of a public-read-write bucket lacks"),
    ("unicode_metadata", "metadata with non-ASCII characters comes back as its UTF-8 bytes "
     "read as Latin-1"),
    ("concurrent", "a concurrent create/remove race leaves a count one off"),
    ("sse_kms_no_key", "aws:kms without a key id uses the key store's default (as AWS uses "
     "aws/s3); RGW refuses it"),
    ("'BadDigest'", "a malformed checksum value is answered InvalidRequest (as AWS does) "
     "where the suite wants BadDigest"),
    ("if_match", "conditional DeleteObject(s) details: a condition on a key that is not "
     "there, DeleteObjects' per-object LastModifiedTime/Size"),
    ("x-amz-delete-marker", "a 404 without x-amz-delete-marker: false (fixed after the SSE "
     "run)"),
    ("torrent", "torrents are not served (501)"),
    ("stack_delete", "a DELETE where the key's newest version is a delete marker names that "
     "marker again; S3 stacks another"),
    ("unreadable", "a key of bytes that are no UTF-8 is answered 404 NoSuchKey; RGW refuses "
     "the URI (400)"),
    ("list_buckets_paginated", "ListBuckets with MaxBuckets: the caller's first listing was "
     "not empty (not looked into)"),
    ("email", "grants by e-mail address are not supported (501)"),
    ("object_attributes", "GetObjectAttributes of a version answers no VersionId"),
    ("acl", "other ACL details (several grantees in one x-amz-grant-* header, revoking "
     "every grant)"),
)  # fmt: skip


def cause_of(result: Result) -> str:
    text = f"{result.name} {result.reason}".lower()
    for pattern, cause in CAUSES:
        if pattern.lower() in text:
            return cause
    return "other (see the reason)"


@dataclass
class Result:
    name: str
    outcome: str  # passed, failed, error, skipped
    reason: str = ""


def write_suite_config(path: Path, host: str, port: int) -> None:
    lines = [
        "[DEFAULT]",
        f"host = {host}",
        f"port = {port}",
        "is_secure = False",
        "ssl_verify = False",
        "[fixtures]",
        "bucket prefix = loomfs-{random}-",
        "iam name prefix = s3-tests-",
        "iam path prefix = /s3-tests/",
    ]
    for section, user_id, display, key, secret in USERS:
        lines += [
            f"[{section}]",
            f"display_name = {display}",
            f"user_id = {user_id}",
            f"email = {user_id.lower()}@example.com",
            f"access_key = {key}",
            f"secret_key = {secret}",
            "api_name = default",
        ]
        if section == "s3 main":
            lines.append(f"lc_debug_interval = {LC_DAY_S}")
        if section == "s3 tenant":
            lines.append("tenant = testx")
    path.write_text("\n".join(lines) + "\n")


def parse_junit(path: Path) -> list[Result]:
    results = []
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        outcome, reason = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = {"failure": "failed"}.get(tag, tag)
                reason = _reason(node.get("message") or node.text or "")
                break
        results.append(Result(name, outcome, reason))
    return results


def _reason(message: str) -> str:
    """One line that says why: the S3 error code or the assertion, without addresses."""
    first = next((line.strip() for line in message.splitlines() if line.strip()), "")
    first = re.sub(r"0x[0-9a-f]+", "0x..", first)
    first = re.sub(r"loomfs-[a-z0-9]+-\d+", "BUCKET", first)
    return first[:300]


def run(
    checkout: Path,
    python: str,
    out: Path,
    scratch: Path,
    *,
    whole: bool = False,
    select: str | None = None,
    peer: str | None = None,
) -> list[Result]:
    """``select``: only the tests of test_s3.py this ``-k`` expression picks (a rerun of
    one feature's tests after a change; the report then covers those alone). ``peer``
    ("seaweedfs"): the same tests against that server at the same time (each run mostly
    waits on its server), and its pass rates beside loomfs's in the report."""
    if peer is None:
        results = run_loomfs(checkout, python, scratch, whole=whole, select=select)
        write_report(out, results, checkout, whole=whole)
        return results
    if peer != "seaweedfs":
        raise ValueError(f"unknown peer {peer!r}: only seaweedfs")
    (scratch / "loomfs").mkdir()
    (scratch / "peer").mkdir()
    with ThreadPoolExecutor(2) as pool:
        ours = pool.submit(
            run_loomfs, checkout, python, scratch / "loomfs", whole=whole, select=select
        )
        theirs = pool.submit(
            run_seaweedfs, checkout, python, scratch / "peer", whole=whole, select=select
        )
        results, peer_results = ours.result(), theirs.result()
    write_report(out, results, checkout, whole=whole, peer=peer_results)
    return results


def run_loomfs(
    checkout: Path, python: str, scratch: Path, *, whole: bool, select: str | None
) -> list[Result]:
    users = [(user_id, key, secret) for _, user_id, _, key, secret in USERS]
    # inotify off: the hub's subtree rescan of a directory that changed races writes in
    # flight into it (see docs/COMPATIBILITY.md); here the gateway is the only writer
    # a lifecycle "day" is the suite's lc_debug_interval (as RGW's rgw_lc_debug_interval;
    # 5 s, so that its longest wait, 7 days, fits the 60 s timeout), the rules run each second
    hub_config = (
        "[hub]\nrescan_interval = 0\nwatch = false\nlifecycle_interval = 1\n"
        'kms_keys = ["testkey-1", "testkey-2"]\n'
        f'lifecycle_day = {LC_DAY_S}\n[log]\nlevel = "WARNING"\n'
    )
    # unsigned requests are the anonymous caller: the suite reads public-read objects so
    with s3_gateway_hub(scratch, users, hub_config, "anonymous = true\n") as hub:
        return run_suite(checkout, python, scratch, hub.urls["s3"], whole=whole, select=select)


def run_seaweedfs(
    checkout: Path, python: str, scratch: Path, *, whole: bool, select: str | None
) -> list[Result]:
    """SeaweedFS as its own CI runs s3-tests: every suite user an identity with all
    rights, and its local KMS (which makes the suite's key ids on first use) for SSE."""
    users = [(user_id, key, secret) for _, user_id, _, key, secret in USERS]
    with SeaweedFS(startup_timeout=180.0, users=users, kms=True) as weed:
        return run_suite(checkout, python, scratch, weed.endpoint, whole=whole, select=select)


def run_suite(
    checkout: Path, python: str, scratch: Path, endpoint: str, *, whole: bool, select: str | None
) -> list[Result]:
    results: list[Result] = []
    host, port = endpoint.removeprefix("http://").rsplit(":", 1)
    conf = scratch / "s3tests.conf"
    write_suite_config(conf, host, int(port))
    env = {**os.environ, "S3TEST_CONF": str(conf)}
    core = ["s3tests/functional/test_s3.py"]
    if select is not None:
        core += ["-k", select]
    elif not whole:
        core += ["-m", MARKERS, "-k", KEYWORDS]
    suites = [("core", core)]
    if select is None:
        suites.append(("headers", ["s3tests/functional/test_headers.py"]))
    for name, args in suites:
        junit = scratch / f"{name}.xml"
        subprocess.run(
            [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}",
             "--timeout=60" if _has_timeout(python) else "-q", *args],
            cwd=checkout, env=env, check=False, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        results += [Result(f"{name}: {r.name}", r.outcome, r.reason) for r in parse_junit(junit)]
    return results


def _has_timeout(python: str) -> bool:
    probe = subprocess.run(
        [python, "-c", "import pytest_timeout"], capture_output=True, check=False
    )
    return probe.returncode == 0


def tally(results: list[Result], key: Callable[[Result], str]) -> dict[str, tuple[int, int]]:
    """(ran, passed) by ``key``: a skipped test did not run."""
    ran: Counter[str] = Counter()
    passed: Counter[str] = Counter()
    for r in results:
        if r.outcome != "skipped":
            ran[key(r)] += 1
            passed[key(r)] += r.outcome == "passed"
    return {k: (ran[k], passed[k]) for k in ran}


def _rate(ran: int, passed: int) -> str:
    return f"{100 * passed / ran:.1f}%" if ran else "-"


def write_report(
    out: Path,
    results: list[Result],
    checkout: Path,
    *,
    whole: bool = False,
    peer: list[Result] | None = None,
) -> None:
    commit = subprocess.run(
        ["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"],
        capture_output=True, text=True, check=False,
    ).stdout.strip() or "unknown"  # fmt: skip
    lines = [
        "# S3 compatibility: ceph/s3-tests against the loomfs gateway",
        "",
        f"Produced by `bench/s3_tests_run.py` against s3-tests commit `{commit}`: a hub with the",
        "gateway over a posix volume, buckets made by CreateBucket below `[s3] bucket_root`.",
        "The hub runs with `[hub] watch = false`: with inotify on, the hub re-imports a",
        "directory whose listing changed without the writer's per-path lock, and a PUT that is",
        "committing a new file into it then fails with AlreadyExists (a hub-layer race).",
        "The gateway runs with `[s3] anonymous = true`: the suite's unsigned requests are the",
        "anonymous caller, allowed what public-read and public-read-write ACLs give everyone.",
        "",
        *(
            ["The whole `s3tests/functional/test_s3.py` and `test_headers.py`, no selection."]
            if whole
            else [
                "Selection (issue 7): `s3tests/functional/test_s3.py` with",
                f"`-m '{MARKERS}'`",
                f"and `-k '{KEYWORDS}'`; plus `s3tests/functional/test_headers.py` in full.",
            ]
        ),
        *(
            [
                "",
                "With `--peer seaweedfs` the same tests ran at the same time against",
                f"`weed server -s3` ({_weed_version()}): every suite user (main, alt, tenant,",
                "IAM) an identity with all rights (Admin, Read, Write, List, Tagging, as",
                "SeaweedFS's own s3-tests CI), and its local KMS, which makes the suite's key",
                "ids on first use, so that SSE-KMS, SSE-S3 and bucket encryption are served.",
            ]
            if peer is not None
            else []
        ),
        "",
        "| set | tests | passed | failed | errors | skipped | pass rate |"
        + (" SeaweedFS ran | SeaweedFS passed | SeaweedFS pass rate |" if peer else ""),
        "|---|---|---|---|---|---|---|" + ("---|---|---|" if peer else ""),
    ]
    peer_sets = tally(peer or [], lambda r: r.name.split(":", 1)[0])
    for group in ("core", "headers"):
        rows = [r for r in results if r.name.startswith(group + ":")]
        counts = Counter(r.outcome for r in rows)
        ran = len(rows) - counts["skipped"]
        line = (
            f"| {group} | {len(rows)} | {counts['passed']} | {counts['failed']} | "
            f"{counts['error']} | {counts['skipped']} | {_rate(ran, counts['passed'])} |"
        )
        if peer is not None:
            peer_ran, peer_passed = peer_sets.get(group, (0, 0))
            line += f" {peer_ran} | {peer_passed} | {_rate(peer_ran, peer_passed)} |"
        lines.append(line)
    if peer is not None:
        ours_all = tally(results, lambda r: "all")["all"]
        theirs_all = tally(peer, lambda r: "all").get("all", (0, 0))
        lines += [
            "",
            f"All: loomfs {ours_all[1]} of {ours_all[0]} ({_rate(*ours_all)}), "
            f"SeaweedFS {theirs_all[1]} of {theirs_all[0]} ({_rate(*theirs_all)}).",
        ]
    if whole:
        lines += ["", "## By feature group", ""]
        by_group = tally(results, lambda r: group_of(r.name))
        order = sorted(by_group, key=lambda g: -by_group[g][0])
        if peer is None:
            lines += ["| group | ran | passed | pass rate |", "|---|---|---|---|"]
            for group in order:
                ran, passed = by_group[group]
                lines.append(f"| {group} | {ran} | {passed} | {_rate(ran, passed)} |")
        else:
            peer_groups = tally(peer, lambda r: group_of(r.name))
            lines += [
                "| group | loomfs ran | loomfs passed | loomfs rate | "
                "SeaweedFS ran | SeaweedFS passed | SeaweedFS rate | ahead |",
                "|---|---|---|---|---|---|---|---|",
            ]
            for group in [*order, *sorted(set(peer_groups) - set(by_group))]:
                ran, passed = by_group.get(group, (0, 0))
                peer_ran, peer_passed = peer_groups.get(group, (0, 0))
                ours = passed / ran if ran else 0.0
                theirs = peer_passed / peer_ran if peer_ran else 0.0
                ahead = "loomfs" if ours > theirs else "SeaweedFS" if theirs > ours else "even"
                lines.append(
                    f"| {group} | {ran} | {passed} | {_rate(ran, passed)} | {peer_ran} | "
                    f"{peer_passed} | {_rate(peer_ran, peer_passed)} | {ahead} |"
                )
    failures = [r for r in results if r.outcome in ("failed", "error")]
    lines += ["", "## Failures by cause", "", "| failures | cause |", "|---|---|"]
    by_cause = Counter(cause_of(r) for r in failures)
    lines += [f"| {n} | {cause} |" for cause, n in by_cause.most_common()]
    lines += ["", "## Why each failure fails", ""]
    for r in failures:
        lines.append(f"- `{r.name}` ({r.outcome}): {r.reason.replace('|', '/')}")
    out.write_text("\n".join(lines) + "\n")


def _weed_version() -> str:
    version = subprocess.run(
        [find_weed(), "version"], capture_output=True, text=True, check=False
    ).stdout.split()
    return f"SeaweedFS {version[2]}" if len(version) > 2 else "SeaweedFS"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkout", type=Path, required=True, help="ceph/s3-tests checkout")
    parser.add_argument("--python", required=True, help="a Python with s3-tests' requirements")
    parser.add_argument("--out", type=Path, default=Path("docs/COMPATIBILITY.md"))
    parser.add_argument("--whole", action="store_true", help="all of test_s3.py, no selection")
    parser.add_argument("--select", help="only the test_s3.py tests this -k expression picks")
    parser.add_argument(
        "--peer", choices=["seaweedfs"], help="the same tests against this server too"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="loomfs-s3tests-") as scratch:
        results = run(
            args.checkout.resolve(), args.python, args.out, Path(scratch),
            whole=args.whole or args.select is not None, select=args.select, peer=args.peer,
        )  # fmt: skip
    counts = Counter(r.outcome for r in results)
    print(json.dumps(counts), "->", args.out)


if __name__ == "__main__":
    main()
