"""A real Prometheus server for tests: the Debian package's binary, on 127.0.0.1, in a temporary directory."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.distributed import free_port


def require_binary(name: str) -> str:
    """The path of ``name``; skips the test when it is missing, unless CI demands it (then fails)."""
    found = shutil.which(name)
    if found:
        return found
    message = f"{name} is not installed (Debian package; .ci/run installs it)"
    if os.environ.get("TRAINHEALTH_REQUIRE_BINARIES"):
        pytest.fail(message)
    pytest.skip(message)


@dataclass
class Prometheus:
    url: str
    process: subprocess.Popen
    log: Path

    def query(self, promql: str) -> list[dict]:
        with urllib.request.urlopen(
            f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}", timeout=10
        ) as response:
            return json.loads(response.read())["data"]["result"]

    def wait_for(self, promql: str, timeout_s: float = 60.0) -> list[dict]:
        """Poll until ``promql`` returns something."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            result = self.query(promql)
            if result:
                return result
            time.sleep(0.5)
        raise TimeoutError(f"Prometheus never answered {promql!r}; log:\n{self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()


def start_prometheus(
    directory: Path,
    targets: list[str],
    scrape_interval: str = "1s",
    rule_files: list[str] | None = None,
    extra: dict | None = None,
) -> Prometheus:
    """Start Prometheus scraping ``targets`` (host:port) as job "trainhealth"; waits until it is ready."""
    binary = require_binary("prometheus")
    directory.mkdir(parents=True, exist_ok=True)
    config = {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
        "scrape_configs": [{"job_name": "trainhealth", "honor_labels": True, "static_configs": [{"targets": targets}]}],
        **({"rule_files": rule_files} if rule_files else {}),
        **(extra or {}),
    }
    (directory / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = directory / "prometheus.log"
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={directory / 'prometheus.yml'}",
            f"--storage.tsdb.path={directory / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--web.enable-lifecycle",
        ],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )
    server = Prometheus(f"http://127.0.0.1:{port}", process, log)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"Prometheus exited: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{server.url}/-/ready", timeout=2) as response:
                if response.status == 200:
                    return server
        except OSError:
            time.sleep(0.2)
    server.stop()
    raise TimeoutError("Prometheus did not become ready")
