"""The Kubernetes deployment under k8s/: rendered with `kubectl kustomize`, checked offline.

No cluster is needed. Every kustomization (the base and each overlay) is rendered once;
every object is validated against the Kubernetes schemas (kubernetes-validate, strict) or,
for KEDA's custom resources, against the minimal schemas vendored in `schemas/`. The other
tests read the rendered objects and assert the design: GPUs and taints, grace periods that
outlast a trial, Secrets referenced rather than inlined, who may reach Redis and PostgreSQL,
the autoscaler watching the queue the workers consume, pinned images, non-root pods.

Without kubectl the tests are skipped, except in CI (CI=true), where they fail.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import socket
import subprocess
import tomllib
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import kubernetes_validate
import pytest
import yaml
from waiting import wait_for_redis

from trialq.gpu.mps import pinned_limits
from trialq.wire.keys import queue_running_key

Obj = dict[str, Any]

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "k8s"
SCHEMAS = Path(__file__).resolve().parent / "schemas"

GPU_OVERLAYS = ("gke", "eks", "aks")
# Each cloud's overlay with its components/spot-<cloud> (GPU workers on spot capacity).
SPOT_OVERLAYS = {f"{cloud}-spot": cloud for cloud in GPU_OVERLAYS}
# Workers per GPU class, chosen by GPU Feature Discovery's labels (k8s/gpu-classes/).
CLASS_OVERLAY = "gpu-classes"
OVERLAYS = (*GPU_OVERLAYS, "cpu", *SPOT_OVERLAYS, CLASS_OVERLAY)
TARGETS = ("base", *(f"overlays/{name}" for name in OVERLAYS))
# Where the worker's grace period must outlast a whole trial (spot ones follow the notice).
ON_DEMAND_TARGETS = tuple(t for t in TARGETS if t.removeprefix("overlays/") not in SPOT_OVERLAYS)
GPU_TARGETS = (*GPU_OVERLAYS, *SPOT_OVERLAYS)

# The oldest Kubernetes minor the manifests support and the newest kubernetes-validate ships.
KUBERNETES_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
KEDA_SCHEMAS = {
    "ScaledObject": "keda-scaledobject-v1alpha1.json",
    "TriggerAuthentication": "keda-triggerauthentication-v1alpha1.json",
}

NAMESPACE = "trialq"
WORKER = "trialq-worker"
SECRET = "trialq-secrets"
TRIAL_GRACE_S = 60  # contract: the hard limit is the spec's timeout_s + 60 s
DEFAULT_TRIAL_TIMEOUT_S = 3600  # contract: [trial] timeout_s when the spec omits it
SHUTDOWN_MARGIN_S = 30  # after the hard limit: acknowledge the task, send the result, exit
EXPECTED_NODE_SELECTORS = {
    "gke": {"cloud.google.com/gke-accelerator"},
    "eks": {"karpenter.sh/nodepool", "karpenter.k8s.aws/instance-gpu-manufacturer"},
    "aks": {"kubernetes.azure.com/agentpool"},
}
POD_OWNERS = {"Deployment", "StatefulSet", "Job", "DaemonSet", "ReplicaSet"}
ENV_REFERENCE = re.compile(r"^\$\(([A-Za-z_][A-Za-z0-9_]*)\)$")
PINNED_TAG = re.compile(r":v?\d+(\.\d+)+([-.][A-Za-z0-9.]+)?$")


# --- rendering ---------------------------------------------------------------------------


@cache
def kubectl() -> str:
    """The kubectl binary, or a skip (a failure in CI) saying why the tests cannot run."""
    path = shutil.which("kubectl")
    if path is None:
        reason = "kubectl is not on PATH: cannot render the kustomizations under k8s/"
        if os.environ.get("CI") == "true":
            pytest.fail(reason + " (CI=true: the deployment checks must run in CI)")
        pytest.skip(reason)
    return path


def render_dir(directory: Path) -> list[Obj]:
    """`kubectl kustomize DIRECTORY`, parsed into objects."""
    result = subprocess.run(
        [kubectl(), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, f"kubectl kustomize {directory} failed:\n{result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@cache
def _render_cached(target: str) -> tuple[Obj, ...]:
    return tuple(render_dir(K8S / target))


def render(target: str) -> list[Obj]:
    """The objects of one kustomization under k8s/ (a fresh copy: tests may mutate it)."""
    return copy.deepcopy(list(_render_cached(target)))


# --- reading the rendered objects ---------------------------------------------------------


def find(objs: list[Obj], kind: str, name: str) -> Obj:
    matches = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected exactly one {kind}/{name}, found {len(matches)}"
    return matches[0]


def find_all(objs: list[Obj], kind: str) -> list[Obj]:
    return [o for o in objs if o["kind"] == kind]


def pod_templates(objs: list[Obj]) -> Iterator[tuple[Obj, Obj]]:
    """(owner, pod template) for every workload that creates pods."""
    for obj in objs:
        if obj["kind"] in POD_OWNERS:
            yield obj, obj["spec"]["template"]
        elif obj["kind"] == "CronJob":
            yield obj, obj["spec"]["jobTemplate"]["spec"]["template"]


def containers(pod_spec: Obj) -> list[Obj]:
    return [*pod_spec.get("initContainers", []), *pod_spec["containers"]]


def worker_container(objs: list[Obj]) -> Obj:
    container: Obj = find(objs, "Deployment", WORKER)["spec"]["template"]["spec"]["containers"][0]
    return container


def env_values(container: Obj, objs: list[Obj]) -> dict[str, str]:
    """A container's literal environment: its ConfigMap envFrom entries, then its `value`s."""
    values: dict[str, str] = {}
    for source in container.get("envFrom", []):
        config_map = find(objs, "ConfigMap", source["configMapRef"]["name"])
        values.update(config_map["data"])
    values.update({e["name"]: e["value"] for e in container.get("env", []) if "value" in e})
    return values


def study_spec(objs: list[Obj]) -> dict[str, Any]:
    """The study the submit-study Job runs, read from the rendered ConfigMap."""
    job = find(objs, "Job", "submit-study")
    volumes = job["spec"]["template"]["spec"]["volumes"]
    config_map_name = next(v["configMap"]["name"] for v in volumes if "configMap" in v)
    spec_file = Path(job["spec"]["template"]["spec"]["containers"][0]["args"][1]).name
    spec: dict[str, Any] = tomllib.loads(
        find(objs, "ConfigMap", config_map_name)["data"][spec_file]
    )
    return spec


def trial_hard_limit_s(objs: list[Obj]) -> int:
    timeout_s = study_spec(objs)["trial"].get("timeout_s", DEFAULT_TRIAL_TIMEOUT_S)
    return int(timeout_s) + TRIAL_GRACE_S


def option(args: list[str], *names: str) -> str | None:
    """The value of a command-line option given as `--name value` or `--name=value`."""
    for index, arg in enumerate(args):
        for name in names:
            if arg == name and index + 1 < len(args):
                return args[index + 1]
            if arg.startswith(name + "="):
                return arg.split("=", 1)[1]
    return None


def command_line(container: Obj) -> list[str]:
    return [*container.get("command", []), *container.get("args", [])]


def expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion of a container's args from its environment."""
    match = ENV_REFERENCE.match(value)
    return env[match.group(1)] if match else value


def worker_args(deployment: Obj, objs: list[Obj]) -> list[str]:
    """A worker Deployment's command line as its container runs it ($(VAR) expanded)."""
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    env = env_values(container, objs)
    return [expand(arg, env) for arg in command_line(container)]


def worker_deployments(objs: list[Obj]) -> list[Obj]:
    return [
        o
        for o in find_all(objs, "Deployment")
        if o["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/name") == WORKER
    ]


def deployment_queue(deployment: Obj, objs: list[Obj]) -> str:
    queue = option(worker_args(deployment, objs), "--queue", "-Q")
    assert queue, "the worker's command line names no queue (--queue)"
    return queue


def worker_queue(objs: list[Obj]) -> str:
    return deployment_queue(find(objs, "Deployment", WORKER), objs)


