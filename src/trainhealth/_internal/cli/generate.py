"""``trainhealth alerts``: write the Prometheus rule file, the PrometheusRule manifest and the runbooks."""

from __future__ import annotations

import argparse
from pathlib import Path

from trainhealth._internal._files import check_output_file, check_output_files
from trainhealth._internal.errors import UsageError

__all__ = ["add_commands"]


def _check_url(option: str, value: str) -> None:
    if not value.startswith(("http://", "https://")) or any(c.isspace() for c in value) or "?" in value or "#" in value:
        raise UsageError(f"{option} must be an http(s) URL without a query or fragment, got {value!r}")


def _cmd_alerts(args: argparse.Namespace) -> int:
    from trainhealth._internal.alerts.render import write_alerts
    from trainhealth._internal.alerts.rules import ALERTS

    if not args.runbook_base.startswith(("http://", "https://")) or any(c.isspace() for c in args.runbook_base):
        raise UsageError(f"--runbook-base must be an http(s) URL, got {args.runbook_base!r}")
    _check_url("--grafana-url", args.grafana_url)
    out = Path(args.out)
    operator_out = Path(args.operator_out) if args.operator_out else None
    runbooks = Path(args.runbooks) if args.runbooks else None
    targets = [("--out", out, ["trainhealth.rules.yml"] + ([] if operator_out else ["prometheusrule.yaml"]))]
    if operator_out is not None:
        targets.append(("--operator-out", operator_out, ["prometheusrule.yaml"]))
    if runbooks is not None:
        targets.append(("--runbooks", runbooks, ["README.md"] + [f"{rule.name}.md" for rule in ALERTS]))
    for option, directory, names in targets:  # everything checked before anything is written
        check_output_files(directory, names, option)
    try:
        written = write_alerts(out, runbooks, args.runbook_base, operator_out, args.grafana_url)
    except OSError as exc:
        raise UsageError(f"cannot write {exc.filename}: {exc.strerror}") from None
    print(
        f"{len(ALERTS)} alert rules: {written[0]}, {written[1]}"
        + (f"; {len(written) - 2} runbooks in {args.runbooks}" if args.runbooks else "")
    )
    return 0


def _cmd_dashboards(args: argparse.Namespace) -> int:
    from trainhealth._internal.alerts.rules import ALERTS
    from trainhealth._internal.dashboards.render import DASHBOARDS, write_configmap, write_dashboards

    out = Path(args.out)
    check_output_files(out, [f"{uid}.json" for uid in DASHBOARDS], "--out")
    if args.configmap:
        check_output_file(Path(args.configmap), "--configmap")
    try:
        written = write_dashboards(out, ALERTS)  # the alerts' limits are drawn on the panels they name
        if args.configmap:
            written.append(write_configmap(Path(args.configmap), ALERTS))
    except OSError as exc:
        raise UsageError(f"cannot write {exc.filename}: {exc.strerror}") from None
    print(f"{len(written)} files: " + ", ".join(str(p) for p in written))
    return 0


def add_commands(commands: argparse._SubParsersAction, parser_class: type[argparse.ArgumentParser]) -> None:
    from trainhealth._internal.alerts.rules import GRAFANA_URL, RUNBOOK_BASE

    alerts = commands.add_parser(
        "alerts",
        help="write the Prometheus alert rules (rule file and PrometheusRule) and their runbooks",
        description="Writes trainhealth.rules.yml (for rule_files) and prometheusrule.yaml (Prometheus Operator) "
        "into OUT; with --runbooks, one Markdown runbook per alert.",
    )
    alerts.add_argument("--out", required=True, metavar="DIR", help="directory for the rule files")
    alerts.add_argument("--runbooks", metavar="DIR", help="also write the runbooks here (docs/runbooks)")
    alerts.add_argument(
        "--operator-out", metavar="DIR", help="write prometheusrule.yaml here instead of OUT (deploy/k8s)"
    )
    alerts.add_argument(
        "--runbook-base", default=RUNBOOK_BASE, metavar="URL", help=f"where runbook_url points (default {RUNBOOK_BASE})"
    )
    alerts.add_argument(
        "--grafana-url",
        default=GRAFANA_URL,
        metavar="URL",
        help=f"the Grafana each rule's dashboard_url points into (default {GRAFANA_URL})",
    )
    alerts.set_defaults(handler=_cmd_alerts)
    dashboards = commands.add_parser(
        "dashboards",
        help="write the Grafana dashboards as JSON",
        description="Writes the training, GPU, communication and incidents dashboards (Grafana JSON, stable uids "
        "and panel ids) into OUT, ready for Grafana's file provisioning.",
    )
    dashboards.add_argument("--out", required=True, metavar="DIR", help="directory for the dashboard files")
    dashboards.add_argument(
        "--configmap", metavar="FILE", help="also write them as a Kubernetes ConfigMap for Grafana's dashboard sidecar"
    )
    dashboards.set_defaults(handler=_cmd_dashboards)
