"""S3 bucket policies as the namespace's access rules: the translation against a small
reference evaluator of S3's semantics, and boto3 and REST callers against a hub."""

from __future__ import annotations

import asyncio
import fnmatch
import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import urllib3
from botocore import UNSIGNED
from botocore.config import Config
from botocore.exceptions import ClientError
from hypothesis import given, settings
from hypothesis import strategies as st

from loomfs.core.acl import AclPolicy, Rule
from loomfs.core.registry import open_catalog
from loomfs.core.types import Action, Principal
from loomfs.core.users import UserRegistry
from loomfs.protocols.s3 import policy
from loomfs.protocols.s3.errors import S3Error
from loomfs.rest import wire
from loomfs.testing.hubproc import HubProcess, cli_ok
from loomfs.testing.s3gateway import BUCKET_ROOT, gateway_client, s3_gateway_hub
from loomfs.testing.sftp import make_key, openssh_sftp, sftp_batch

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

BUCKET, FOLDER = "bkt", "/s3/bkt"
USERS = ("owner", "alice", "bob", "anonymous")
KEYS = ("k", "p/k", "p/q/r", "x/y")
OPS = {  # S3 action -> the namespace call it is, on the key's path (list: the bucket's)
    policy.GET: Action.READ,
    policy.PUT: Action.WRITE,
    policy.DELETE: Action.WRITE,
    policy.LIST: Action.LIST,
}
PRINCIPALS = [
    "*",
    {"AWS": "*"},
    {"AWS": "alice"},
    {"AWS": ["alice", "bob"]},
    {"AWS": "arn:aws:iam::123456789012:user/bob"},
    {"AWS": "arn:aws:iam::123456789012:root"},
    {"Service": "logging.s3.amazonaws.com"},
]
ACTIONS = [
    "s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:ListBucket", "s3:*", "s3:Get*",
    "s3:list*", "s3:GetObjectAcl", "iam:PassRole",
]  # fmt: skip
RESOURCES = [
    f"arn:aws:s3:::{r}"
    for r in ("bkt", "bkt/*", "bkt/p/*", "bkt/p/k", "other/*", "bkt/p*", "bkt/*/k", "*")
]


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _matches(stmt: dict[str, Any], user: str, action: str, resource: str) -> bool:
    """S3's matching of one statement, on its own terms (no namespace in it)."""
    principals = stmt["Principal"]
    names = ["*"] if principals == "*" else [n for v in principals.values() for n in _listed(v)]
    named = user != "anonymous" and any(n in (user, f"arn:aws:iam::123456789012:user/{user}")
                                          for n in names)  # fmt: skip
    who = "*" in names or named
    what = any(fnmatch.fnmatchcase(action.lower(), a.lower()) for a in _listed(stmt["Action"]))
    where = any(fnmatch.fnmatchcase(resource, r) for r in _listed(stmt["Resource"]))
    return who and what and where


def reference(doc: dict[str, Any], user: str, action: str, key: str) -> bool:
    """Explicit Deny wins, then an Allow; else only the bucket's owner."""
    resource = f"arn:aws:s3:::{BUCKET}" + ("" if action == policy.LIST else f"/{key}")
    statements = _listed(doc["Statement"])
    effects = {s["Effect"] for s in statements if _matches(s, user, action, resource)}
    if "Deny" in effects:
        return False
    return "Allow" in effects or user == "owner"


def effective(rules: list[Any], user: str, action: str, key: str) -> bool:
    owned = AclPolicy([Rule(FOLDER, "user:owner", Action.ADMIN, 0)], [FOLDER], policies=rules)
    path = FOLDER if action == policy.LIST else f"{FOLDER}/{key}"
    return owned.allows(Principal(user, protocol="s3"), OPS[action], path)


statement = st.fixed_dictionaries(
    {
        "Effect": st.sampled_from(["Allow", "Deny"]),
        "Principal": st.sampled_from(PRINCIPALS),
        "Action": st.lists(st.sampled_from(ACTIONS), min_size=1, max_size=3, unique=True),
        "Resource": st.lists(st.sampled_from(RESOURCES), min_size=1, max_size=3, unique=True),
    },
    optional={"Condition": st.just({"Bool": {"aws:SecureTransport": "true"}})},
)