def pod_slots(deployment: Obj, objs: list[Obj]) -> int:
    """The trials one pod of a worker Deployment runs at once: its GPUs (or MIG instances)
    times its trials per GPU; one for a CPU worker's --concurrency 1."""
    args = worker_args(deployment, objs)
    if option(args, "--gpus") is None:
        return int(option(args, "--concurrency", "-c") or 1)
    limits = deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    gpus = sum(int(v) for k, v in limits.items() if k.startswith("nvidia.com/"))
    return gpus * int(option(args, "--trials-per-gpu") or 1)


def triggers_by_name(scaled_object: Obj) -> dict[str, Obj]:
    return {t["name"]: t for t in scaled_object["spec"]["triggers"]}


def selector_matches(selector: Obj, labels: dict[str, str]) -> bool:
    """Kubernetes label-selector semantics (matchLabels and matchExpressions)."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        key, operator = expression["key"], expression["operator"]
        values = expression.get("values", [])
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[operator]
        if not ok:
            return False
    return True


def pod_labels(objs: list[Obj], kind: str, name: str) -> dict[str, str]:
    labels: dict[str, str] = find(objs, kind, name)["spec"]["template"]["metadata"]["labels"]
    return labels


def allowed_peers(policy: Obj) -> list[Obj]:
    return [peer for rule in policy["spec"].get("ingress", []) for peer in rule.get("from", [])]


def may_reach(policy: Obj, labels: dict[str, str], namespace: str = NAMESPACE) -> bool:
    """Whether a pod with these labels in this namespace is let in by the policy."""
    for peer in allowed_peers(policy):
        if "ipBlock" in peer:
            return True
        namespace_labels = {"kubernetes.io/metadata.name": namespace}
        in_namespace = (
            selector_matches(peer["namespaceSelector"], namespace_labels)
            if "namespaceSelector" in peer
            else namespace == NAMESPACE
        )
        if in_namespace and selector_matches(peer.get("podSelector", {}), labels):
            return True
    return False


def policy_for(objs: list[Obj], workload: str) -> Obj:
    labels = pod_labels(objs, "StatefulSet", workload)
    policies = [
        p
        for p in find_all(objs, "NetworkPolicy")
        if selector_matches(p["spec"]["podSelector"], labels)
        and "Ingress" in p["spec"].get("policyTypes", ["Ingress"])
    ]
    assert len(policies) == 1, f"expected one ingress NetworkPolicy for {workload}"
    return policies[0]


# --- schema validation --------------------------------------------------------------------


@cache
def keda_validator(kind: str) -> jsonschema.protocols.Validator:
    schema = json.loads((SCHEMAS / KEDA_SCHEMAS[kind]).read_text())
    validator_class = jsonschema.validators.validator_for(schema)
    validator_class.check_schema(schema)
    return validator_class(schema)


def validate_object(obj: Obj) -> str:
    """Validate one object; return which schema set validated it."""
    if obj["apiVersion"].split("/")[0] == "keda.sh":
        assert obj["kind"] in KEDA_SCHEMAS, f"no vendored schema for KEDA kind {obj['kind']}"
        keda_validator(obj["kind"]).validate(obj)
        return "keda"
    for version in KUBERNETES_VERSIONS:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            where = ".".join(str(p) for p in error.path)
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} @ {version}: {where}: {error}")
        except kubernetes_validate.SchemaNotFoundError as error:
            pytest.fail(f"no schema to validate {obj['kind']} against: {error.message}")
    return "kubernetes"


def validate_all(objs: list[Obj]) -> dict[str, int]:
    counts = {"kubernetes": 0, "keda": 0}
    for obj in objs:
        counts[validate_object(obj)] += 1
    return counts


# --- every kustomization renders and validates -----------------------------------------------


@pytest.mark.parametrize("target", TARGETS)
def test_renders_into_the_trialq_namespace(target: str) -> None:
    objs = render(target)
    assert find(objs, "Namespace", NAMESPACE)
    for obj in objs:
        if obj["kind"] != "Namespace":
            assert obj["metadata"].get("namespace") == NAMESPACE, obj["metadata"]["name"]


@pytest.mark.parametrize("target", TARGETS)
def test_every_object_validates_offline(target: str) -> None:
    objs = render(target)
    counts = validate_all(objs)
    assert counts["kubernetes"] + counts["keda"] == len(objs)
    workers = len(worker_deployments(objs))
    assert counts["keda"] == 1 + workers, "a ScaledObject a worker, one TriggerAuthentication"
    print(
        f"{target}: {len(objs)} objects validated: {counts['kubernetes']} with "
        f"kubernetes-validate --strict against {', '.join(KUBERNETES_VERSIONS)}, "
        f"{counts['keda']} KEDA objects against the vendored schemas"
    )


# Edits that a real KEDA would refuse: (where, field, value); value None removes the field.
KEDA_MISTAKES = {
    "metadata value not a string": (("spec", "triggers", 0, "metadata"), "listLength", 1),
    "misspelt field": (("spec",), "cooldownPeriods", 300),
    "HPA window over an hour": (
        ("spec", "advanced", "horizontalPodAutoscalerConfig", "behavior", "scaleDown"),
        "stabilizationWindowSeconds",
        7200,
    ),
    "formula without target": (("spec", "advanced", "scalingModifiers"), "target", None),
    "no scale target": (("spec",), "scaleTargetRef", None),
}


@pytest.mark.parametrize("mistake", KEDA_MISTAKES, ids=list(KEDA_MISTAKES))
def test_vendored_keda_schema_rejects(mistake: str) -> None:
    """The vendored KEDA schema is no rubber stamp: each of these edits fails it."""
    path, field, value = KEDA_MISTAKES[mistake]
    broken = find(render("base"), "ScaledObject", WORKER)
    node: Any = broken
    for step in path:
        node = node[step]
    if value is None:
        del node[field]
    else:
        node[field] = value
    with pytest.raises(jsonschema.ValidationError):
        keda_validator("ScaledObject").validate(broken)


def test_kubernetes_validation_rejects_mistakes() -> None:
    worker = copy.deepcopy(find(render("base"), "Deployment", WORKER))
    worker["spec"]["template"]["spec"]["terminationGracePeriod"] = 1920  # misspelt
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(worker, KUBERNETES_VERSIONS[0], strict=True)


# --- GPUs, node pools and taints -------------------------------------------------------------


@pytest.mark.parametrize("target", ["base", *(f"overlays/{o}" for o in GPU_TARGETS)])
def test_gpu_workers_request_one_gpu_and_tolerate_gpu_taints(target: str) -> None:
    objs = render(target)
    resources = worker_container(objs)["resources"]
    assert str(resources["limits"]["nvidia.com/gpu"]) == "1"
    assert str(resources.get("requests", {}).get("nvidia.com/gpu", "1")) == "1"
    tolerations = find(objs, "Deployment", WORKER)["spec"]["template"]["spec"]["tolerations"]
    assert {
        "key": "nvidia.com/gpu",
        "operator": "Exists",
        "effect": "NoSchedule",
    } in tolerations


@pytest.mark.parametrize("overlay", GPU_TARGETS)
def test_gpu_overlays_select_their_gpu_node_pool(overlay: str) -> None:
    objs = render(f"overlays/{overlay}")
    pod_spec = find(objs, "Deployment", WORKER)["spec"]["template"]["spec"]
    selector = pod_spec.get("nodeSelector", {})
    expected = EXPECTED_NODE_SELECTORS[SPOT_OVERLAYS.get(overlay, overlay)]
    assert expected <= set(selector), selector
    assert all(selector[key] for key in expected)


def test_base_leaves_node_selection_to_the_overlays() -> None:
    pod_spec = find(render("base"), "Deployment", WORKER)["spec"]["template"]["spec"]
    assert "nodeSelector" not in pod_spec


@pytest.mark.parametrize("overlay", ["aks", "aks-spot"])
def test_aks_tolerates_the_gpu_pool_taint(overlay: str) -> None:
    pod_spec = find(render(f"overlays/{overlay}"), "Deployment", WORKER)["spec"]["template"]["spec"]
    sku_gpu = {"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}
    assert sku_gpu in pod_spec["tolerations"]


def test_cpu_overlay_needs_no_gpu() -> None:
    objs = render("overlays/cpu")
    for _, template in pod_templates(objs):
        spec = template["spec"]
        assert not any(t.get("key") == "nvidia.com/gpu" for t in spec.get("tolerations", []))
        assert "nodeSelector" not in spec
        for container in containers(spec):
            for section in ("limits", "requests"):
                assert "nvidia.com/gpu" not in container.get("resources", {}).get(section, {})
    worker = worker_container(objs)
    assert worker["image"].endswith("-cpu")
    assert "TF_FORCE_GPU_ALLOW_GROWTH" not in env_values(worker, objs)
    args = worker_args(find(objs, "Deployment", WORKER), objs)
    assert option(args, "--gpus") is None and option(args, "--trials-per-gpu") is None
    assert option(args, "--concurrency", "-c") == "1"


# --- one trial per process; grace periods that outlast a trial ------------------------------


@pytest.mark.parametrize("target", TARGETS)
def test_workers_run_one_trial_per_process_on_the_spec_queue(target: str) -> None:
    objs = render(target)
    for deployment in worker_deployments(objs):
        args = worker_args(deployment, objs)
        assert args[:2] == ["trialq", "worker"]
        assert option(args, "--max-tasks-per-child") == "1"
        if target != "overlays/cpu":  # every GPU the pod has, slots on each
            assert option(args, "--gpus") == "all"
            assert int(option(args, "--trials-per-gpu") or 0) >= 1
            assert option(args, "--concurrency", "-c") is None, "the slots set concurrency"
    assert worker_queue(objs) == study_spec(objs)["trial"].get("queue", "gpu")


@pytest.mark.parametrize("target", ON_DEMAND_TARGETS)
def test_grace_period_outlasts_the_trial_hard_limit(target: str) -> None:
    objs = render(target)
    grace = find(objs, "Deployment", WORKER)["spec"]["template"]["spec"][
        "terminationGracePeriodSeconds"
    ]
    hard_limit = trial_hard_limit_s(objs)
    assert grace >= hard_limit + SHUTDOWN_MARGIN_S, (grace, hard_limit)


@pytest.mark.parametrize("target", TARGETS)
def test_visibility_timeout_outlasts_the_worker_grace_period(target: str) -> None:
    """Redis redelivers an unacknowledged trial older than this, even a running one."""
    objs = render(target)
    grace = find(objs, "Deployment", WORKER)["spec"]["template"]["spec"][
        "terminationGracePeriodSeconds"
    ]
    for _, template in pod_templates(objs):
        for container in template["spec"]["containers"]:
            env = env_values(container, objs)
            if "TRIALQ_BROKER_URL" in env:
                visibility = int(env.get("TRIALQ_VISIBILITY_TIMEOUT_S", 43200))
                assert visibility > max(grace, trial_hard_limit_s(objs))


@pytest.mark.parametrize("target", TARGETS)
def test_worker_probes_read_the_heartbeat(target: str) -> None:
    worker = worker_container(render(target))
    for probe in ("livenessProbe", "readinessProbe"):
        assert worker[probe]["exec"]["command"][:2] == ["trialq", "health"], probe


@pytest.mark.parametrize("target", TARGETS)
def test_worker_writes_only_to_empty_dirs(target: str) -> None:
    objs = render(target)
    pod_spec = find(objs, "Deployment", WORKER)["spec"]["template"]["spec"]
    worker = pod_spec["containers"][0]
    assert worker["securityContext"]["readOnlyRootFilesystem"] is True
    empty_dirs = {v["name"] for v in pod_spec["volumes"] if "emptyDir" in v}
    mounted = {m["mountPath"]: m["name"] for m in worker["volumeMounts"]}
    home = env_values(worker, objs)["HOME"]
    for path in ("/tmp", home):
        assert mounted.get(path) in empty_dirs, f"{path} is not an emptyDir mount"


def claim_mounts(pod_spec: Obj, container: Obj) -> dict[str, tuple[str, bool]]:
    """{mount path: (claim name, read-only)} for the container's PersistentVolumeClaim mounts."""
    claims = {
        v["name"]: v["persistentVolumeClaim"]["claimName"]
        for v in pod_spec["volumes"]
        if "persistentVolumeClaim" in v
    }
    return {
        m["mountPath"]: (claims[m["name"]], bool(m.get("readOnly")))
        for m in container["volumeMounts"]
        if m["name"] in claims
    }


