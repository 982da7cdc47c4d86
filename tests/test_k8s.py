"""deploy/k8s as users install it.

The manifests, the kustomize base (deploy/k8s) and its overlays (deploy/kustomize), rendered by
`kubectl kustomize`: built-in kinds validated against the Kubernetes schemas (kubernetes-validate),
PodMonitor, ServiceMonitor and PrometheusRule against the Prometheus Operator CRDs' OpenAPI
schemas (tests/fixtures/prometheus-operator, with jsonschema), the objects checked against each
other and the generated rules and dashboards, and the kube-prometheus-stack overlay against the
labels that chart's defaults select (tests/fixtures/kube-prometheus-stack).
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.prometheus_server import require_binary
from trainhealth._internal.alerts.render import prometheus_rule_yaml
from trainhealth._internal.dashboards.render import DASHBOARDS

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = {name: ROOT / "deploy" / "kustomize" / name for name in ("operator", "kube-prometheus-stack")}
FIXTURES = Path(__file__).resolve().parent / "fixtures"
KUBERNETES_VERSION = "1.30.0"
OPERATOR_SCHEMAS = {"PodMonitor": "podmonitor", "ServiceMonitor": "servicemonitor", "PrometheusRule": "prometheusrule"}
# kube-prometheus-stack's name for the selector of each kind (prometheusSpec.<name>Selector)
CHART_SELECTORS = {"PodMonitor": "podMonitor", "ServiceMonitor": "serviceMonitor", "PrometheusRule": "rule"}
RELEASE_NAME = "RELEASE"  # how tests/fixtures/kube-prometheus-stack/selectors.yaml writes the Helm release name
INSTALLED_KINDS = {"ConfigMap", "Deployment", "Service", "PodMonitor", "ServiceMonitor", "PrometheusRule"}


# --- rendering ---------------------------------------------------------------------------------


def manifests() -> list[dict]:
    """Every object of every deploy/k8s/*.yaml manifest (the training pod example included)."""
    return [
        doc
        for path in sorted(K8S.glob("*.yaml"))
        if path.name != "kustomization.yaml"
        for doc in yaml.safe_load_all(path.read_text())
        if doc
    ]


def kustomize(directory: Path) -> list[dict]:
    """The objects `kubectl kustomize directory` renders."""
    kubectl = require_binary("kubectl")
    result = subprocess.run(
        [kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, f"kubectl kustomize {directory} failed:\n{result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    """The base and each overlay, rendered as `kubectl apply -k` would apply them."""
    return {"base": kustomize(K8S), **{name: kustomize(overlay) for name, overlay in OVERLAYS.items()}}


def objects(source: str, request) -> list[dict]:
    return manifests() if source == "manifests" else request.getfixturevalue("rendered")[source]


def only(docs: list[dict], kind: str) -> dict:
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


# --- schemas -----------------------------------------------------------------------------------


def strict(schema):
    """``schema`` rejecting undeclared fields, as `kubectl apply`'s default strict field validation does."""
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: strict(value) for key, value in schema.items()}
    open_ended = "additionalProperties" in out or out.get("x-kubernetes-preserve-unknown-fields")
    if "properties" in out and not open_ended:
        out["additionalProperties"] = False
    return out


@functools.cache
def operator_validator(kind: str) -> jsonschema.Draft4Validator:
    schema = yaml.safe_load((FIXTURES / "prometheus-operator" / f"{OPERATOR_SCHEMAS[kind]}.schema.yaml").read_text())
    return jsonschema.Draft4Validator(strict(schema))


def operator_errors(doc: dict) -> list[str]:
    errors = operator_validator(doc["kind"]).iter_errors(doc)
    return sorted(f"{'/'.join(map(str, e.absolute_path)) or '.'}: {e.message}" for e in errors)


def validate(doc: dict) -> None:
    """Raise if ``doc`` is not a valid object of its kind."""
    if doc["kind"] in OPERATOR_SCHEMAS:
        assert doc["apiVersion"] == "monitoring.coreos.com/v1", doc["apiVersion"]
        errors = operator_errors(doc)
        assert not errors, f"{doc['kind']} {doc['metadata']['name']}:\n" + "\n".join(errors)
    else:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)  # raises on a wrong or unknown field


@pytest.mark.parametrize("source", ["manifests", "base", *OVERLAYS])
def test_every_object_matches_its_schema(source, request):
    docs = objects(source, request)
    for doc in docs:
        validate(doc)
    expected = INSTALLED_KINDS | ({"Pod"} if source == "manifests" else set())
    assert sorted(d["kind"] for d in docs) == sorted(expected)  # each kind once: nothing dropped or doubled


def test_the_operator_schemas_reject_what_the_api_server_would():
    podmonitor = only(manifests(), "PodMonitor")
    assert operator_errors(podmonitor) == []
    typo = json.loads(json.dumps(podmonitor))
    typo["spec"]["podMetricsEndpoints"][0]["honourLabels"] = typo["spec"]["podMetricsEndpoints"][0].pop("honorLabels")
    assert any("honourLabels" in e for e in operator_errors(typo))
    out_of_range = json.loads(json.dumps(podmonitor))
    out_of_range["spec"]["podMetricsEndpoints"][0]["portNumber"] = 70000
    assert any("70000" in e for e in operator_errors(out_of_range))
    monitor = json.loads(json.dumps(only(manifests(), "ServiceMonitor")))
    del monitor["spec"]["endpoints"]
    assert any("'endpoints' is a required property" in e for e in operator_errors(monitor))
    rule = json.loads(json.dumps(only(manifests(), "PrometheusRule")))
    del rule["spec"]["groups"][0]["rules"][0]["expr"]
    assert any("'expr' is a required property" in e for e in operator_errors(rule))


# --- the manifests -----------------------------------------------------------------------------


def test_the_base_installs_every_manifest_but_the_example():
    base = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    listed = set(base["resources"])
    assert listed == {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml", "training-pod-example.yaml"}


def test_operator_resources_are_well_formed():
    docs = manifests()
    for doc in docs:
        if doc["kind"] in OPERATOR_SCHEMAS:
            assert doc["metadata"]["name"] and doc["metadata"]["namespace"]
    podmonitor = only(docs, "PodMonitor")
    endpoints = podmonitor["spec"]["podMetricsEndpoints"]
    assert all(e["honorLabels"] is True for e in endpoints)  # keep the ranks' job/host/rank labels
    pod = only(docs, "Pod")
    ports = {p["name"]: p["containerPort"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
    assert [e["port"] for e in endpoints] == [f"th-rank-{i}" for i in range(8)]
    assert all(ports[f"th-rank-{i}"] == 9450 + i for i in range(8))
    labels = pod["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in podmonitor["spec"]["selector"]["matchLabels"].items())
    assert podmonitor["spec"]["jobLabel"] in labels
    assert podmonitor["spec"]["namespaceSelector"] == {"any": True}  # training pods live in their own namespaces


def test_the_analyzer_service_and_its_monitor_select_the_deployment():
    docs = manifests()
    deployment, service, monitor = (only(docs, kind) for kind in ("Deployment", "Service", "ServiceMonitor"))
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert all(pod_labels[k] == v for k, v in service["spec"]["selector"].items())
    assert all(service["metadata"]["labels"][k] == v for k, v in monitor["spec"]["selector"]["matchLabels"].items())
    assert monitor["spec"]["endpoints"][0]["port"] in {p["name"] for p in service["spec"]["ports"]}
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert args[:2] == ["analyze", "--prometheus"] and "--addr" in args
    assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    # the Prometheus URL follows the namespace an overlay sets: Kubernetes expands $(VAR) from the
    # container's env, and leaves a reference to an undefined variable as it is
    assert "$(POD_NAMESPACE)" in args[2]
    referenced = set(re.findall(r"\$\((\w+)\)", " ".join(args)))
    assert referenced <= {e["name"] for e in container.get("env", [])}
    assert {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}} in container["env"]


def test_generated_manifests_carry_the_current_rules_and_dashboards():
    docs = manifests()
    assert only(docs, "PrometheusRule")["spec"] == yaml.safe_load(prometheus_rule_yaml())["spec"]
    configmap = only(docs, "ConfigMap")
    assert configmap["metadata"]["name"] == "trainhealth-dashboards"
    assert sorted(configmap["data"]) == sorted(f"{uid}.json" for uid in DASHBOARDS)
    assert all(json.loads(text)["uid"] for text in configmap["data"].values())


# --- the overlays ------------------------------------------------------------------------------


def setting(overlay: Path) -> dict:
    return yaml.safe_load((overlay / "kustomization.yaml").read_text())


def added_labels(kustomization: dict) -> dict[str, str]:
    return {k: v for entry in kustomization.get("labels", []) for k, v in entry["pairs"].items()}


def normalized(docs: list[dict], labels: set[str]) -> dict[tuple[str, str], dict]:
    """``docs`` by (kind, name), without their namespace and the given labels."""
    out = {}
    for doc in json.loads(json.dumps(docs)):
        doc["metadata"].pop("namespace", None)
        for label in labels:
            doc["metadata"].get("labels", {}).pop(label, None)
        out[doc["kind"], doc["metadata"]["name"]] = doc
    return out


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_an_overlay_changes_only_namespace_and_labels(overlay, rendered):
    kustomization = setting(OVERLAYS[overlay])
    assert kustomization["kind"] == "Kustomization"
    assert [(OVERLAYS[overlay] / path).resolve() for path in kustomization["resources"]] == [K8S.resolve()]
    docs = rendered[overlay]
    assert {d["metadata"]["namespace"] for d in docs} == {kustomization["namespace"]}
    labels = added_labels(kustomization)
    assert all(d["metadata"]["labels"][k] == v for d in docs for k, v in labels.items())
    # specs untouched: no label reaches a selector (a Deployment's is immutable) or a pod template
    assert normalized(docs, set(labels)) == normalized(rendered["base"], set(labels))


def chart_values() -> dict:
    return yaml.safe_load((FIXTURES / "kube-prometheus-stack" / "values-excerpt.yaml").read_text())


def chart_selector_labels() -> dict[str, dict[str, str]]:
    """The labels each selector of a default kube-prometheus-stack Prometheus matches, with the Helm release
    name as RELEASE_NAME: {"podMonitor": {"release": RELEASE_NAME}, ...}."""
    selectors = yaml.safe_load((FIXTURES / "kube-prometheus-stack" / "selectors.yaml").read_text())
    return {kind: dict(selector["matchLabels"]) for kind, selector in selectors.items()}


def selected_labels(kind: str, release: str) -> dict[str, str]:
    """The labels a default kube-prometheus-stack Prometheus, Helm release ``release``, selects ``kind`` by."""
    name = CHART_SELECTORS[kind]
    spec = chart_values()["prometheus"]["prometheusSpec"]
    assert spec[f"{name}SelectorNilUsesHelmValues"] is True and spec[f"{name}Selector"] == {}, spec
    assert spec[f"{name}NamespaceSelector"] == {}, spec  # every namespace: the overlay's is free
    labels = chart_selector_labels()[name]
    unknown = {k: v for k, v in labels.items() if v != RELEASE_NAME}
    assert not unknown, f"the chart's {name}Selector also matches {unknown}; give the overlay those labels"
    return dict.fromkeys(labels, release)


def release_labels() -> set[str]:
    """The labels the chart fills with the Helm release name."""
    return {k for labels in chart_selector_labels().values() for k, v in labels.items() if v == RELEASE_NAME}


def check_kube_prometheus_stack(docs: list[dict], release: str) -> None:
    for kind in CHART_SELECTORS:
        labels = only(docs, kind)["metadata"]["labels"]
        wanted = selected_labels(kind, release)
        assert {k: labels.get(k) for k in wanted} == wanted, f"{kind} would not be selected: {labels}"
    dashboards = chart_values()["grafana"]["sidecar"]["dashboards"]
    assert dashboards["enabled"] is True and dashboards["searchNamespace"] == "ALL"
    configmap = only(docs, "ConfigMap")
    assert configmap["metadata"]["labels"].get(dashboards["label"]) == dashboards["labelValue"]


def test_the_chart_excerpt_names_the_selectors_of_every_kind():
    assert set(chart_selector_labels()) == set(CHART_SELECTORS.values())
    assert release_labels()  # the chart selects by the release name: the overlay has something to set


def test_the_kube_prometheus_stack_overlay_carries_what_the_chart_selects(rendered):
    labels = added_labels(setting(OVERLAYS["kube-prometheus-stack"]))
    (release,) = {labels[k] for k in release_labels()}  # KeyError: the overlay does not set the chart's label
    check_kube_prometheus_stack(rendered["kube-prometheus-stack"], release)
    with pytest.raises(AssertionError, match="would not be selected"):
        check_kube_prometheus_stack(rendered["operator"], release)  # the check can fail


def test_the_release_and_namespace_are_set_in_one_place(tmp_path, rendered):
    kustomization = setting(OVERLAYS["kube-prometheus-stack"])
    keys = release_labels()
    release, namespace = "llm-observability", "observability"
    for entry in kustomization["labels"]:
        entry["pairs"].update({k: release for k in keys & set(entry["pairs"])})
    kustomization["namespace"] = namespace
    kustomization["resources"] = [os.path.relpath(K8S, tmp_path)]  # the same base, from the copy's directory
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    docs = kustomize(tmp_path)
    check_kube_prometheus_stack(docs, release)
    assert all(d["metadata"]["namespace"] == namespace for d in docs)
    assert all(d["metadata"]["labels"][k] == release for d in docs for k in keys)
    # nothing else had to change
    assert normalized(docs, keys) == normalized(rendered["kube-prometheus-stack"], keys)
