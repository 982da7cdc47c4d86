"""``trainhealth stack`` and ``trainhealth demo`` as a user runs them: configs, what down stops, bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import replace
from pathlib import Path

import yaml

from tests.e2e.stack_checks import (
    DCGM_SAMPLE,
    RecordedExporter,
    consecutive_free,
    free_ports,
    query,
    require_binaries,
)
from tests.prometheus_server import require_binary
from trainhealth._internal.stack.runner import StackOptions, stack_down, stack_up, write_configs

ROOT = Path(__file__).resolve().parents[2]
TRAINHEALTH = str(Path(sys.executable).parent / "trainhealth")
PACKAGED_ALERTMANAGER = ROOT / "src" / "trainhealth" / "_internal" / "stack" / "alertmanager.yml"
_CAPTURE = dict(capture_output=True, text=True, timeout=30, check=False)


def _run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([TRAINHEALTH, *args], capture_output=True, text=True, timeout=60, check=False, env=env)


def test_the_packaged_alertmanager_config_is_the_deployed_one():
    """One configuration: the wheel carries deploy/'s byte for byte (it has no deploy/), and both say so."""
    deployed = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"
    fix = f"cp {deployed.relative_to(ROOT)} {PACKAGED_ALERTMANAGER.relative_to(ROOT)}"
    assert PACKAGED_ALERTMANAGER.read_text() == deployed.read_text(), f"the packaged copy drifted: {fix}"
    assert fix in deployed.read_text()