@pytest.mark.parametrize("target", TARGETS)
def test_dashboard_serves_the_workers_artifacts_read_only(target: str) -> None:
    """optuna-dashboard reads the artifact folder the workers write, on the same claim."""
    objs = render(target)
    worker_spec = find(objs, "Deployment", WORKER)["spec"]["template"]["spec"]
    dashboard_spec = find(objs, "Deployment", "optuna-dashboard")["spec"]["template"]["spec"]
    dashboard = dashboard_spec["containers"][0]
    root = env_values(worker_container(objs), objs)["TRIALQ_ARTIFACT_ROOT"]
    assert env_values(dashboard, objs)["TRIALQ_ARTIFACT_ROOT"] == root
    worker_mounts = claim_mounts(worker_spec, worker_container(objs))
    dashboard_mounts = claim_mounts(dashboard_spec, dashboard)
    (path,) = (p for p in worker_mounts if root.startswith(p.rstrip("/") + "/"))
    assert dashboard_mounts.get(path) == (worker_mounts[path][0], True)
    assert "artifact_store=FileSystemArtifactStore(" in " ".join(command_line(dashboard))


def test_study_spec_leaves_storage_to_the_environment() -> None:
    """A spec `storage` would beat TRIALQ_STORAGE and put the study in the pod's SQLite."""
    assert "storage" not in study_spec(render("base"))["study"]


# --- autoscaling: the queue the workers consume, scale-down that keeps running trials ------


@pytest.mark.parametrize("target", TARGETS)
def test_scaled_object_watches_the_worker_queue(target: str) -> None:
    objs = render(target)
    scaled_object = find(objs, "ScaledObject", WORKER)
    assert scaled_object["spec"]["scaleTargetRef"]["name"] == WORKER
    assert scaled_object["spec"]["scaleTargetRef"].get("kind", "Deployment") == "Deployment"
    queued = triggers_by_name(scaled_object)["queued"]
    assert queued["type"] == "redis"
    assert queued["metadata"]["listName"] == worker_queue(objs)


@pytest.mark.parametrize("target", TARGETS)
def test_scaler_reads_the_brokers_redis(target: str) -> None:
    objs = render(target)
    broker = urlsplit(env_values(worker_container(objs), objs)["TRIALQ_BROKER_URL"])
    redis_service = find(objs, "Service", broker.hostname or "")
    expected_host = f"{redis_service['metadata']['name']}.{redis_service['metadata']['namespace']}"
    broker_db = broker.path.strip("/") or "0"
    for trigger in find(objs, "ScaledObject", WORKER)["spec"]["triggers"]:
        host, _, port = trigger["metadata"]["address"].rpartition(":")
        assert host in (f"{expected_host}.svc", f"{expected_host}.svc.cluster.local"), host
        assert int(port) == broker.port == redis_service["spec"]["ports"][0]["port"]
        assert trigger["metadata"].get("databaseIndex", "0") == broker_db


@pytest.mark.parametrize("target", TARGETS)
def test_scaler_authenticates_with_the_redis_password_secret(target: str) -> None:
    objs = render(target)
    redis_pod = find(objs, "StatefulSet", "redis")["spec"]["template"]["spec"]
    (redis_key,) = secret_files(redis_pod, redis_pod["containers"][0]).values()
    secret_ref = {"name": SECRET, "key": redis_key}
    for trigger in find(objs, "ScaledObject", WORKER)["spec"]["triggers"]:
        assert not {"password", "passwordFromEnv"} & set(trigger["metadata"])
        auth = find(objs, "TriggerAuthentication", trigger["authenticationRef"]["name"])
        refs = {r["parameter"]: r for r in auth["spec"]["secretTargetRef"]}
        assert (refs["password"]["name"], refs["password"]["key"]) == (
            secret_ref["name"],
            secret_ref["key"],
        )


