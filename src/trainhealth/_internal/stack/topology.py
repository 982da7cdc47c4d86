"""What ``trainhealth stack up`` runs: the configs it writes and the command line of each process.

Two topologies, chosen with ``--store``:

- ``prometheus``: one Prometheus scrapes every target, evaluates the rules and sends alerts to Alertmanager.
- ``victoriametrics``: the scale-out recipe of docs/scale.md on one machine. ``shards`` Prometheus servers in
  agent mode (or ``vmagent``s, ``agent="vmagent"``: a fraction of their memory per series) split the targets
  between them (``hashmod`` relabelling on the target's address: each target is scraped by exactly one
  shard) and ``remote_write`` everything into a VictoriaMetrics store; ``vmalert``
  evaluates the same rule file against the store, writes the recording rules' results and the ``ALERTS``
  series back into it and sends alerts to Alertmanager. Every query (dashboards, ``trainhealth analyze
  --prometheus``) goes to the store's Prometheus API.

>>> options = StackOptions(store="victoriametrics", shards=2)
>>> query_url(options)
'http://127.0.0.1:8428'
>>> [name for name in config_names(options)]
['shard-0.yml', 'shard-1.yml', 'trainhealth.rules.yml', 'alertmanager.yml']
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import yaml

from trainhealth._internal._files import write_text
from trainhealth._internal.alerts.render import rule_file_yaml
from trainhealth._internal.alerts.rules import SUSTAINED_FOR_S
from trainhealth._internal.errors import UsageError

__all__ = [
    "AGENTS",
    "STORES",
    "StackOptions",
    "commands",
    "config_names",
    "find_binary",
    "log_names",
    "query_url",
    "shard_config",
    "vmagent_sd_flags",
    "write_configs",
]

STORES = ("prometheus", "victoriametrics")
#: What the shards of ``store="victoriametrics"`` are: Prometheus servers in agent mode, or vmagents.
AGENTS = ("prometheus", "vmagent")
#: Each binary and the names distributions give it (Debian: prometheus-alertmanager); the package to install.
BINARIES = {
    "prometheus": (("prometheus",), "prometheus"),
    "alertmanager": (("alertmanager", "prometheus-alertmanager"), "prometheus-alertmanager"),
    "victoria-metrics": (("victoria-metrics", "victoria-metrics-prod"), "victoria-metrics"),
    "vmalert": (("vmalert", "vmalert-prod"), "victoria-metrics"),
    "vmagent": (("vmagent", "vmagent-prod"), "victoria-metrics"),
}
RULES = "trainhealth.rules.yml"
ALERTMANAGER = "alertmanager.yml"


@dataclass(frozen=True)
class StackOptions:
    directory: Path = Path(".trainhealth-stack")
    #: Prometheus's port; with ``store="victoriametrics"`` the shards listen on this port and the next ones.
    prometheus_port: int = 9090
    alertmanager_port: int = 9093
    webhook_port: int = 9096
    ranks: int = 4
    port_base: int = 9450
    analyzer_port: int = 9448
    scrape_interval_s: float = 5.0
    max_for_s: float = 30.0
    demo: bool = True
    demo_duration_s: float = 600.0
    demo_args: tuple[str, ...] = ()
    store: str = "prometheus"
    shards: int = 2
    agent: str = "prometheus"  # with the store: the shards are Prometheus agents or vmagents
    store_port: int = 8428
    vmalert_port: int = 8880


def find_binary(name: str) -> str:
    """The path of one of :data:`BINARIES` on PATH; a UsageError naming the package to install."""
    candidates, package = BINARIES[name]
    for candidate in candidates:
        path = shutil.which(candidate)
        if path:
            return path
    raise UsageError(
        f"{name} not found on PATH (looked for {', '.join(candidates)}): install it "
        f"(Debian/Ubuntu: apt-get install {package}), or use docker compose up"
    )


def needed_binaries(options: StackOptions) -> tuple[str, ...]:
    if options.store == "victoriametrics":
        return (options.agent, "victoria-metrics", "vmalert", "alertmanager")
    return ("prometheus", "alertmanager")


def query_url(options: StackOptions) -> str:
    """Where queries go: Prometheus, or the store's Prometheus API."""
    port = options.store_port if options.store == "victoriametrics" else options.prometheus_port
    return f"http://127.0.0.1:{port}"


def config_names(options: StackOptions) -> tuple[str, ...]:
    """The files :func:`write_configs` writes into the state directory."""
    scrapers = [f"shard-{n}.yml" for n in range(options.shards)] if options.store == "victoriametrics" else []
    return (*(scrapers or ["prometheus.yml"]), RULES, ALERTMANAGER)