# statements the rules can say more often than not, so that accepted policies are many
expressible = st.fixed_dictionaries(
    {
        "Effect": st.sampled_from(["Allow", "Deny"]),
        "Principal": st.sampled_from(PRINCIPALS[:5]),
        "Action": st.sampled_from(
            [["s3:ListBucket"], ["s3:GetObject"], ["s3:PutObject", "s3:DeleteObject"], ["s3:*"],
             ["s3:Get*", "s3:ListBucket"], ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"]]
        ),
        "Resource": st.sampled_from(
            [["arn:aws:s3:::bkt", "arn:aws:s3:::bkt/*"], ["arn:aws:s3:::bkt/*"],
             ["arn:aws:s3:::bkt/p/*"], ["arn:aws:s3:::bkt/p/k"], ["arn:aws:s3:::bkt"]]
        ),
    }
)  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.one_of(expressible, expressible, statement), min_size=1, max_size=4),
    st.booleans(),
)
def test_a_policy_is_refused_or_decides_as_s3_would(
    statements: list[dict[str, Any]], listed: bool
) -> None:
    """``listed``: everyone may list the bucket too (what reads and puts below need)."""
    listing = _allow("*", ["s3:ListBucket"], ["bkt"])
    doc = {"Version": "2012-10-17", "Statement": [listing] * listed + statements}
    try:
        kept, rules = policy.translate(json.dumps(doc).encode(), BUCKET, FOLDER)
    except S3Error as exc:
        assert exc.code == "MalformedPolicy" and exc.status == 400
        return
    assert json.loads(kept) == doc
    for user in USERS:
        for action in OPS:
            for key in KEYS:
                want = reference(doc, user, action, key)
                assert effective(rules, user, action, key) == want, (user, action, key)


def _doc(*statements: dict[str, Any]) -> bytes:
    return json.dumps({"Version": "2012-10-17", "Statement": list(statements)}).encode()


def _allow(principal: Any, actions: list[str], resources: list[str], **more: Any) -> dict[str, Any]:
    return {"Effect": "Allow", "Principal": principal, "Action": actions,
            "Resource": [f"arn:aws:s3:::{r}" for r in resources], **more}  # fmt: skip


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (_doc(_allow("*", ["s3:GetObject"], ["bkt/*"], Condition={})), "Condition"),
        (_doc({**_allow("*", ["s3:GetObject"], ["bkt/*"]), "NotPrincipal": "*"}), "NotPrincipal"),
        (_doc(_allow("*", ["s3:GetObject"], ["other/*"])), "outside the bucket"),
        (_doc(_allow("*", ["s3:GetObject"], ["bkt/a*c"])), "wildcard"),
        (_doc(_allow("*", ["s3:GetObject"], ["bkt/pre*"])), "must end at a '/'"),
        (_doc(_allow("*", ["s3:GetObject"], ["bkt/*"])), "ListBucket"),
        (_doc(_allow("*", ["s3:ListBucket", "s3:PutObject"], ["bkt", "bkt/*"])), "DeleteObject"),
        (_doc(_allow("*", ["s3:GetObjectAcl"], ["bkt/*"])), "cannot be expressed"),
        (_doc(_allow("*", ["s3:ListBucket"], ["bkt/*"])), "does not apply"),
        (_doc(_allow({"AWS": "arn:aws:iam::123456789012:root"}, ["s3:*"], ["bkt"])), "user ARNs"),
        (_doc(_allow({"AWS": "123456789012"}, ["s3:ListBucket"], ["bkt"])), "user ARNs"),
        (_doc(_allow("*", ["s3:GetObject"], ["bkt/home/${aws:username}"])), "variable"),
        (_doc(_allow("*", ["s3:GetObject"], ["bkt/"])), "empty key"),
        (b'{"Version": "2012-10-17", "Statement": [', "not JSON"),
        (json.dumps({"Version": "2011-01-01", "Statement": []}).encode(), "Version"),
        (b"x" * (policy.MAX_SIZE + 1), "at most"),
    ],
)
def test_what_the_rules_cannot_say_is_refused_saying_why(body: bytes, says: str) -> None:
    with pytest.raises(S3Error) as err:
        policy.translate(body, BUCKET, FOLDER)
    assert err.value.code == "MalformedPolicy" and says in str(err.value)


# -- over S3 and REST, against a hub ----------------------------------------------------------


def _credentials(user: str) -> tuple[str, str]:
    return f"{user}key".upper().ljust(16, "X"), f"{user}-secret".ljust(16, "x")