@pytest.mark.parametrize("target", TARGETS)
def test_scale_down_counts_running_trials(target: str) -> None:
    """The queue list misses running trials; the wanted workers are queued + running."""
    scaled_object = find(render(target), "ScaledObject", WORKER)
    spec = scaled_object["spec"]
    triggers = triggers_by_name(scaled_object)
    assert triggers["running"]["type"] == "redis"
    # The queue's own running count, which its trial processes keep (not kombu's `unacked`
    # hash, which holds every queue's in-flight messages).
    running = triggers["running"]["metadata"]["listName"]
    assert running == queue_running_key(worker_queue(render(target)))
    modifiers = spec["advanced"]["scalingModifiers"]
    terms = [term.strip() for term in modifiers["formula"].split("+")]
    assert sorted(terms) == ["queued", "running"], modifiers["formula"]
    assert float(modifiers["target"]) == 1.0  # one trial slot a pod
    assert modifiers.get("metricType", "AverageValue") == "AverageValue"


@pytest.mark.parametrize("target", TARGETS)
def test_autoscaling_bounds_and_scale_down_pace(target: str) -> None:
    spec = find(render(target), "ScaledObject", WORKER)["spec"]
    assert spec["minReplicaCount"] == 0, "idle GPUs should scale to zero"
    assert spec["maxReplicaCount"] >= 1
    scale_down = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]
    assert 300 <= scale_down["stabilizationWindowSeconds"] <= 3600
    assert spec["cooldownPeriod"] >= 300


@pytest.mark.parametrize("target", TARGETS)
def test_worker_replicas_are_left_to_the_autoscaler(target: str) -> None:
    """A `replicas` field would reset KEDA's choice on every `kubectl apply`."""
    assert "replicas" not in find(render(target), "Deployment", WORKER)["spec"]


@pytest.mark.parametrize("target", TARGETS)
def test_node_autoscalers_leave_workers_alone(target: str) -> None:
    objs = render(target)
    worker = find(objs, "Deployment", WORKER)
    annotations = worker["spec"]["template"]["metadata"]["annotations"]
    assert annotations["karpenter.sh/do-not-disrupt"] == "true"
    assert annotations["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "false"
    labels = worker["spec"]["template"]["metadata"]["labels"]
    budgets = [
        b
        for b in find_all(objs, "PodDisruptionBudget")
        if selector_matches(b["spec"]["selector"], labels)
    ]
    assert len(budgets) == 1, "expected one PodDisruptionBudget over the workers"


# --- secrets, images, pod security ------------------------------------------------------------


def assert_no_inline_credentials(where: str, value: str, secret_env: set[str]) -> None:
    """A URL in a value may carry a password only as $(VAR) of an env var from a Secret."""
    for url in re.findall(r"[a-z][a-z0-9+.-]*://\S+", value):
        password = urlsplit(url).password
        if password is None:
            continue
        reference = ENV_REFERENCE.match(password)
        assert reference, f"{where}: a literal password in {url.split('@')[-1]!r}"
        assert reference.group(1) in secret_env, f"{where}: $({reference.group(1)}) not a Secret"


def check_container_secrets(where: str, container: Obj) -> None:
    secret_env: set[str] = set()
    for entry in container.get("env", []):
        name = entry["name"]
        if re.search(r"PASSWORD|SECRET|TOKEN|AUTH", name) or name.endswith("_KEY"):
            assert name.endswith("_FILE") and "value" in entry, f"{where}: {name} not a file"
        if "value" in entry:
            assert_no_inline_credentials(f"{where} env {name}", entry["value"], secret_env)
        if "secretKeyRef" in entry.get("valueFrom", {}):
            secret_env.add(name)  # only variables defined earlier can be referenced
    for arg in command_line(container):
        assert_no_inline_credentials(f"{where} args", arg, secret_env)
        assert not re.search(r"--requirepass\s+(?!\$)", arg), f"{where}: password on argv"


def check_secrets(objs: list[Obj]) -> None:
    assert not find_all(objs, "Secret"), "Secrets are created by the operator, not shipped"
    for owner, template in pod_templates(objs):
        for container in containers(template["spec"]):
            check_container_secrets(f"{owner['metadata']['name']}/{container['name']}", container)
    for config_map in find_all(objs, "ConfigMap"):
        where = f"ConfigMap {config_map['metadata']['name']}"
        for key, value in config_map.get("data", {}).items():
            assert_no_inline_credentials(f"{where} {key}", value, set())
            assert not re.search(r"^\s*requirepass\s+\S", value, re.M), f"{where}: requirepass"


@pytest.mark.parametrize("target", TARGETS)
def test_secrets_are_referenced_not_inlined(target: str) -> None:
    check_secrets(render(target))


def test_secret_check_catches_an_inlined_password() -> None:
    objs = render("base")
    env = worker_container(objs)["env"]
    env.append({"name": "TRIALQ_BROKER_URL", "value": "redis://:hunter2@redis:6379/0"})
    with pytest.raises(AssertionError, match="literal password"):
        check_secrets(objs)
    env[-1] = {"name": "REDIS_PASSWORD", "value": "hunter2"}
    with pytest.raises(AssertionError, match="REDIS_PASSWORD not a file"):
        check_secrets(objs)


@pytest.mark.parametrize("target", TARGETS)
def test_images_are_pinned_to_a_version(target: str) -> None:
    for _, template in pod_templates(render(target)):
        for container in containers(template["spec"]):
            image = container["image"]
            assert not image.endswith(":latest"), image
            assert "@sha256:" in image or PINNED_TAG.search(image), f"{image} has no version tag"
            if "trialq" in image:
                assert image.split(":")[-1].startswith("0.1.0"), image


@pytest.mark.parametrize("target", TARGETS)
def test_pods_run_as_non_root_without_privileges(target: str) -> None:
    for owner, template in pod_templates(render(target)):
        pod_context = template["spec"].get("securityContext", {})
        assert pod_context.get("seccompProfile", {}).get("type") == "RuntimeDefault"
        for container in containers(template["spec"]):
            where = f"{owner['metadata']['name']}/{container['name']}"
            context = {**pod_context, **container.get("securityContext", {})}
            assert context.get("runAsNonRoot") is True, where
            assert isinstance(context.get("runAsUser"), int), f"{where}: no runAsUser"
            assert context["runAsUser"] != 0, where
            assert context.get("allowPrivilegeEscalation") is False, where
            assert context.get("readOnlyRootFilesystem") is True, where
            assert context.get("capabilities", {}).get("drop") == ["ALL"], where


# --- passwords reach the pods as files, never as environment variables ----------------------

SECRET_FILE_MODE = 0o440  # owner root, group the pod's fsGroup: readable by the pod's user only
SECRET_VARIABLE = re.compile(r"PASSWORD|SECRET|TOKEN|AUTH")


def secret_files(pod_spec: Obj, container: Obj) -> dict[str, str]:
    """{path in the container: Secret key} for every file this container mounts from the Secret."""
    volumes = {v["name"]: v for v in pod_spec.get("volumes", [])}
    files: dict[str, str] = {}
    for mount in container.get("volumeMounts", []):
        source = volumes.get(mount["name"], {}).get("secret")
        if source is None:
            continue
        assert source["secretName"] == SECRET, f"{mount['name']}: an unknown Secret"
        assert mount.get("readOnly") is True, f"{mount['name']}: a Secret mounted writable"
        assert source.get("defaultMode") == SECRET_FILE_MODE, f"{mount['name']}: file mode"
        assert source.get("items"), f"{mount['name']}: name the keys a pod needs, no more"
        for item in source["items"]:
            files[f"{mount['mountPath']}/{item['path']}"] = item["key"]
    return files


def password_file_variables(container: Obj, objs: list[Obj]) -> dict[str, str]:
    """The container's *_FILE variables that name a secret, with the path each names."""
    return {
        name: value
        for name, value in env_values(container, objs).items()
        if name.endswith("_FILE") and SECRET_VARIABLE.search(name)
    }


@pytest.mark.parametrize("target", TARGETS)
def test_no_password_is_an_environment_variable(target: str) -> None:
    """`kubectl describe` and /proc/PID/environ show env: passwords are mounted files instead."""
    for owner, template in pod_templates(render(target)):
        for container in containers(template["spec"]):
            where = f"{owner['metadata']['name']}/{container['name']}"
            for entry in container.get("env", []):
                assert "secretKeyRef" not in entry.get("valueFrom", {}), f"{where}: {entry['name']}"
            assert not container.get("envFrom", []) or all(
                "secretRef" not in source for source in container["envFrom"]
            ), where


@pytest.mark.parametrize("target", TARGETS)
def test_every_password_file_is_mounted_from_the_secret(target: str) -> None:
    objs = render(target)
    for owner, template in pod_templates(objs):
        pod_spec = template["spec"]
        for container in containers(pod_spec):
            where = f"{owner['metadata']['name']}/{container['name']}"
            mounted = secret_files(pod_spec, container)
            for name, path in password_file_variables(container, objs).items():
                assert path in mounted, f"{where}: {name}={path} is not a mounted Secret file"
            if mounted:
                group = pod_spec["securityContext"].get("fsGroup")
                assert group is not None, f"{where}: without fsGroup the files are root's only"


# Which Secret keys each workload may read: a worker never holds the database's password.
SECRET_KEYS_BY_WORKLOAD = {
    ("Deployment", WORKER): {"redis-password", "result-secret"},
    ("StatefulSet", "redis"): {"redis-password"},
    ("StatefulSet", "postgres"): {"postgres-password"},
    ("Job", "submit-study"): {"redis-password", "postgres-password", "result-secret"},
    ("Deployment", "optuna-dashboard"): {"redis-password", "postgres-password"},
}


@pytest.mark.parametrize("target", TARGETS)
def test_each_workload_mounts_only_the_passwords_it_needs(target: str) -> None:
    objs = render(target)
    for (kind, name), keys in SECRET_KEYS_BY_WORKLOAD.items():
        pod_spec = find(objs, kind, name)["spec"]["template"]["spec"]
        mounted = {key for c in containers(pod_spec) for key in secret_files(pod_spec, c).values()}
        assert mounted == keys, f"{kind}/{name}"


def test_redis_and_postgres_read_their_passwords_from_the_files() -> None:
    objs = render("base")
    redis_pod = find(objs, "StatefulSet", "redis")["spec"]["template"]["spec"]
    redis_container = redis_pod["containers"][0]
    (redis_file,) = secret_files(redis_pod, redis_container)
    assert redis_file in " ".join(command_line(redis_container))
    for probe in ("readinessProbe", "livenessProbe"):
        assert redis_file in " ".join(redis_container[probe]["exec"]["command"]), probe
    postgres_pod = find(objs, "StatefulSet", "postgres")["spec"]["template"]["spec"]
    postgres_container = postgres_pod["containers"][0]
    (postgres_file,) = secret_files(postgres_pod, postgres_container)
    assert env_values(postgres_container, objs)["POSTGRES_PASSWORD_FILE"] == postgres_file


def test_redis_pod_script_and_probe_run_with_the_secret_file(tmp_path: Path) -> None:
    """The Redis container's own start script and probe, run here against a real
    redis-server, with the Secret's file, the config and the data dir under tmp_path."""
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        pytest.skip("redis-server / redis-cli not installed")
    redis = pytest.importorskip("redis")
    objs = render("base")
    pod_spec = find(objs, "StatefulSet", "redis")["spec"]["template"]["spec"]
    container = pod_spec["containers"][0]
    (secret_path,) = secret_files(pod_spec, container)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    paths = {  # the pod's paths -> here
        secret_path: str(tmp_path / "redis-password"),
        "/run/redis/": f"{tmp_path}/",
        "/etc/redis/": f"{tmp_path}/",
        "dir /data": f"dir {tmp_path}\nport {port}\nbind 127.0.0.1",
    }

    def here(text: str) -> str:
        for pod_path, local in paths.items():
            text = text.replace(pod_path, local)
        return text

    (tmp_path / "redis-password").write_text("k8s-test-pw\n")
    config = find(objs, "ConfigMap", "redis-config")["data"]["redis.conf"]
    (tmp_path / "redis.conf").write_text(here(config))
    script = here(command_line(container)[-1])
    probe = [here(word) for word in container["readinessProbe"]["exec"]["command"]]
    probe = [word.replace("redis-cli", f"redis-cli -p {port}") for word in probe]
    server = subprocess.Popen(["sh", "-c", script], stdout=subprocess.DEVNULL)
    try:
        wait_for_redis(redis.Redis(port=port, password="k8s-test-pw"), timeout_s=5)
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=port).ping()
        assert subprocess.run(probe, capture_output=True, timeout=10).returncode == 0
        (tmp_path / "redis-password").write_text("a-wrong-one\n")
        assert subprocess.run(probe, capture_output=True, timeout=10).returncode != 0
        assert b"k8s-test-pw" not in Path(f"/proc/{server.pid}/cmdline").read_bytes()
        assert oct((tmp_path / "auth.conf").stat().st_mode & 0o777) == "0o600"
    finally:
        server.terminate()
        server.wait(timeout=10)