def log_names(options: StackOptions) -> tuple[str, ...]:
    """The logs of the processes :func:`commands` starts (the demo's included)."""
    return tuple(f"{name}.log" for name in _process_names(options)) + ("demo.log",)


def _process_names(options: StackOptions) -> list[str]:
    if options.store == "victoriametrics":
        return ["victoria-metrics", *(f"shard-{n}" for n in range(options.shards)), "vmalert", "alertmanager"]
    return ["prometheus", "alertmanager"]


def _duration(seconds: float) -> str:
    """A Prometheus duration (whole units only: ``5s``, ``1500ms``)."""
    return f"{int(seconds)}s" if float(seconds).is_integer() else f"{round(seconds * 1000)}ms"


def _scrape_jobs(options: StackOptions) -> list[dict[str, object]]:
    """The ranks' and the analyzer's scrape jobs."""
    targets = {
        "trainhealth-ranks": [f"127.0.0.1:{options.port_base + r}" for r in range(options.ranks)],
        "trainhealth-analyzer": [f"127.0.0.1:{options.analyzer_port}"],
    }
    return [
        {
            "job_name": name,
            "honor_labels": True,  # the exporters' job, host and rank labels survive into the store
            "static_configs": [{"targets": addresses}],
        }
        for name, addresses in targets.items()
    ]


def _prometheus_config(options: StackOptions) -> dict[str, object]:
    interval = _duration(options.scrape_interval_s)
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [RULES],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{options.alertmanager_port}"]}]}]},
        "scrape_configs": _scrape_jobs(options),
    }


def shard_config(prometheus: dict, shard: int, shards: int, write_url: str | None) -> dict[str, object]:
    """Prometheus config ``prometheus`` as shard ``shard`` of ``shards``: an agent that scrapes only the targets
    whose address hashes to it (every target goes to exactly one shard, so no series is written twice and no
    shard label is needed) and sends every sample to ``write_url``; the rules and alerting are left to the
    store's ruler. ``write_url`` None: a vmagent's config, which refuses two things a Prometheus agent takes, so
    both become flags: the ``remote_write`` section (``-remoteWrite.url``) and the service discoveries'
    ``refresh_interval`` (:func:`vmagent_sd_flags`).

    >>> config = {"global": {"scrape_interval": "5s"}, "rule_files": ["r.yml"],
    ...           "scrape_configs": [{"job_name": "a", "static_configs": [{"targets": ["h:1"]}]},
    ...                              {"job_name": "b", "dns_sd_configs": [{"names": ["x"], "refresh_interval": "9s"}]}]}
    >>> agent = shard_config(config, 1, 2, "http://store:8428/api/v1/write")
    >>> sorted(agent), agent["scrape_configs"][0]["relabel_configs"][-1]
    (['global', 'remote_write', 'scrape_configs'], {'source_labels': ['__tmp_shard'], 'regex': '1', 'action': 'keep'})
    >>> vmagent = shard_config(config, 1, 2, None)
    >>> sorted(vmagent), vmagent["scrape_configs"][1]["dns_sd_configs"]
    (['global', 'scrape_configs'], [{'names': ['x']}])
    """
    interval = prometheus["global"]["scrape_interval"]
    jobs = [
        {**job, "relabel_configs": [*job.get("relabel_configs", []), *_hashmod_keep(shard, shards)]}
        for job in prometheus["scrape_configs"]
    ]
    if write_url is None:
        jobs = [_without_refresh_intervals(job) for job in jobs]
    config: dict[str, object] = {"global": {"scrape_interval": interval}, "scrape_configs": jobs}
    if write_url is not None:  # samples reach the store within one scrape interval
        config["remote_write"] = [{"url": write_url, "queue_config": {"batch_send_deadline": interval}}]
    return config


_DISCOVERIES = "_sd_configs"  # dns_sd_configs, file_sd_configs, consul_sd_configs, ...


