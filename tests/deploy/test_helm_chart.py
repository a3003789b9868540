"""The Helm chart renders (`helm template`) with the default values, with engine.kind=vllm and
with every optional object switched on, and every manifest validates: core kinds against the
Kubernetes schemas (kubernetes-validate), custom resources (InferencePool, InferenceObjective,
ServiceMonitor) against their API's schema. The rendered objects agree with the code: commands
parse, the database password is wired, the objectives' priorities are the tiers'."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from crd_schemas import BY_KIND
from helm_render import RELEASE, render, renderer

from gateway.cli import build_parser
from tenancy.priority import objective_priorities
from tenancy.settings import TenancySettings

K8S_VERSION = "1.32.0"  # the kubectl client here; the chart uses no API newer than 1.23
ALL_ON = {
    "gateway": {"ingress": {"enabled": True, "tlsSecret": "tls"}, "pdb": {"enabled": True}},
    "engine": {"autoscaling": {"enabled": True}, "pdb": {"enabled": True}},
    "serviceMonitor": {"enabled": True},
    "inferenceExtension": {"enabled": True},
}
VLLM = {"engine": {"kind": "vllm"}}
ALL_ON_VLLM = {**ALL_ON, "engine": {**ALL_ON["engine"], "kind": "vllm"}}


@pytest.fixture(scope="module", autouse=True)
def _helm() -> None:
    how = renderer()
    if how is None:
        pytest.skip("no helm binary on PATH and helm-python-sdk is not installed (`make install`)")
    print(f"rendering with the {how}")


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def validate(docs: list[dict[str, Any]]) -> None:
    for doc in docs:
        schema = BY_KIND.get((doc["apiVersion"], doc["kind"]))
        if schema is not None:
            jsonschema.validate(doc, schema)
        else:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


@pytest.mark.parametrize(
    "values",
    [{}, VLLM, ALL_ON, ALL_ON_VLLM],
    ids=["default", "vllm", "all-on", "all-on-vllm"],
)
def test_every_manifest_validates(values: dict[str, Any]) -> None:
    docs = render(values)
    kinds = {d["kind"] for d in docs}
    assert {"ConfigMap", "Deployment", "StatefulSet", "Service", "Job"} <= kinds
    validate(docs)
    optional = {"Ingress", "PodDisruptionBudget", "HorizontalPodAutoscaler", "ServiceMonitor",
                "InferencePool", "InferenceObjective"}  # fmt: skip
    assert (optional <= kinds) == (values.get("serviceMonitor") is not None)
    assert not (optional & kinds) or values.get("serviceMonitor") is not None


def test_a_broken_manifest_is_caught() -> None:
    """The validation can fail: a misspelled field and a bad port are refused."""
    docs = render(ALL_ON)
    pool = by_kind(docs, "InferencePool")[0]
    pool["spec"]["targetPorts"] = [{"number": 70000}]
    with pytest.raises(jsonschema.ValidationError):
        validate([pool])
    deployment = by_kind(docs, "Deployment")[0]
    deployment["spec"]["replicaz"] = 2
    with pytest.raises(kubernetes_validate.ValidationError):
        validate([deployment])


def _env(container: dict[str, Any]) -> list[dict[str, Any]]:
    return list(container.get("env", []))


def test_the_database_password_is_wired_from_the_secret() -> None:
    docs = render({})
    pods = [*by_kind(docs, "Deployment"), *by_kind(docs, "Job")]
    assert len(pods) == 2  # the gateways and the migration job
    for pod in pods:
        env = _env(pod["spec"]["template"]["spec"]["containers"][0])
        names = [e["name"] for e in env]
        password = env[names.index("DATABASE_PASSWORD")]
        assert password["valueFrom"]["secretKeyRef"] == {
            "name": "loragate-secrets", "key": "database-password", "optional": True}  # fmt: skip
        url = env[names.index("LORAGATE_DATABASE_URL")]
        # Kubernetes expands $(DATABASE_PASSWORD) only from a variable defined before it.
        assert names.index("DATABASE_PASSWORD") < names.index("LORAGATE_DATABASE_URL")
        assert "$(DATABASE_PASSWORD)@" in url["value"]
    configmap = by_kind(docs, "ConfigMap")[0]
    assert "LORAGATE_DATABASE_URL" not in configmap["data"]  # the env var is the one source


def _engine(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return by_kind(docs, "StatefulSet")[0]["spec"]["template"]["spec"]["containers"][0]


def test_the_engine_command_follows_engine_kind() -> None:
    ours = render({})
    engine = _engine(ours)
    assert "command" not in engine and engine["args"][0] == "engine"
    build_parser().parse_args(engine["args"])  # loragate's own CLI takes it
    assert by_kind(ours, "ConfigMap")[0]["data"]["LORAGATE_ENGINE_KIND"] == "loragate"
    theirs = render(VLLM)
    engine = _engine(theirs)
    assert engine["command"][:3] == ["vllm", "serve", "/models/tiny"]
    for flag in ("--enable-scale-out", "--enable-lora", "--enable-prompt-tokens-details"):
        assert flag in engine["command"]
    # structured outputs need vLLM's tokenizer, which --tokens-only drops
    assert "--tokens-only" not in engine["command"]
    config = engine["command"].index("--structured-outputs-config")
    assert json.loads(engine["command"][config + 1]) == {
        "backend": "guidance",
        "disable_any_whitespace": True,
    }
    policy = engine["command"].index("--scheduling-policy")
    assert engine["command"][policy + 1] == "priority"
    assert {"name": "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "value": "True"} in engine["env"]
    assert by_kind(theirs, "ConfigMap")[0]["data"]["LORAGATE_ENGINE_KIND"] == "vllm"
    with pytest.raises(Exception, match=r"engine\.kind"):
        render({"engine": {"kind": "sglang"}})


def test_objectives_carry_the_tiers_priorities_and_the_pool_selects_the_engines() -> None:
    docs = render(ALL_ON)
    defaults = TenancySettings.model_fields
    tiers = defaults["tiers"].get_default(call_default_factory=True)
    expected = objective_priorities(tiers, defaults["default_tier"].default)
    objectives = {d["metadata"]["name"]: d["spec"] for d in by_kind(docs, "InferenceObjective")}
    assert objectives == {
        f"{RELEASE}-{tier}": {"priority": p, "poolRef": {"name": f"{RELEASE}-engines"}}
        for tier, p in expected.items()
    }
    pool = by_kind(docs, "InferencePool")[0]["spec"]
    engine_labels = by_kind(docs, "StatefulSet")[0]["spec"]["template"]["metadata"]["labels"]
    assert pool["selector"]["matchLabels"] == engine_labels
    assert pool["targetPorts"] == [{"number": 8100}]
    # With the extension, the gateways send to the inference gateway, not to engines directly,
    # and name each request's objective: the prefix plus the tier is an objective's name.
    data = by_kind(docs, "ConfigMap")[0]["data"]
    assert data["LORAGATE_ENGINE_URLS"] == '["http://inference-gateway:80"]'
    assert {data["LORAGATE_ENGINE_OBJECTIVE_PREFIX"] + t for t in expected} == set(objectives)
    assert "LORAGATE_ENGINE_OBJECTIVE_PREFIX" not in by_kind(render({}), "ConfigMap")[0]["data"]


def test_autoscaling_on_queue_depth_lists_every_ordinal() -> None:
    docs = render({"engine": {"autoscaling": {"enabled": True, "maxReplicas": 5}}})
    hpa = by_kind(docs, "HorizontalPodAutoscaler")[0]["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "StatefulSet",
                                     "name": f"{RELEASE}-engine"}  # fmt: skip
    assert hpa["metrics"][0]["pods"]["metric"]["name"] == "vllm_num_requests_waiting"
    urls = by_kind(docs, "ConfigMap")[0]["data"]["LORAGATE_ENGINE_URLS"]
    assert urls.count("http://") == 5 and f"{RELEASE}-engine-4.{RELEASE}-engine" in urls


@pytest.mark.parametrize("values", [{}, VLLM], ids=["loragate", "vllm"])
def test_no_shared_adapter_volume_engines_fetch_from_the_gateway(values: dict[str, Any]) -> None:
    """Issue 44: adapters live in the database; engines fetch them from the gateway Service with
    the engine token into a cache on an emptyDir. No PVC, no volume shared by pods for them."""
    docs = render(values)
    assert by_kind(docs, "PersistentVolumeClaim") == []
    claims = set()
    for kind in ("Deployment", "StatefulSet", "Job"):
        for doc in by_kind(docs, kind):
            for volume in doc["spec"]["template"]["spec"].get("volumes", []):
                if "persistentVolumeClaim" in volume:
                    claims.add(volume["persistentVolumeClaim"]["claimName"])
                else:
                    assert "emptyDir" in volume, volume
    assert claims == {"loragate-models"}  # the checkpoint, read-only; nothing for adapters
    engine_pod = by_kind(docs, "StatefulSet")[0]["spec"]["template"]["spec"]
    assert {"name": "adapter-cache", "emptyDir": {"sizeLimit": "5Gi"}} in engine_pod["volumes"]
    gateway = next(d for d in by_kind(docs, "Service") if d["metadata"]["name"].endswith("gateway"))
    source = f"http://{gateway['metadata']['name']}:{gateway['spec']['ports'][0]['port']}"
    engine = _engine(docs)
    env = {e["name"]: e for e in engine.get("env", [])}
    assert "secretKeyRef" in env["LORAGATE_ENGINE_ADMIN_TOKEN"]["valueFrom"]
    if values:  # vLLM: the resolver plugin reads its settings from the environment
        assert env["LORAGATE_ADAPTER_SOURCE"]["value"] == source
    else:
        args = engine["args"]
        assert args[args.index("--adapter-source") + 1] == source
        assert args[args.index("--adapter-cache-dir") + 1] == "/cache/adapters"
        build_parser().parse_args(args)
    assert by_kind(docs, "ConfigMap")[0]["data"]["LORAGATE_ADAPTER_STORE"] == "database"
