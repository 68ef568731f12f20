"""The Kubernetes recipe's manifests (docs/kubernetes/): each checked against a JSON schema
of the fields it uses, the PersistentVolume's mountOptions against the options the guest
test mounts loomfs with, the objects against each other, and the spoke's config against
loomfs's own config loader."""

from __future__ import annotations

import configparser
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
import yaml  # type: ignore[import-untyped]

from loomfs.config import load_config
from test_guest_loomfs import NFS_OPTIONS

DOCS = Path(__file__).resolve().parents[1] / "docs" / "kubernetes"

_NAME = {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"}
_META = {"type": "object", "required": ["name"], "properties": {"name": _NAME, "namespace": _NAME}}
_STORAGE = {"type": "string", "pattern": "^[0-9]+(Ki|Mi|Gi|Ti|Pi)?$"}
_MODES = {"type": "array", "minItems": 1, "items": {"enum": ["ReadWriteMany", "ReadOnlyMany"]}}


def _object(kind: str, api: str, spec: dict[str, Any], extra: str = "spec") -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", extra],
        "properties": {
            "apiVersion": {"const": api},
            "kind": {"const": kind},
            "metadata": _META,
            extra: spec,
        },
    }


_CONTAINER = {
    "type": "object",
    "required": ["name", "image", "command", "volumeMounts"],
    "properties": {
        "name": _NAME,
        "image": {"type": "string", "pattern": ":"},  # a pinned tag
        "command": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "env": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "value"],
                "properties": {"name": {"type": "string"}, "value": {"type": "string"}},
            },
        },
        "volumeMounts": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "mountPath"],
                "properties": {
                    "name": _NAME,
                    "mountPath": {"type": "string", "pattern": "^/"},
                    "readOnly": {"type": "boolean"},
                },
            },
        },
    },
}
_VOLUME = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": _NAME,
        "persistentVolumeClaim": {
            "type": "object",
            "required": ["claimName"],
            "properties": {"claimName": _NAME},
        },
        "configMap": {"type": "object", "required": ["name"], "properties": {"name": _NAME}},
    },
    "minProperties": 2,
}
SCHEMAS: dict[str, dict[str, Any]] = {
    "PersistentVolume": _object(
        "PersistentVolume",
        "v1",
        {
            "type": "object",
            "required": ["capacity", "accessModes", "storageClassName", "mountOptions", "csi"],
            "properties": {
                "capacity": {
                    "type": "object",
                    "required": ["storage"],
                    "properties": {"storage": _STORAGE},
                },
                "accessModes": _MODES,
                "persistentVolumeReclaimPolicy": {"enum": ["Retain"]},
                "storageClassName": {"const": ""},
                "mountOptions": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]"}},
                "csi": {
                    "type": "object",
                    "required": ["driver", "volumeHandle", "volumeAttributes"],
                    "properties": {
                        "driver": {"const": "nfs.csi.k8s.io"},
                        "volumeHandle": {"type": "string", "minLength": 1},
                        "volumeAttributes": {
                            "type": "object",
                            "required": ["server", "share"],
                            "additionalProperties": False,
                            "properties": {
                                "server": {"type": "string", "minLength": 1},
                                "share": {"type": "string", "pattern": "^/"},
                            },
                        },
                    },
                },
            },
        },
    ),
    "PersistentVolumeClaim": _object(
        "PersistentVolumeClaim",
        "v1",
        {
            "type": "object",
            "required": ["accessModes", "storageClassName", "volumeName", "resources"],
            "properties": {
                "accessModes": _MODES,
                "storageClassName": {"const": ""},
                "volumeName": _NAME,
                "resources": {
                    "type": "object",
                    "required": ["requests"],
                    "properties": {
                        "requests": {
                            "type": "object",
                            "required": ["storage"],
                            "properties": {"storage": _STORAGE},
                        }
                    },
                },
            },
        },
    ),
    "ConfigMap": _object(
        "ConfigMap",
        "v1",
        {
            "type": "object",
            "minProperties": 1,
            "additionalProperties": {"type": "string"},
        },
        extra="data",
    ),
    "Job": _object(
        "Job",
        "batch/v1",
        {
            "type": "object",
            "required": ["template"],
            "properties": {
                "backoffLimit": {"type": "integer", "minimum": 0},
                "template": {
                    "type": "object",
                    "required": ["spec"],
                    "properties": {
                        "spec": {
                            "type": "object",
                            "required": ["restartPolicy", "containers", "volumes"],
                            "properties": {
                                "restartPolicy": {"enum": ["Never", "OnFailure"]},
                                "securityContext": {
                                    "type": "object",
                                    "properties": {
                                        "runAsUser": {"type": "integer"},
                                        "runAsGroup": {"type": "integer"},
                                    },
                                },
                                "containers": {"type": "array", "minItems": 1, "items": _CONTAINER},
                                "volumes": {"type": "array", "minItems": 1, "items": _VOLUME},
                            },
                        }
                    },
                },
            },
        },
    ),
}
HELM_VALUES = {
    "type": "object",
    "required": ["storageClass"],
    "properties": {
        "controller": {"type": "object", "properties": {"replicas": {"type": "integer"}}},
        "storageClass": {"type": "object", "properties": {"create": {"const": False}}},
    },
}