def vmagent_sd_flags(prometheus: dict) -> list[str]:
    """The flags that give a vmagent the service discoveries' ``refresh_interval`` of Prometheus config
    ``prometheus``: vmagent refuses the key in its config and takes one interval per kind of discovery,
    ``-promscrape.<kind>SDCheckInterval`` (the shortest where jobs differ).

    >>> vmagent_sd_flags({"scrape_configs": [
    ...     {"job_name": "a", "dns_sd_configs": [{"names": ["x"], "refresh_interval": "1m"}]},
    ...     {"job_name": "b", "dns_sd_configs": [{"names": ["y"], "refresh_interval": "10s"}]},
    ...     {"job_name": "c", "static_configs": [{"targets": ["h:1"]}]}]})
    ['-promscrape.dnsSDCheckInterval=10s']
    """
    shortest: dict[str, str] = {}
    for job in prometheus["scrape_configs"]:
        for key, discoveries in job.items():
            if not key.endswith(_DISCOVERIES):
                continue
            kind = key.removesuffix(_DISCOVERIES)
            for interval in (d["refresh_interval"] for d in discoveries if "refresh_interval" in d):
                if kind not in shortest or _seconds(interval) < _seconds(shortest[kind]):
                    shortest[kind] = interval
    return [f"-promscrape.{kind}SDCheckInterval={interval}" for kind, interval in sorted(shortest.items())]


def _without_refresh_intervals(job: dict) -> dict:
    """Scrape job ``job`` without its service discoveries' ``refresh_interval`` (for vmagent: a flag)."""
    return {
        key: [{k: v for k, v in d.items() if k != "refresh_interval"} for d in value]
        if key.endswith(_DISCOVERIES)
        else value
        for key, value in job.items()
    }


def _hashmod_keep(shard: int, shards: int) -> list[dict[str, object]]:
    """Relabelling that keeps a target only when its address hashes to ``shard`` (of ``shards``)."""
    return [
        {"source_labels": ["__address__"], "modulus": shards, "target_label": "__tmp_shard", "action": "hashmod"},
        {"source_labels": ["__tmp_shard"], "regex": str(shard), "action": "keep"},
    ]


def write_configs(options: StackOptions) -> dict[str, Path]:
    """The configs of the chosen topology in the state directory, by file name."""
    directory = options.directory
    directory.mkdir(parents=True, exist_ok=True)
    paths = {name: directory / name for name in config_names(options)}
    header = "# Written by trainhealth stack up.\n"
    if options.store == "victoriametrics":
        for shard in range(options.shards):
            write_url = f"http://127.0.0.1:{options.store_port}/api/v1/write"
            # vmagent's scrape config has no remote_write section: the store's URL is a flag
            sends_to = write_url if options.agent == "prometheus" else None
            config = shard_config(_prometheus_config(options), shard, options.shards, sends_to)
            write_text(paths[f"shard-{shard}.yml"], header + yaml.safe_dump(config, sort_keys=False))
    else:
        write_text(paths["prometheus.yml"], header + yaml.safe_dump(_prometheus_config(options), sort_keys=False))
    # with every ``for`` capped under the sustained groups' threshold (a demo), those groups run as often as the
    # scrapes, so the demo's last minute is recorded and judged too; with production ``for``s, once a minute
    slow = "1m" if options.max_for_s >= SUSTAINED_FOR_S else _duration(options.scrape_interval_s)
    rules = rule_file_yaml(
        max_for_s=options.max_for_s, slow_interval=slow, block_interval="3m" if slow == "1m" else slow
    )
    write_text(paths[RULES], rules)
    template = resources.files("trainhealth._internal.stack").joinpath(ALERTMANAGER).read_text(encoding="utf-8")
    alertmanager = _cap_grouping(template, options.max_for_s)
    write_text(paths[ALERTMANAGER], alertmanager.replace("127.0.0.1:9096", f"127.0.0.1:{options.webhook_port}"))
    return paths


_GROUP_TIMING = re.compile(r"^(?P<key>\s*group_(?:wait|interval): )(?P<value>\S+)$", re.MULTILINE)
_DURATION_PART = re.compile(r"(\d+)(ms|s|m|h|d|w)")
_UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def _seconds(duration: str) -> float:
    """A Prometheus duration in seconds.

    >>> _seconds("1m30s"), _seconds("1500ms")
    (90, 1.5)
    """
    return sum(int(n) * _UNIT_S[unit] for n, unit in _DURATION_PART.findall(duration))


def _cap_grouping(config: str, cap_s: float) -> str:
    """Alertmanager's config with every ``group_wait`` and ``group_interval`` capped at ``cap_s``, as the rules'
    ``for``: a short demo sees each alert sent, even one that joins a group already notified (it would wait
    the group's ``group_interval``, 5 minutes, behind the first). The comments stay.

    >>> print(_cap_grouping("route:\\n  group_wait: 30s\\n  group_interval: 5m\\n    group_wait: 0s", 10))
    route:
      group_wait: 10s
      group_interval: 10s
        group_wait: 0s
    """

    def capped(match: re.Match[str]) -> str:
        return match["key"] + (_duration(cap_s) if _seconds(match["value"]) > cap_s else match["value"])

    return _GROUP_TIMING.sub(capped, config)