def _settings_in(container: Obj, pod_spec: Obj, objs: list[Obj], root: Path) -> Any:
    """trialq's own Settings, built from the container's rendered environment with each
    mounted Secret file present (under `root`) and holding `pw-<key>`."""
    from trialq.settings import Settings

    env = {k: v for k, v in env_values(container, objs).items() if k.startswith("TRIALQ_")}
    for path, key in secret_files(pod_spec, container).items():
        local = root / path.lstrip("/")
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_text(f"pw-{key}\n")
        env = {k: (str(local) if v == path else v) for k, v in env.items()}
    with pytest.MonkeyPatch.context() as patch:
        for name in [n for n in os.environ if n.startswith("TRIALQ_")]:
            patch.delenv(name)
        for name, value in env.items():
            patch.setenv(name, value)
        return Settings()


@pytest.mark.parametrize("target", ["base", "overlays/cpu"])
def test_trialq_settings_find_the_passwords_in_the_mounted_files(
    target: str, tmp_path: Path
) -> None:
    """The variable names and paths as trialq reads them: a typo leaves a URL without password."""
    objs = render(target)
    for kind, name in (
        ("Deployment", WORKER),
        ("Job", "submit-study"),
        ("Deployment", "optuna-dashboard"),
    ):
        pod_spec = find(objs, kind, name)["spec"]["template"]["spec"]
        settings = _settings_in(pod_spec["containers"][0], pod_spec, objs, tmp_path / name)
        assert urlsplit(settings.broker_url).password == "pw-redis-password", name
        assert urlsplit(settings.broker_url).hostname == "redis", name
        # Trials sign their results, the driver checks them: both read the same key.
        assert (settings.seal is not None) == (name != "optuna-dashboard"), name
        if name == WORKER:
            assert settings.storage is None, "workers talk only to Redis"
        else:
            assert urlsplit(settings.storage).password == "pw-postgres-password", name
            assert urlsplit(settings.storage).hostname == "postgres", name


def test_no_url_on_a_command_line() -> None:
    """A URL with its password in argv is visible to every user of the node (`ps`)."""
    for owner, template in pod_templates(render("base")):
        for container in containers(template["spec"]):
            for arg in command_line(container):
                assert "TRIALQ_STORAGE)" not in arg and "TRIALQ_BROKER_URL)" not in arg, (
                    f"{owner['metadata']['name']}/{container['name']}: {arg}"
                )


# --- Redis, PostgreSQL and who may reach them ------------------------------------------------


