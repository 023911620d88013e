"""The Kubernetes manifest (docs/kubernetes/gpumemhook-exporter.yaml) against the Kubernetes API's own
schema, field by field (kubernetes-validate, which carries the schemas of every Kubernetes release,
in strict mode: a misspelt or misplaced field is an error), and what docs/exporter.md says of it:
workload pods need no host pid namespace (issue 51), the exporter keeps it.
"""

from __future__ import annotations

import copy

import kubernetes_validate
import pytest
import yaml

from conftest import ROOT

MANIFEST = ROOT / "docs" / "kubernetes" / "gpumemhook-exporter.yaml"


def _objects() -> list:
    return [o for o in yaml.safe_load_all(MANIFEST.read_text()) if o]


def _validate(obj: dict) -> None:
    kubernetes_validate.validate(obj, kubernetes_validate.latest_version(), strict=True)


@pytest.mark.parametrize("obj", _objects(), ids=lambda o: "{}/{}".format(o["kind"], o["metadata"]["name"]))
def test_every_object_of_the_manifest_is_valid_against_the_kubernetes_schema(obj):
    _validate(obj)


def test_the_schema_check_refuses_a_misspelt_field():
    pod = copy.deepcopy(next(o for o in _objects() if o["kind"] == "Pod"))
    pod["spec"]["hostPid"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate(pod)


def test_no_workload_pod_asks_for_the_hosts_pid_namespace_and_the_exporter_does():
    objects = _objects()
    pods = [o for o in objects if o["kind"] == "Pod"]
    assert pods, "the manifest shows a workload"
    assert [p["metadata"]["name"] for p in pods if p["spec"].get("hostPID")] == []
    exporter = next(o for o in objects if o["kind"] == "DaemonSet")
    assert exporter["spec"]["template"]["spec"]["hostPID"] is True
