"""Grafana dashboards generated with grafanalib from the metric catalogue (``trainhealth dashboards``)."""
