"""Alerting: the advice catalogue (and, later, alert rules, Alertmanager config and runbooks)."""