def test_redis_is_persistent_password_protected_and_never_evicts() -> None:
    objs = render("base")
    config = find(objs, "ConfigMap", "redis-config")["data"]["redis.conf"]
    settings = dict(
        line.split(None, 1)
        for line in config.splitlines()
        if line.strip() and not line.startswith("#")
    )
    assert settings["appendonly"] == "yes"
    assert settings["maxmemory-policy"] == "noeviction"
    assert "include" in settings, "the password file written from the Secret is not included"
    redis = find(objs, "StatefulSet", "redis")
    assert [t["metadata"]["name"] for t in redis["spec"]["volumeClaimTemplates"]] == ["data"]
    assert find(objs, "Service", "redis")["spec"].get("type", "ClusterIP") == "ClusterIP"


@pytest.mark.parametrize("target", TARGETS)
def test_network_policy_lets_only_trialq_and_keda_reach_redis(target: str) -> None:
    objs = render(target)
    policy = policy_for(objs, "redis")
    assert may_reach(policy, pod_labels(objs, "Deployment", WORKER))
    assert may_reach(policy, pod_labels(objs, "Job", "submit-study"))
    assert may_reach(policy, pod_labels(objs, "Deployment", "optuna-dashboard"))
    assert may_reach(policy, {"app": "keda-operator"}, namespace="keda")
    assert not may_reach(policy, {"app": "something-else"})
    assert not may_reach(policy, pod_labels(objs, "Deployment", WORKER), namespace="default")


@pytest.mark.parametrize("target", TARGETS)
def test_network_policy_keeps_workers_off_postgres(target: str) -> None:
    objs = render(target)
    policy = policy_for(objs, "postgres")
    assert may_reach(policy, pod_labels(objs, "Job", "submit-study"))
    assert may_reach(policy, pod_labels(objs, "Deployment", "optuna-dashboard"))
    assert not may_reach(policy, pod_labels(objs, "Deployment", WORKER))
    assert not may_reach(policy, {"app": "keda-operator"}, namespace="keda")


# --- the external-database component ---------------------------------------------------------


@pytest.fixture(scope="module")
def external_db_objs(tmp_path_factory: pytest.TempPathFactory) -> list[Obj]:
    """The GKE overlay with the external-postgres component, rendered from a copy of k8s/."""
    root = tmp_path_factory.mktemp("k8s") / "k8s"
    shutil.copytree(K8S, root)
    overlay = root / "overlays" / "gke-external-db"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        "resources: [../gke]\ncomponents: [../../components/external-postgres]\n"
    )
    return render_dir(overlay)


def test_external_postgres_component_reads_the_storage_url_from_the_secret(
    external_db_objs: list[Obj],
) -> None:
    objs = external_db_objs
    assert not [o for o in objs if o["metadata"]["name"].startswith("postgres")]
    for kind, name in (("Job", "submit-study"), ("Deployment", "optuna-dashboard")):
        pod_spec = find(objs, kind, name)["spec"]["template"]["spec"]
        env = pod_spec["containers"][0]["env"]
        storage = next(e for e in env if e["name"] == "TRIALQ_STORAGE")
        assert "value" not in storage
        assert storage["valueFrom"]["secretKeyRef"] == {"name": SECRET, "key": "storage-url"}
        # The password still comes from its file, which trialq puts into that URL.
        password_file = next(e for e in env if e["name"] == "TRIALQ_STORAGE_PASSWORD_FILE")
        mounted = secret_files(pod_spec, pod_spec["containers"][0])
        assert mounted[password_file["value"]] == "postgres-password", name
    check_secrets(objs)
    assert sum(validate_all(objs).values()) == len(objs)


# --- spot / preemptible GPU pools (components/spot-<cloud>, overlays/<cloud>-spot) ----------

# What each cloud's spot nodes carry: the label to select, and the taint (if any) to tolerate.
SPOT_NODE_LABELS = {
    "gke": {"cloud.google.com/gke-spot": "true"},
    "eks": {"karpenter.sh/capacity-type": "spot"},
    "aks": {"kubernetes.azure.com/scalesetpriority": "spot"},
}
SPOT_NODE_TAINTS: dict[str, list[Obj]] = {
    # Not added by GKE Standard itself; the recommended --node-taints, and what node
    # auto-provisioning adds.
    "gke": [{"key": "cloud.google.com/gke-spot", "value": "true", "effect": "NoSchedule"}],
    "eks": [],  # Karpenter taints nothing for spot
    "aks": [
        {"key": "kubernetes.azure.com/scalesetpriority", "value": "spot", "effect": "NoSchedule"}
    ],
}
# Seconds from the reclaim notice to the node's end, and how much of it pods may have: GKE's
# kubelet gives non-system pods the first 15 s of 30 (the rest is for critical pods).
SPOT_NOTICE_S = {"gke": 30, "eks": 120, "aks": 30}
SPOT_POD_WINDOW_S = {"gke": 15, "eks": 120, "aks": 30}
STOP_MARGIN_S = 3  # worker kills, records `preempted`, exits, before the platform's kill


def tolerates(toleration: Obj, taint: Obj) -> bool:
    """Kubernetes toleration semantics for one taint."""
    if toleration.get("effect") not in (None, "", taint["effect"]):
        return False
    if not toleration.get("key"):
        return toleration.get("operator") == "Exists"
    if toleration["key"] != taint["key"]:
        return False
    if toleration.get("operator", "Equal") == "Exists":
        return True
    return bool(toleration.get("value", "") == taint.get("value", ""))


def worker_pod_spec(objs: list[Obj]) -> Obj:
    pod_spec: Obj = find(objs, "Deployment", WORKER)["spec"]["template"]["spec"]
    return pod_spec


def stop_grace_s(objs: list[Obj]) -> float:
    return float(env_values(worker_container(objs), objs)["TRIALQ_STOP_GRACE_S"])


def test_tolerates_follows_kubernetes_semantics() -> None:
    taint = {"key": "k", "value": "v", "effect": "NoSchedule"}
    assert tolerates({"key": "k", "operator": "Exists", "effect": "NoSchedule"}, taint)
    assert tolerates({"key": "k", "operator": "Equal", "value": "v"}, taint)
    assert tolerates({"operator": "Exists"}, taint)
    assert not tolerates({"key": "k", "operator": "Equal", "value": "w"}, taint)
    assert not tolerates({"key": "k", "operator": "Exists", "effect": "NoExecute"}, taint)
    assert not tolerates({"key": "other", "operator": "Exists"}, taint)


@pytest.mark.parametrize("overlay", SPOT_OVERLAYS)
def test_spot_workers_select_and_tolerate_spot_nodes(overlay: str) -> None:
    cloud = SPOT_OVERLAYS[overlay]
    pod_spec = worker_pod_spec(render(f"overlays/{overlay}"))
    selector = pod_spec["nodeSelector"]
    assert SPOT_NODE_LABELS[cloud].items() <= selector.items(), selector
    for taint in SPOT_NODE_TAINTS[cloud]:
        assert any(tolerates(t, taint) for t in pod_spec["tolerations"]), taint
    # The cloud's on-demand overlay stays off spot capacity.
    on_demand = worker_pod_spec(render(f"overlays/{cloud}"))["nodeSelector"]
    assert not SPOT_NODE_LABELS[cloud].keys() & on_demand.keys()


@pytest.mark.parametrize("overlay", SPOT_OVERLAYS)
def test_spot_grace_period_fits_the_preemption_notice(overlay: str) -> None:
    """Not the longest trial: the platform kills the pod when the node goes, whatever it asks."""
    cloud = SPOT_OVERLAYS[overlay]
    objs = render(f"overlays/{overlay}")
    grace = worker_pod_spec(objs)["terminationGracePeriodSeconds"]
    assert 0 < grace < SPOT_NOTICE_S[cloud], grace
    assert grace <= SPOT_POD_WINDOW_S[cloud], grace
    assert grace < trial_hard_limit_s(objs)