def _manifests() -> dict[str, list[dict[str, Any]]]:
    return {
        path.name: [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
        for path in sorted(DOCS.glob("*.yaml"))
        if path.name != "csi-driver-nfs-values.yaml"
    }


def _one(kind: str) -> dict[str, Any]:
    found = [doc for docs in _manifests().values() for doc in docs if doc["kind"] == kind]
    assert len(found) == 1, f"{len(found)} manifests of kind {kind}"
    return found[0]


@pytest.mark.parametrize("name", sorted(_manifests()))
def test_every_manifest_matches_the_schema_of_its_kind(name: str) -> None:
    docs = _manifests()[name]
    assert docs, f"{name} holds no object"
    for doc in docs:
        assert doc.get("kind") in SCHEMAS, f"{name}: no schema for kind {doc.get('kind')!r}"
        jsonschema.validate(doc, SCHEMAS[doc["kind"]])


def test_the_schemas_refuse_what_would_break_the_recipe() -> None:
    pv = _one("PersistentVolume")
    broken = {**pv, "spec": {**pv["spec"], "csi": {**pv["spec"]["csi"], "driver": "nfs"}}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, SCHEMAS["PersistentVolume"])
    job = _one("Job")
    pod = job["spec"]["template"]["spec"]
    unpinned = {**pod, "containers": [{**pod["containers"][0], "image": "pytorch/pytorch"}]}
    broken = {**job, "spec": {**job["spec"], "template": {"spec": unpinned}}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, SCHEMAS["Job"])


def test_the_helm_values_keep_the_volume_static() -> None:
    values = yaml.safe_load((DOCS / "csi-driver-nfs-values.yaml").read_text())
    jsonschema.validate(values, HELM_VALUES)


def test_the_volume_mounts_with_the_options_the_guest_test_mounts_loomfs_with() -> None:
    assert ",".join(_one("PersistentVolume")["spec"]["mountOptions"]) == NFS_OPTIONS


def test_the_claim_the_volume_and_the_job_refer_to_each_other() -> None:
    pv, pvc, job, scripts = (_one(k) for k in ("PersistentVolume", "PersistentVolumeClaim",
                                               "Job", "ConfigMap"))  # fmt: skip
    assert pvc["spec"]["volumeName"] == pv["metadata"]["name"]
    assert set(pvc["spec"]["accessModes"]) <= set(pv["spec"]["accessModes"])
    assert pvc["spec"]["resources"]["requests"]["storage"] == pv["spec"]["capacity"]["storage"]
    pod = job["spec"]["template"]["spec"]
    assert job["metadata"]["namespace"] == pvc["metadata"]["namespace"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    claims = [v["persistentVolumeClaim"]["claimName"] for v in volumes.values()
              if "persistentVolumeClaim" in v]  # fmt: skip
    assert claims == [pvc["metadata"]["name"]]
    maps = [v["configMap"]["name"] for v in volumes.values() if "configMap" in v]
    assert maps == [scripts["metadata"]["name"]]
    (container,) = pod["containers"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert set(mounts) == set(volumes)
    # the Job runs the script the ConfigMap carries, and it is Python that compiles
    script = Path(container["command"][-1])
    scripts_at = next(mounts[n] for n, v in volumes.items() if "configMap" in v)
    assert script.parent == Path(scripts_at)
    compile(scripts["data"][script.name], script.name, "exec")
    # it reads and checkpoints below the volume's mount
    env = {e["name"]: e["value"] for e in container["env"]}
    data_at = next(mounts[n] for n, v in volumes.items() if "persistentVolumeClaim" in v)
    assert all(Path(env[k]).is_relative_to(data_at) for k in ("DATA_DIR", "CHECKPOINT_DIR"))


def test_the_spoke_config_exports_the_share_on_the_port_for_the_jobs_uid() -> None:
    config = load_config(DOCS / "spoke.toml", env={})
    pv, job = _one("PersistentVolume"), _one("Job")
    share = pv["spec"]["csi"]["volumeAttributes"]["share"]
    assert share in config.nfs.exports
    assert config.spoke.attach == [share]
    assert config.nfs.listen is not None
    options = dict(o.partition("=")[::2] for o in pv["spec"]["mountOptions"])
    assert options["port"] == options["mountport"] == config.nfs.listen.rpartition(":")[2]
    uid = job["spec"]["template"]["spec"]["securityContext"]["runAsUser"]
    assert uid in config.nfs.uid_map


def test_the_systemd_unit_runs_the_spoke_with_that_config() -> None:
    unit = configparser.ConfigParser(interpolation=None, strict=False)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read(DOCS / "loomfs-spoke.service")
    service = unit["Service"]
    assert shlex.split(service["ExecStart"])[1:] == ["spoke", "serve"]
    assert service["Environment"] == "LOOMFS_CONFIG=/etc/loomfs/spoke.toml"
    assert "CAP_NET_BIND_SERVICE" in service["AmbientCapabilities"]
    assert unit["Install"]["WantedBy"] == "multi-user.target"


_SAMPLES = """
import pathlib, sys
import torch
root = pathlib.Path(sys.argv[1])
root.mkdir()
for i in range(20):
    torch.save((torch.randn(8), torch.tensor(float(i))), root / f"{i:03d}.pt")
"""


def test_the_jobs_script_trains_from_a_directory_and_checkpoints_into_it(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(_one("ConfigMap")["data"]["train.py"])
    subprocess.run([sys.executable, "-c", _SAMPLES, str(tmp_path / "train")], check=True)
    env = {
        **os.environ,
        "DATA_DIR": str(tmp_path / "train"),
        "CHECKPOINT_DIR": str(tmp_path / "checkpoints"),
        "EPOCHS": "2",
        "WORKERS": "0",
    }
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    epochs = [line.split()[:2] for line in done.stdout.splitlines()]
    assert epochs == [["epoch", "0"], ["epoch", "1"]]
    # only whole checkpoints under their final names; each loads back
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["epoch-0000.pt", "epoch-0001.pt"]
    load = "import sys, torch; print(sorted(torch.load(sys.argv[1])))"
    loaded = subprocess.run(
        [sys.executable, "-c", load, str(tmp_path / "checkpoints" / names[-1])],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert loaded.stdout.strip() == "['model', 'optimizer']"