class Hub:
    def __init__(self, hub: HubProcess, tmp: Path) -> None:
        self.hub, self.http, self.tmp = hub, urllib3.PoolManager(), tmp

    def s3(self, user: str) -> S3Client:
        if user == "anonymous":
            import boto3  # noqa: PLC0415

            return boto3.client(
                "s3", endpoint_url=self.hub.urls["s3"], region_name="us-east-1",
                config=Config(signature_version=UNSIGNED, retries={"max_attempts": 1},
                              s3={"addressing_style": "path"}),
            )  # fmt: skip
        return gateway_client(self.hub.urls["s3"], *_credentials(user))

    def sftp_get(self, user: str, key: str) -> bytes | None:
        """The object's bytes read over SFTP as ``user`` (OpenSSH's client), None if refused."""
        got = self.tmp / "got"
        got.unlink(missing_ok=True)
        port = int(self.hub.urls["sftp"].rpartition(":")[2])
        get = f"get {BUCKET_ROOT}/{BUCKET}/{key} {got}\n"
        done = sftp_batch(port, user, self.tmp / "keys" / user, get, cwd=self.tmp)
        return got.read_bytes() if done.returncode == 0 else None

    def rest(self, user: str, method: str, key: str, body: bytes | None = None) -> int:
        auth = {"Authorization": wire.basic_authorization(*_credentials(user))}
        url = f"{self.hub.url}/v1/files{BUCKET_ROOT}/{BUCKET}/{key}"
        return self.http.request(method, url, body=body, headers=auth).status


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[Hub]:
    openssh_sftp()  # fails with how to install it
    users = [(u, *_credentials(u)) for u in ("owner", "alice", "bob")]
    sftp = '[sftp]\nlisten = "127.0.0.1:0"\nroot = "/"\n'
    with s3_gateway_hub(tmp_path, users, sftp, "anonymous = true\n") as running:
        asyncio.run(_ssh_keys(tmp_path, [u for u, _, _ in users]))
        yield Hub(running, tmp_path)


async def _ssh_keys(tmp: Path, users: list[str]) -> None:
    (tmp / "keys").mkdir()
    catalog = open_catalog(f"sqlite://{tmp / 'hub' / 'catalog.db'}")
    await catalog.open()
    try:
        for user in users:
            await UserRegistry(catalog).add_ssh_key(user, make_key(tmp / "keys" / user))
    finally:
        await catalog.close()


def _code(call: Any, **kwargs: Any) -> str:
    with pytest.raises(ClientError) as err:
        call(**kwargs)
    return str(err.value.response["Error"]["Code"])