def test_configs_point_at_the_chosen_ports_and_cap_for(tmp_path):
    options = StackOptions(
        directory=tmp_path,
        prometheus_port=9999,
        alertmanager_port=9998,
        webhook_port=9997,
        port_base=20000,
        analyzer_port=20010,
        max_for_s=7,
    )
    paths = write_configs(options)
    prometheus = yaml.safe_load(paths["prometheus.yml"].read_text())
    ranks = prometheus["scrape_configs"][0]
    assert ranks["honor_labels"] and ranks["static_configs"][0]["targets"] == [
        f"127.0.0.1:{20000 + r}" for r in range(4)
    ]
    assert prometheus["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["127.0.0.1:9998"]
    rules = [r for g in yaml.safe_load(paths["trainhealth.rules.yml"].read_text())["groups"] for r in g["rules"]]
    assert {r.get("for", "0s") for r in rules} <= {"0s", "1m", "7s"} and any(r.get("for") == "7s" for r in rules)
    assert "127.0.0.1:9997/alerts/page" in paths["alertmanager.yml"].read_text()


def test_alertmanager_groups_are_capped_like_for_and_amtool_accepts_them(tmp_path):
    # a ticket that joins a group already notified (the demo's straggler after its thermal throttling, one host)
    # waits the group's group_interval: 5 minutes in production, longer than the demo
    paths = write_configs(StackOptions(directory=tmp_path, max_for_s=7))
    config = yaml.safe_load(paths["alertmanager.yml"].read_text())
    routes = [config["route"], *config["route"]["routes"]]
    timings = [route[key] for route in routes for key in ("group_wait", "group_interval") if key in route]
    assert "5m" not in timings and set(timings) <= {"0s", "7s"} and "7s" in timings
    assert config["inhibit_rules"] == yaml.safe_load(PACKAGED_ALERTMANAGER.read_text())["inhibit_rules"]
    amtool, written = require_binary("amtool"), str(paths["alertmanager.yml"])
    done = subprocess.run([amtool, "check-config", written], **_CAPTURE)
    assert done.returncode == 0, done.stdout + done.stderr
    done = subprocess.run(
        [amtool, "config", "routes", "test", f"--config.file={written}", "severity=ticket"], **_CAPTURE
    )
    assert done.stdout.strip() == "ticket", done.stderr


def test_down_stops_what_up_started_and_nothing_else(tmp_path):
    require_binaries()
    prometheus_port, alertmanager_port = free_ports(2)
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        options = StackOptions(
            directory=tmp_path, prometheus_port=prometheus_port, alertmanager_port=alertmanager_port, demo=False
        )
        started = stack_up(options)
        assert [s.name for s in started] == ["prometheus", "alertmanager"]
        state = json.loads((tmp_path / "stack.json").read_text())
        # a recorded pid whose start time does not match is someone else's process: left alone
        state.append(
            {"name": "stranger", "pid": bystander.pid, "start_time": "1", "command": [], "log": "-", "token": "0" * 32}
        )
        (tmp_path / "stack.json").write_text(json.dumps(state))
        assert sorted(stack_down(tmp_path)) == ["alertmanager", "prometheus"]
        time.sleep(0.5)
        for entry in started:
            assert (
                not Path(f"/proc/{entry.pid}").exists()
                or "Z" in Path(f"/proc/{entry.pid}/stat").read_text().split(") ")[1][:1]
            )
        assert bystander.poll() is None
        assert not (tmp_path / "stack.json").exists()
    finally:
        bystander.kill()


def test_a_missing_binary_is_one_clear_line(tmp_path):
    env = dict(os.environ, PATH=str(tmp_path))
    done = subprocess.run(
        [sys.executable, "-m", "trainhealth._internal.cli", "stack", "up", "--dir", str(tmp_path / "s")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )
    assert done.returncode == 2
    assert "prometheus not found on PATH" in done.stderr and "docker compose up" in done.stderr
    assert "Traceback" not in done.stderr


def test_demo_bad_input_is_one_line_and_status_2(tmp_path):
    bad = tmp_path / "faults.yaml"
    bad.write_text("- {kind: meteor, step: 3}\n")
    for args, message in (
        (("--ranks", "1"), "argument --ranks: expected an integer from 2 to 16"),
        (("--duration", "5"), "argument --duration: expected a number of seconds from 20 to 86400"),
        (("--faults", str(bad)), "kind must be one of"),
        (("--faults", str(tmp_path / "none.yaml")), "none.yaml"),
    ):
        done = _run("demo", *args, "--out", str(tmp_path / "out"))
        assert done.returncode == 2 and message in done.stderr, (args, done.stderr)
        assert "Traceback" not in done.stderr


def test_scale_out_configs_split_the_targets_and_write_to_the_store(tmp_path):
    options = StackOptions(
        directory=tmp_path, store="victoriametrics", shards=3, store_port=18428, port_base=20000, analyzer_port=20010
    )
    paths = write_configs(options)
    assert sorted(paths) == ["alertmanager.yml", "shard-0.yml", "shard-1.yml", "shard-2.yml", "trainhealth.rules.yml"]
    for number in range(3):
        shard = yaml.safe_load(paths[f"shard-{number}.yml"].read_text())
        assert "rule_files" not in shard and "alerting" not in shard  # vmalert evaluates the rules
        assert shard["remote_write"][0]["url"] == "http://127.0.0.1:18428/api/v1/write"
        for job in shard["scrape_configs"]:
            assert job["honor_labels"] is True
            hashmod, keep = job["relabel_configs"][-2:]
            assert (hashmod["action"], hashmod["modulus"], keep["action"], keep["regex"]) == (
                "hashmod",
                3,
                "keep",
                str(number),
            )
    groups = yaml.safe_load(paths["trainhealth.rules.yml"].read_text())["groups"]
    assert {g["name"]: g.get("interval") for g in groups}["trainhealth-per-job"] == "5s"  # = the scrape interval


def test_scale_out_command_lines(tmp_path):
    require_binaries(StackOptions(store="victoriametrics"))
    from trainhealth._internal.stack.topology import commands

    options = StackOptions(
        directory=tmp_path, store="victoriametrics", shards=2, prometheus_port=19090, store_port=18428, demo=False
    )
    started = dict(commands(options, tmp_path / "demo"))
    assert list(started) == ["victoria-metrics", "shard-0", "shard-1", "vmalert", "alertmanager"]
    assert "-httpListenAddr=127.0.0.1:18428" in started["victoria-metrics"]
    for number, port in ((0, 19090), (1, 19091)):
        shard = started[f"shard-{number}"]
        assert shard[1] in ("--agent", "--enable-feature=agent")
        assert f"--web.listen-address=127.0.0.1:{port}" in shard
    vmalert = started["vmalert"]
    for flag in ("-datasource.url", "-remoteWrite.url", "-remoteRead.url"):
        assert f"{flag}=http://127.0.0.1:18428" in vmalert
    assert "-notifier.url=http://127.0.0.1:9093" in vmalert and "-disableAlertgroupLabel" in vmalert


def test_vmagent_shards_command_lines_and_configs(tmp_path):
    require_binaries(StackOptions(store="victoriametrics", agent="vmagent"))
    from trainhealth._internal.stack.topology import commands

    options = StackOptions(
        directory=tmp_path, store="victoriametrics", agent="vmagent", prometheus_port=19090, store_port=18428
    )
    paths = write_configs(options)
    started = dict(commands(replace(options, demo=False), tmp_path / "demo"))
    assert list(started) == ["victoria-metrics", "shard-0", "shard-1", "vmalert", "alertmanager"]
    for number, port in ((0, 19090), (1, 19091)):
        shard = started[f"shard-{number}"]
        assert Path(shard[0]).name.startswith("vmagent") and f"-httpListenAddr=127.0.0.1:{port}" in shard
        assert "-remoteWrite.url=http://127.0.0.1:18428/api/v1/write" in shard
        assert f"-promscrape.config={paths[f'shard-{number}.yml']}" in shard
        config = yaml.safe_load(paths[f"shard-{number}.yml"].read_text())
        assert sorted(config) == ["global", "scrape_configs"]  # vmagent refuses a remote_write section


def test_vmagent_shards_split_real_targets_between_them_into_the_store(tmp_path):
    options = StackOptions(
        directory=tmp_path / "stack", store="victoriametrics", agent="vmagent", demo=False, scrape_interval_s=1.0
    )
    require_binaries(options)
    ports = free_ports(5)
    options = replace(
        options,
        prometheus_port=consecutive_free(2),
        store_port=ports[0],
        vmalert_port=ports[1],
        alertmanager_port=ports[2],
        webhook_port=ports[3],
        analyzer_port=ports[4],
    )
    exporters = [RecordedExporter(DCGM_SAMPLE.read_bytes()) for _ in range(6)]
    addresses = [f"127.0.0.1:{e.port}" for e in exporters]
    started = stack_up(options)
    try:
        for number in range(options.shards):  # the recorded exporters as one more job of every shard
            path = options.directory / f"shard-{number}.yml"
            config = yaml.safe_load(path.read_text())
            relabel = config["scrape_configs"][0]["relabel_configs"]
            job = {"job_name": "recorded", "static_configs": [{"targets": addresses}], "relabel_configs": relabel}
            config["scrape_configs"].append(job)
            path.write_text(yaml.safe_dump(config, sort_keys=False))
            os.kill(next(s.pid for s in started if s.name == f"shard-{number}"), signal.SIGHUP)
        deadline = time.monotonic() + 90
        per_target: list[dict] = []
        while time.monotonic() < deadline and len(per_target) < len(addresses):
            time.sleep(1)
            per_target = query(options.store_port, 'count by (instance) (DCGM_FI_DEV_GPU_TEMP{job="recorded"})')
        # every target reached the store once (one series each: no shard wrote it twice)
        assert sorted((r["metric"]["instance"], r["value"][1]) for r in per_target) == sorted(
            (a, "1") for a in addresses
        )
        scraped = []  # by each shard (vmagent hashes with xxhash where Prometheus uses MD5: another split)
        for number in range(options.shards):
            url = f"http://127.0.0.1:{options.prometheus_port + number}/api/v1/targets"
            with urllib.request.urlopen(url, timeout=10) as response:
                active = json.loads(response.read())["data"]["activeTargets"]
            scraped += [t["labels"]["instance"] for t in active if t["labels"]["job"] == "recorded"]
        assert sorted(scraped) == sorted(addresses)  # each target by exactly one shard
    finally:
        stack_down(options.directory)
        for exporter in exporters:
            exporter.close()


def test_stack_up_bad_scale_out_options_are_one_line(tmp_path):
    for args, message in (
        (("--agent", "vmagent"), "--agent vmagent: only with --store victoriametrics"),
        (("--store", "mimir"), "argument --store: invalid choice: 'mimir'"),
        (("--store", "victoriametrics", "--shards", "0"), "argument --shards: expected"),
        (("--store", "victoriametrics", "--store-port", "9093"), "each needs a port of its own"),
        (("--store", "victoriametrics", "--prometheus-port", "65535"), "above 65535"),
    ):
        done = _run("stack", "up", "--dir", str(tmp_path / "s"), "--no-demo", *args)
        assert done.returncode == 2 and message in done.stderr, (args, done.stderr)
        assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert not (tmp_path / "s").exists()