@pytest.mark.parametrize("overlay", SPOT_OVERLAYS)
def test_spot_worker_kills_what_did_not_stop_before_the_platform_does(
    overlay: str, tmp_path: Path
) -> None:
    objs = render(f"overlays/{overlay}")
    pod_spec = worker_pod_spec(objs)
    grace = pod_spec["terminationGracePeriodSeconds"]
    stop = stop_grace_s(objs)
    assert 0 < stop < grace, (stop, grace)
    assert grace - stop >= STOP_MARGIN_S, (stop, grace)
    # As trialq reads it from the rendered environment.
    settings = _settings_in(pod_spec["containers"][0], pod_spec, objs, tmp_path)
    assert settings.stop_grace_s == stop


@pytest.mark.parametrize("overlay", SPOT_OVERLAYS)
def test_spot_workers_keep_the_shared_checkpoint_volume(overlay: str) -> None:
    """A preempted trial resumes on another node from the ReadWriteMany claim."""
    cloud = SPOT_OVERLAYS[overlay]
    objs = render(f"overlays/{overlay}")
    root = env_values(worker_container(objs), objs)["TRIALQ_CHECKPOINT_ROOT"]
    mounts = claim_mounts(worker_pod_spec(objs), worker_container(objs))
    (path,) = (p for p in mounts if root.startswith(p.rstrip("/") + "/"))
    claim_name, read_only = mounts[path]
    assert not read_only
    claim = find(objs, "PersistentVolumeClaim", claim_name)
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    on_demand_claim = find(render(f"overlays/{cloud}"), "PersistentVolumeClaim", claim_name)
    assert claim["spec"]["storageClassName"] == on_demand_claim["spec"]["storageClassName"]


@pytest.mark.parametrize("overlay", SPOT_OVERLAYS)
def test_spot_component_changes_only_the_worker_placement_and_grace(overlay: str) -> None:
    """Everything else is the cloud's overlay, object for object."""
    cloud = SPOT_OVERLAYS[overlay]
    spot = {(o["kind"], o["metadata"]["name"]): o for o in render(f"overlays/{overlay}")}
    on_demand = {(o["kind"], o["metadata"]["name"]): o for o in render(f"overlays/{cloud}")}
    assert spot.keys() == on_demand.keys()
    for key, obj in spot.items():
        if key != ("Deployment", WORKER):
            assert obj == on_demand[key], key
    worker = spot[("Deployment", WORKER)]
    expected = on_demand[("Deployment", WORKER)]
    pod_spec = worker["spec"]["template"]["spec"]
    expected_spec = expected["spec"]["template"]["spec"]
    # Undo what spot is allowed to change, then the rest must be the same.
    spot_tolerations = [
        t for t in pod_spec["tolerations"] if any(tolerates(t, x) for x in SPOT_NODE_TAINTS[cloud])
    ]
    assert len(spot_tolerations) == len(SPOT_NODE_TAINTS[cloud])
    pod_spec["tolerations"] = [t for t in pod_spec["tolerations"] if t not in spot_tolerations]
    for label in SPOT_NODE_LABELS[cloud]:
        del pod_spec["nodeSelector"][label]
    assert pod_spec["nodeSelector"].keys() == expected_spec["nodeSelector"].keys()
    pod_spec["nodeSelector"] = expected_spec["nodeSelector"]  # aks-spot names its own pool
    pod_spec["terminationGracePeriodSeconds"] = expected_spec["terminationGracePeriodSeconds"]
    env = pod_spec["containers"][0]["env"]
    env[:] = [e for e in env if e["name"] != "TRIALQ_STOP_GRACE_S"]
    assert worker == expected


# --- GPU classes (k8s/gpu-classes/, overlays/gpu-classes): a worker and a queue per class ----

GFD_LABELS = {"nvidia.com/gpu.product", "nvidia.com/gpu.memory"}
# Nodes as GPU Feature Discovery labels them (memory in MiB).
NODES = {
    "h100": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.memory": "81559"},
    "a100-40": {
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB",
        "nvidia.com/gpu.memory": "40960",
    },
    "a100-80": {
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
        "nvidia.com/gpu.memory": "81920",
    },
    "l40s": {"nvidia.com/gpu.product": "NVIDIA-L40S", "nvidia.com/gpu.memory": "46068"},
    "l4": {"nvidia.com/gpu.product": "NVIDIA-L4", "nvidia.com/gpu.memory": "23034"},
    # GFD under the device plugin's time-slicing or MPS sharing: `-SHARED` appended.
    "l4-shared": {"nvidia.com/gpu.product": "NVIDIA-L4-SHARED", "nvidia.com/gpu.memory": "23034"},
    "h100-shared": {
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3-SHARED",
        "nvidia.com/gpu.memory": "81559",
    },
    "t4": {"nvidia.com/gpu.product": "Tesla-T4", "nvidia.com/gpu.memory": "15360"},
}
# `large` is more than 40 GiB: the A100 40GB (40960 MiB) is not one.
CLASS_NODES = {
    "trialq-worker-large": {"h100", "a100-80", "l40s", "h100-shared"},
    "trialq-worker-l4": {"l4", "l4-shared"},
}


def schedules_on(pod_spec: Obj, labels: dict[str, str]) -> bool:
    """Whether a pod's nodeSelector and required node affinity admit a node with these labels
    (In, NotIn, Exists, DoesNotExist, Gt, Lt, as the scheduler reads them)."""
    if any(labels.get(k) != v for k, v in pod_spec.get("nodeSelector", {}).items()):
        return False
    required = (
        pod_spec.get("affinity", {})
        .get("nodeAffinity", {})
        .get("requiredDuringSchedulingIgnoredDuringExecution")
    )
    if not required:
        return True

    def term_matches(term: Obj) -> bool:
        for expression in term.get("matchExpressions", []):
            key, operator, values = (
                expression["key"],
                expression["operator"],
                expression.get("values", []),
            )
            if operator in ("Gt", "Lt"):
                if key not in labels or not labels[key].isdigit():
                    return False
                number, bound = int(labels[key]), int(values[0])
                if not (number > bound if operator == "Gt" else number < bound):
                    return False
            elif not selector_matches({"matchExpressions": [expression]}, labels):
                return False
        return True

    return any(term_matches(term) for term in required["nodeSelectorTerms"])


def test_node_affinity_reading_follows_the_scheduler() -> None:
    gt = {"key": "nvidia.com/gpu.memory", "operator": "Gt", "values": ["40000"]}
    spec = {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [gt]}]}}}}  # fmt: skip
    assert schedules_on(spec, NODES["h100"]) and not schedules_on(spec, NODES["l4"])
    assert not schedules_on(spec, {})
    assert schedules_on({"nodeSelector": {"a": "b"}}, {"a": "b"})
    assert not schedules_on({"nodeSelector": {"a": "b"}}, {"a": "c"})