def test_a_bucket_policy_is_enforced_over_s3_and_rest_and_replaced_whole(hub: Hub) -> None:
    owner, alice, bob, anonymous = (hub.s3(u) for u in USERS)
    owner.create_bucket(Bucket=BUCKET)
    owner.put_object(Bucket=BUCKET, Key="pub/k", Body=b"public")
    owner.put_object(Bucket=BUCKET, Key="pub/secret/s", Body=b"hidden")
    assert _code(owner.get_bucket_policy, Bucket=BUCKET) == "NoSuchBucketPolicy"
    assert _code(anonymous.get_object, Bucket=BUCKET, Key="pub/k") == "AccessDenied"
    first = _doc(
        _allow("*", ["s3:ListBucket"], ["bkt"]),
        _allow("*", ["s3:GetObject"], ["bkt/pub/*"]),
        _allow({"AWS": "alice"}, ["s3:PutObject", "s3:DeleteObject"], ["bkt/*"]),
        {"Effect": "Deny", "Principal": {"AWS": ["alice", "bob"]}, "Action": "s3:GetObject",
         "Resource": "arn:aws:s3:::bkt/pub/secret/*"},
    )  # fmt: skip
    assert _code(bob.put_bucket_policy, Bucket=BUCKET, Policy=first.decode()) == "AccessDenied"
    assert not owner.get_bucket_policy_status(Bucket=BUCKET)["PolicyStatus"]["IsPublic"]
    owner.put_bucket_policy(Bucket=BUCKET, Policy=first.decode())
    assert owner.get_bucket_policy(Bucket=BUCKET)["Policy"] == first.decode()
    assert owner.get_bucket_policy_status(Bucket=BUCKET)["PolicyStatus"]["IsPublic"]
    assert anonymous.get_object(Bucket=BUCKET, Key="pub/k")["Body"].read() == b"public"
    assert _code(bob.get_object, Bucket=BUCKET, Key="pub/secret/s") == "AccessDenied"
    alice.put_object(Bucket=BUCKET, Key="drop", Body=b"from alice")
    assert _code(bob.put_object, Bucket=BUCKET, Key="drop", Body=b"x") == "AccessDenied"
    # the same rules over REST: the Deny holds there too, and alice's put
    assert hub.rest("bob", "GET", "pub/k") == 200
    assert hub.rest("bob", "GET", "pub/secret/s") == 403
    assert hub.rest("alice", "GET", "pub/secret/s") == 403
    assert hub.rest("bob", "PUT", "rest-drop", b"x") == 403
    assert hub.rest("alice", "PUT", "rest-drop", b"x") in (200, 201, 204)
    assert hub.sftp_get("bob", "pub/k") == b"public"
    assert hub.sftp_get("bob", "pub/secret/s") is None
    # refused: nothing changes, the old document and rules stay
    bad = _doc(_allow("*", ["s3:GetObject"], ["bkt/*"], Condition={"Bool": {}}))
    assert _code(owner.put_bucket_policy, Bucket=BUCKET, Policy=bad.decode()) == "MalformedPolicy"
    assert owner.get_bucket_policy(Bucket=BUCKET)["Policy"] == first.decode()
    assert hub.rest("bob", "GET", "pub/secret/s") == 403
    # replaced whole: the Deny and alice's put go, bob's read of everything comes
    second = _doc(_allow({"AWS": "bob"}, ["s3:ListBucket", "s3:GetObject"], ["bkt", "bkt/*"]))
    owner.put_bucket_policy(Bucket=BUCKET, Policy=second.decode())
    assert not owner.get_bucket_policy_status(Bucket=BUCKET)["PolicyStatus"]["IsPublic"]
    assert bob.get_object(Bucket=BUCKET, Key="pub/secret/s")["Body"].read() == b"hidden"
    assert hub.sftp_get("bob", "pub/secret/s") == b"hidden"
    assert _code(anonymous.get_object, Bucket=BUCKET, Key="pub/k") == "AccessDenied"
    assert _code(alice.put_object, Bucket=BUCKET, Key="drop", Body=b"x") == "AccessDenied"
    assert hub.rest("alice", "PUT", "rest-drop", b"y") == 403
    owner.delete_bucket_policy(Bucket=BUCKET)
    assert _code(owner.get_bucket_policy, Bucket=BUCKET) == "NoSuchBucketPolicy"
    assert _code(bob.get_object, Bucket=BUCKET, Key="pub/k") == "AccessDenied"
    assert hub.rest("bob", "GET", "pub/k") == 403
    # every change is in the audit log, the refused ones too
    audited = [
        (r["user"], r["op"], r["result"])
        for line in cli_ok(hub.hub.data_dir, "audit", "query", "--json").splitlines()
        if (r := json.loads(line))["op"] in ("set_policy", "delete_policy")
    ]
    assert audited == [
        ("bob", "set_policy", "denied"),
        ("owner", "set_policy", "ok"),
        ("owner", "set_policy", "ok"),
        ("owner", "delete_policy", "ok"),
    ]


def test_a_deny_of_everything_binds_the_owner_but_not_the_policy(hub: Hub) -> None:
    owner = hub.s3("owner")
    owner.create_bucket(Bucket=BUCKET)
    owner.put_object(Bucket=BUCKET, Key="k", Body=b"mine")
    everything = _doc({"Effect": "Deny", "Principal": "*", "Action": "s3:*",
                       "Resource": ["arn:aws:s3:::bkt", "arn:aws:s3:::bkt/*"]})  # fmt: skip
    owner.put_bucket_policy(Bucket=BUCKET, Policy=everything.decode())
    assert _code(owner.get_object, Bucket=BUCKET, Key="k") == "AccessDenied"
    assert hub.rest("owner", "GET", "k") == 403
    owner.delete_bucket_policy(Bucket=BUCKET)
    assert owner.get_object(Bucket=BUCKET, Key="k")["Body"].read() == b"mine"
    # a policy goes with its bucket: one made anew under that name has none
    owner.put_bucket_policy(
        Bucket=BUCKET, Policy=_doc(_allow("*", ["s3:ListBucket"], ["bkt"])).decode()
    )
    owner.delete_object(Bucket=BUCKET, Key="k")
    owner.delete_bucket(Bucket=BUCKET)
    owner.create_bucket(Bucket=BUCKET)
    assert _code(owner.get_bucket_policy, Bucket=BUCKET) == "NoSuchBucketPolicy"
    assert _code(hub.s3("anonymous").list_objects, Bucket=BUCKET) == "AccessDenied"
