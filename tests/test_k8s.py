"""deploy/k8s: built-in kinds validated against the Kubernetes schemas (kubernetes-validate), Prometheus
Operator resources checked structurally and against each other and the generated rules and dashboards."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from trainhealth.alerts.render import prometheus_rule_yaml
from trainhealth.dashboards.render import DASHBOARDS

K8S = Path(__file__).resolve().parents[1] / "deploy" / "k8s"
OPERATOR_KINDS = {"PodMonitor", "ServiceMonitor", "PrometheusRule"}


def _documents() -> list[tuple[str, dict]]:
    return [(path.name, doc) for path in sorted(K8S.glob("*.yaml")) for doc in yaml.safe_load_all(path.read_text())
            if doc]


def _kind(kind: str) -> list[dict]:
    return [doc for _, doc in _documents() if doc["kind"] == kind]


def test_builtin_kinds_match_the_kubernetes_schema():
    validator = pytest.importorskip("kubernetes_validate")
    checked = 0
    for name, doc in _documents():
        if doc["kind"] in OPERATOR_KINDS:
            continue
        validator.validate(doc, "1.30.0", strict=True)  # raises on a wrong or unknown field
        checked += 1
    assert checked >= 4  # Deployment, Service, Pod example, dashboards ConfigMap


def test_operator_resources_are_well_formed():
    for _, doc in _documents():
        if doc["kind"] in OPERATOR_KINDS:
            assert doc["apiVersion"] == "monitoring.coreos.com/v1"
            assert doc["metadata"]["name"] and doc["metadata"]["namespace"]
    (podmonitor,) = _kind("PodMonitor")
    endpoints = podmonitor["spec"]["podMetricsEndpoints"]
    assert all(e["honorLabels"] is True for e in endpoints)  # keep the ranks' job/host/rank labels
    (pod,) = _kind("Pod")
    ports = {p["name"]: p["containerPort"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
    assert [e["port"] for e in endpoints] == [f"th-rank-{i}" for i in range(8)]
    assert all(ports[f"th-rank-{i}"] == 9450 + i for i in range(8))
    labels = pod["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in podmonitor["spec"]["selector"]["matchLabels"].items())
    assert podmonitor["spec"]["jobLabel"] in labels


def test_the_analyzer_service_and_its_monitor_select_the_deployment():
    (deployment,) = _kind("Deployment")
    (service,) = _kind("Service")
    (monitor,) = _kind("ServiceMonitor")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert all(pod_labels[k] == v for k, v in service["spec"]["selector"].items())
    assert all(service["metadata"]["labels"][k] == v for k, v in monitor["spec"]["selector"]["matchLabels"].items())
    assert monitor["spec"]["endpoints"][0]["port"] in {p["name"] for p in service["spec"]["ports"]}
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:2] == ["analyze", "--prometheus"] and "--addr" in args
    assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True


def test_generated_manifests_carry_the_current_rules_and_dashboards():
    (rule,) = _kind("PrometheusRule")
    assert rule["spec"] == yaml.safe_load(prometheus_rule_yaml())["spec"]
    (configmap,) = [d for d in _kind("ConfigMap") if d["metadata"]["name"] == "trainhealth-dashboards"]
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert sorted(configmap["data"]) == sorted(f"{uid}.json" for uid in DASHBOARDS)
    assert all(json.loads(text)["uid"] for text in configmap["data"].values())