def commands(options: StackOptions, demo_out: Path) -> list[tuple[str, list[str]]]:
    """Each process to start, in order (the store before its writers, the demo last), and its command line."""
    directory = options.directory
    listen = "127.0.0.1"
    alertmanager = [
        find_binary("alertmanager"),
        f"--config.file={directory / ALERTMANAGER}",
        f"--storage.path={directory / 'alertmanager-data'}",
        f"--web.listen-address={listen}:{options.alertmanager_port}",
        "--cluster.listen-address=",
    ]
    started: list[tuple[str, list[str]]]
    if options.store == "victoriametrics":
        store = query_url(options)
        # queries see samples this many seconds old at most (VictoriaMetrics's default, 30 s, suits a
        # remote_write delay of minutes; the shards here send within one scrape interval)
        latency = _duration(2 * options.scrape_interval_s)
        started = [
            (
                "victoria-metrics",
                [
                    find_binary("victoria-metrics"),
                    f"-storageDataPath={directory / 'victoria-metrics-data'}",
                    f"-httpListenAddr={listen}:{options.store_port}",
                    f"-search.latencyOffset={latency}",
                ],
            ),
            *((f"shard-{shard}", _shard_command(options, shard)) for shard in range(options.shards)),
            (
                "vmalert",
                [
                    find_binary("vmalert"),
                    f"-rule={directory / RULES}",
                    f"-datasource.url={store}",
                    f"-remoteWrite.url={store}",  # recording rules' results and ALERTS, back into the store
                    f"-remoteRead.url={store}",  # alerts' state survives a restart
                    f"-notifier.url=http://{listen}:{options.alertmanager_port}",
                    f"-evaluationInterval={_duration(options.scrape_interval_s)}",
                    f"-httpListenAddr={listen}:{options.vmalert_port}",
                    "-disableAlertgroupLabel",  # alerts carry the labels Prometheus gives them, no more
                ],
            ),
            ("alertmanager", alertmanager),
        ]
    else:
        started = [
            (
                "prometheus",
                [
                    find_binary("prometheus"),
                    f"--config.file={directory / 'prometheus.yml'}",
                    f"--storage.tsdb.path={directory / 'prometheus-data'}",
                    f"--web.listen-address={listen}:{options.prometheus_port}",
                ],
            ),
            ("alertmanager", alertmanager),
        ]
    if options.demo:
        started.append(("demo", _demo_command(options, demo_out)))
    return started


def _shard_command(options: StackOptions, shard: int) -> list[str]:
    """Scraping shard ``shard``: a Prometheus agent, or a vmagent, reading ``shard-N.yml`` (both reload it on
    SIGHUP) and sending to the store; its port is the shards' first plus ``shard``."""
    directory, listen = options.directory, f"127.0.0.1:{options.prometheus_port + shard}"
    config, data = directory / f"shard-{shard}.yml", directory / f"shard-{shard}-data"
    if options.agent == "vmagent":
        return [
            find_binary("vmagent"),
            f"-promscrape.config={config}",
            *vmagent_sd_flags(_prometheus_config(options)),  # none here: the stack's targets are static
            f"-remoteWrite.url={query_url(options)}/api/v1/write",
            f"-remoteWrite.tmpDataPath={data}",  # samples the store has not taken yet, on disk
            f"-httpListenAddr={listen}",
        ]
    prometheus = find_binary("prometheus")
    return [
        prometheus,
        _agent_flag(prometheus),
        f"--config.file={config}",
        f"--storage.agent.path={data}",
        f"--web.listen-address={listen}",
    ]


def _demo_command(options: StackOptions, out: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "trainhealth._internal.cli",
        "demo",
        "--addr",
        "127.0.0.1",
        "--duration",
        f"{options.demo_duration_s:g}",
        "--ranks",
        str(options.ranks),
        "--port-base",
        str(options.port_base),
        "--analyzer-port",
        str(options.analyzer_port),
        "--webhook-port",
        str(options.webhook_port),
        "--out",
        str(out),
        *options.demo_args,
    ]


def _agent_flag(prometheus: str) -> str:
    """Agent mode is ``--agent`` from Prometheus 3 on, ``--enable-feature=agent`` before."""
    try:
        version = subprocess.run([prometheus, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UsageError(f"{prometheus} --version failed: {exc}") from None
    found = re.search(r"version (\d+)\.", version)
    if found is None:
        raise UsageError(f"{prometheus} --version: no version in {version.strip()[:80]!r}")
    return "--agent" if int(found.group(1)) >= 3 else "--enable-feature=agent"