def test_each_gpu_class_selects_its_nodes_by_gpu_feature_discovery_labels() -> None:
    objs = render(f"overlays/{CLASS_OVERLAY}")
    classes = {d["metadata"]["name"]: d for d in worker_deployments(objs)}
    assert set(classes) == {WORKER, *CLASS_NODES}
    for name, nodes in CLASS_NODES.items():
        pod_spec = classes[name]["spec"]["template"]["spec"]
        keys = set(pod_spec.get("nodeSelector", {})) | {
            e["key"]
            for term in pod_spec.get("affinity", {})
            .get("nodeAffinity", {})
            .get("requiredDuringSchedulingIgnoredDuringExecution", {})
            .get("nodeSelectorTerms", [])
            for e in term.get("matchExpressions", [])
        }
        assert keys and keys <= GFD_LABELS, f"{name} selects by {keys}"
        admitted = {node for node, labels in NODES.items() if schedules_on(pod_spec, labels)}
        assert admitted == nodes, name
        # Every class keeps the base's GPU toleration and request.
        assert any(t.get("key") == "nvidia.com/gpu" for t in pod_spec["tolerations"])
        assert str(pod_spec["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]) == "1"


def test_each_queue_has_one_worker_and_one_scaled_object() -> None:
    objs = render(f"overlays/{CLASS_OVERLAY}")
    deployments = {d["metadata"]["name"]: d for d in worker_deployments(objs)}
    queues = {name: deployment_queue(d, objs) for name, d in deployments.items()}
    assert len(set(queues.values())) == len(queues), f"two workers share a queue: {queues}"
    assert queues[WORKER] == "gpu"
    scaled = find_all(objs, "ScaledObject")
    assert sorted(s["spec"]["scaleTargetRef"]["name"] for s in scaled) == sorted(deployments)
    for scaled_object in scaled:
        target = scaled_object["spec"]["scaleTargetRef"]["name"]
        triggers = triggers_by_name(scaled_object)
        assert triggers["queued"]["type"] == "redis"
        assert triggers["queued"]["metadata"]["listName"] == queues[target], target
        # Each class counts the trials running on its own workers only.
        assert triggers["running"]["metadata"]["listName"] == queue_running_key(queues[target])
        # Pods wanted = trials / the slots of one pod.
        slots = pod_slots(deployments[target], objs)
        assert float(scaled_object["spec"]["advanced"]["scalingModifiers"]["target"]) == slots
    assert {n: pod_slots(d, objs) for n, d in deployments.items()} == {
        WORKER: 1,
        "trialq-worker-large": 4,
        "trialq-worker-l4": 2,
    }


def test_gpu_classes_never_share_pods_or_disruption_budgets() -> None:
    """Overlapping selectors: Deployments fight over pods, and a pod under two budgets cannot
    be evicted at all."""
    objs = render(f"overlays/{CLASS_OVERLAY}")
    deployments = worker_deployments(objs)
    budgets = find_all(objs, "PodDisruptionBudget")
    for deployment in deployments:
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        owners = [d for d in deployments if selector_matches(d["spec"]["selector"], labels)]
        assert owners == [deployment], deployment["metadata"]["name"]
        covering = [b for b in budgets if selector_matches(b["spec"]["selector"], labels)]
        assert len(covering) == 1, deployment["metadata"]["name"]
        # Still a trialq worker for the NetworkPolicy that lets workers reach Redis.
        assert may_reach(policy_for(objs, "redis"), labels)
        assert not may_reach(policy_for(objs, "postgres"), labels)


def test_gpu_classes_change_nothing_but_their_workers() -> None:
    base = {(o["kind"], o["metadata"]["name"]): o for o in render("base")}
    classes = {(o["kind"], o["metadata"]["name"]): o for o in render(f"overlays/{CLASS_OVERLAY}")}
    for key, obj in base.items():
        assert classes[key] == obj, key
    added = {key for key in classes if key not in base}
    assert {kind for kind, _ in added} == {"Deployment", "PodDisruptionBudget", "ScaledObject"}


# --- sharing a GPU through the device plugin (components/gpu-sharing-*) ---------------------

SHARING = ("time-slicing", "mps", "mig")
DEVICE_PLUGIN_CONFIG = "trialq-device-plugin"
SMALLEST_CARD_MIB = 24576  # the time-slicing budget is set for a 24 GB card (L4, A10)
CUDA_CONTEXT_MIB = 500  # about what one process's CUDA context takes on the card


@cache
def _render_sharing(mode: str) -> tuple[Obj, ...]:
    """overlays/gpu-classes with components/gpu-sharing-<mode>, from a copy of k8s/."""
    import tempfile

    root = Path(tempfile.mkdtemp(prefix=f"k8s-{mode}-")) / "k8s"
    shutil.copytree(K8S, root)
    overlay = root / "overlays" / f"sharing-{mode}"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        f"resources: [../{CLASS_OVERLAY}]\ncomponents: [../../components/gpu-sharing-{mode}]\n"
    )
    return tuple(render_dir(overlay))


def render_sharing(mode: str) -> list[Obj]:
    return copy.deepcopy(list(_render_sharing(mode)))


def device_plugin_config(objs: list[Obj]) -> tuple[Obj, str, dict[str, Any]]:
    """The device plugin's ConfigMap, its one key, and that key's configuration."""
    config_map = find(objs, "ConfigMap", DEVICE_PLUGIN_CONFIG)
    ((key, text),) = config_map["data"].items()
    config: dict[str, Any] = yaml.safe_load(text)
    return config_map, key, config


@pytest.mark.parametrize("mode", SHARING)
def test_sharing_components_render_and_validate(mode: str) -> None:
    objs = render_sharing(mode)
    counts = validate_all(objs)
    assert counts["kubernetes"] + counts["keda"] == len(objs)
    config_map, key, config = device_plugin_config(objs)
    # The device plugin's own ConfigMap, in its namespace; everything else stays in trialq's.
    assert config_map["metadata"]["namespace"] == "gpu-operator"
    assert key == {"time-slicing": "time-slicing", "mps": "mps", "mig": "mig-mixed"}[mode]
    assert config["version"] == "v1"
    for obj in objs:
        if obj is not config_map and obj["kind"] != "Namespace":
            assert obj["metadata"]["namespace"] == NAMESPACE, obj["metadata"]["name"]
    check_secrets([o for o in objs if o is not config_map])
    for scaled_object in find_all(objs, "ScaledObject"):
        # One trial a pod: a pod is a slice of a GPU now.
        assert float(scaled_object["spec"]["advanced"]["scalingModifiers"]["target"]) == 1.0
    for deployment in worker_deployments(objs):
        assert pod_slots(deployment, objs) == 1, deployment["metadata"]["name"]


def test_time_slicing_gives_each_pod_a_fixed_share_of_the_card() -> None:
    objs = render_sharing("time-slicing")
    _, _, config = device_plugin_config(objs)
    assert config["flags"]["migStrategy"] == "none"
    slicing = config["sharing"]["timeSlicing"]
    assert slicing["renameByDefault"] is False, "the workers keep asking for nvidia.com/gpu"
    assert slicing["failRequestsGreaterThanOne"] is True
    ((resource,),) = [slicing["resources"]]
    assert resource["name"] == "nvidia.com/gpu" and resource["replicas"] >= 2
    for deployment in worker_deployments(objs):
        # Time-slicing isolates no memory: each worker is told its share.
        budget = int(option(worker_args(deployment, objs), "--gpu-memory-mb") or 0)
        assert budget > 0, deployment["metadata"]["name"]
        assert resource["replicas"] * (budget + CUDA_CONTEXT_MIB) <= SMALLEST_CARD_MIB


def test_mps_shares_by_replicas_and_the_readme_states_its_fault_domain() -> None:
    objs = render_sharing("mps")
    _, _, config = device_plugin_config(objs)
    ((resource,),) = [config["sharing"]["mps"]["resources"]]
    assert resource["name"] == "nvidia.com/gpu" and resource["replicas"] >= 2
    for deployment in worker_deployments(objs):
        # MPS enforces each pod's memory itself; the worker budgets within its pinned limit,
        # which NVML does not show: the limit is in its environment, a card's share at most.
        assert option(worker_args(deployment, objs), "--gpu-memory-mb") is None
        env = {e["name"]: e.get("value") for e in
               deployment["spec"]["template"]["spec"]["containers"][0]["env"]}  # fmt: skip
        limits = pinned_limits(env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"])
        assert set(limits) == {0}, "one GPU a pod: ordinal 0"
        assert resource["replicas"] * (limits[0] // 2**20 + CUDA_CONTEXT_MIB) <= SMALLEST_CARD_MIB
    for text in (
        (K8S / "README.md").read_text(encoding="utf-8"),
        (K8S / "components" / "gpu-sharing-mps" / "kustomization.yaml").read_text(),
    ):
        assert "shared fault domain" in text.lower()


def test_mig_workers_request_a_mig_instance_not_a_gpu() -> None:
    objs = render_sharing("mig")
    _, _, config = device_plugin_config(objs)
    assert config["flags"]["migStrategy"] == "mixed"
    for deployment in worker_deployments(objs):
        limits = deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
        assert "nvidia.com/gpu" not in limits
        assert str(limits["nvidia.com/mig-1g.10gb"]) == "1"
        assert re.fullmatch(r"nvidia\.com/mig-\d+g\.\d+gb", next(k for k in limits if "mig" in k))
