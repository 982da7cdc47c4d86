"""Group membership at 16,384 ranks on real stores: Prometheus and VictoriaMetrics (Debian packages, on
127.0.0.1) scrape one page holding every rank's series, as a job of 16,384 ranks with tensor parallel 4 exports
them: the world group, 4,096 tensor-parallel groups of 4 and four data-parallel groups of 4,096.

Then one rank dies (its series leave the page) while its data-parallel peers wait in an all-reduce past the hang
threshold, and in another data-parallel group a rank that never reported at all holds its peers. ``trainhealth
analyze --prometheus URL --once --json`` must name both on each store (the dead one from its own last membership
series, the silent one from its group's stride), the RankMissing rule (Prometheus, and vmalert on VictoriaMetrics)
must name the dead one alone, and no label value in either store may be longer than a few hundred bytes: a
member list of a 4,096-rank group would be 21.8 KB, and VictoriaMetrics cuts label values at 16 KB.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.prometheus_server import require_binary, start_prometheus
from trainhealth._internal import catalog
from trainhealth._internal._ports import free_port

pytestmark = pytest.mark.slow  # a minute: two stores take in 200,000 series

RULES = Path(__file__).resolve().parents[2] / "deploy/prometheus/trainhealth.rules.yml"
TRAINHEALTH = str(Path(sys.executable).parent / "trainhealth")
WORLD_SIZE, TP = 16384, 4
DP = WORLD_SIZE // TP
JOB = "llm-405b-0412"
WORLD = "default_pg:0"
# both at the end of their data-parallel groups, where a member list cut at 16 KB would have lost them
DEAD = 16381  # data-parallel group 1, group rank 4095: its process dies, its series leave the page
SILENT = 16378  # data-parallel group 2, group rank 4094: never reported anything (its exporter never came up)
SCRAPE_S = 5
#: the longest label value either store may hold: a rank's identity, a group's name, a number
LONGEST_LABEL = 200


def _tp(rank: int) -> str:
    return f"mesh_tp:{1 + rank // TP}"


def _dp(rank: int) -> str:
    return f"mesh_dp:{1 + DP + rank % TP}"


def _page(dead: bool) -> bytes:
    """Every rank's series as its exporter would serve them (identity labels included, for ``honor_labels``):
    all at collective #100 of each group; with ``dead``, rank DEAD gone and its and SILENT's data-parallel peers
    40 s into all-reduce #101."""
    member, started = catalog.COMM_GROUP_MEMBER.prometheus_name, catalog.COMM_STARTED_SEQ.prometheus_name
    completed, inflight = catalog.COMM_COMPLETED_SEQ.prometheus_name, catalog.COMM_INFLIGHT_DURATION.prometheus_name
    threshold, watched = catalog.COMM_HANG_THRESHOLD.prometheus_name, catalog.COMM_WATCH_TIMESTAMP.prometheus_name
    now = time.time()
    lines = []
    for rank in range(WORLD_SIZE):
        if rank == SILENT or dead and rank == DEAD:
            continue
        who = f'job="{JOB}",host="node-{rank // 8}",rank="{rank}"'
        waits = dead and rank % TP in (DEAD % TP, SILENT % TP)
        for group, position, size in (
            (WORLD, rank, WORLD_SIZE),
            (_tp(rank), rank % TP, TP),
            (_dp(rank), rank // TP, DP),
        ):
            lines.append(f'{member}{{{who},group="{group}",group_rank="{position}",size="{size}"}} 1')
            lines.append(f'{started}{{{who},group="{group}"}} {101 if waits and group == _dp(rank) else 100}')
            lines.append(f'{completed}{{{who},group="{group}"}} 100')
        lines.append(f'{inflight}{{{who},op="all_reduce",group="{_dp(rank)}"}} {40.0 if waits else 0.0}')
        lines.append(f"{threshold}{{{who}}} 10")
        lines.append(f"{watched}{{{who}}} {now:.3f}")
    return ("\n".join(lines) + "\n").encode()


class _Ranks:
    """The page on 127.0.0.1 (``/metrics``); it also takes vmalert's notifications (POST), and drops them."""

    def __init__(self, page: bytes) -> None:
        self.page = page
        ranks = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                body = ranks.page
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):  # a store stopping mid-scrape
                    return

            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.target = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _get(url: str, path: str, **params: str) -> Any:
    query = f"?{urllib.parse.urlencode(params)}" if params else ""
    with urllib.request.urlopen(f"{url}{path}{query}", timeout=30) as response:
        return json.loads(response.read())["data"]


def _count(url: str, promql: str) -> int:
    result = _get(url, "/api/v1/query", query=f"count({promql})")["result"]
    return int(float(result[0]["value"][1])) if result else 0


def _until(what: str, check: Callable[[], bool], timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"never: {what}")
        time.sleep(0.5)


def _start(name: str, command: list[str], log: Path, ready: str) -> subprocess.Popen:
    process = subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT)

    def up() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(ready, timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    _until(f"{name} ready", up, 60.0)
    return process


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """The ranks' page, Prometheus (with the rule file) and VictoriaMetrics scraping it, vmalert on the latter."""
    for name in ("prometheus", "victoria-metrics", "vmalert"):
        require_binary(name)
    ranks = _Ranks(_page(dead=False))
    processes: list[subprocess.Popen] = []
    prometheus = None
    try:
        prometheus = start_prometheus(
            tmp_path / "prometheus", [ranks.target], scrape_interval=f"{SCRAPE_S}s", rule_files=[str(RULES)]
        )
        vm_port, vmalert_port = free_port(), free_port()
        vm = f"http://127.0.0.1:{vm_port}"
        scrape = {
            "global": {"scrape_interval": f"{SCRAPE_S}s"},
            "scrape_configs": [
                {"job_name": "ranks", "honor_labels": True, "static_configs": [{"targets": [ranks.target]}]}
            ],
        }
        (tmp_path / "vm-scrape.yml").write_text(yaml.safe_dump(scrape))
        vm_command = [
            require_binary("victoria-metrics"),
            f"-storageDataPath={tmp_path / 'vm-data'}",
            f"-httpListenAddr=127.0.0.1:{vm_port}",
            f"-promscrape.config={tmp_path / 'vm-scrape.yml'}",
            "-promscrape.maxScrapeSize=268435456",  # the page is some 20 MB; the default takes 16 MB
            f"-search.latencyOffset={SCRAPE_S}s",  # the default, 30 s, hides the last scrapes from queries
            "-search.disableCache",
        ]
        processes.append(_start("victoria-metrics", vm_command, tmp_path / "vm.log", f"{vm}/health"))
        vmalert_command = [
            require_binary("vmalert"),
            f"-rule={RULES}",
            f"-datasource.url={vm}",
            f"-remoteWrite.url={vm}",  # recording rules' results, which alert rules may read, back into the store
            f"-notifier.url=http://{ranks.target}",
            f"-evaluationInterval={SCRAPE_S}s",
            f"-httpListenAddr=127.0.0.1:{vmalert_port}",
            "-disableAlertgroupLabel",
        ]
        vmalert = f"http://127.0.0.1:{vmalert_port}"
        processes.append(_start("vmalert", vmalert_command, tmp_path / "vmalert.log", f"{vmalert}/-/ready"))
        yield {"ranks": ranks, "prometheus": prometheus.url, "vm": vm, "vmalert": vmalert}
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
        if prometheus is not None:
            prometheus.stop()
        ranks.close()


def _analyze(url: str) -> dict[str, Any]:
    done = subprocess.run(
        # a store's answer is some 10 MB of JSON here, and two cores take in 200,000 series every SCRAPE_S beside it
        [TRAINHEALTH, "analyze", "--prometheus", url, "--once", "--json", "--prometheus-timeout", "120"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (job,) = json.loads(done.stdout)["jobs"]
    return job


def _rank_missing(ruler: str) -> set[tuple[str, str]]:
    alerts = _get(ruler, "/api/v1/alerts")["alerts"] or []  # vmalert: null when none
    return {
        (a["labels"]["rank"], a["labels"]["group"])
        for a in alerts
        if a["labels"]["alertname"] == "RankMissing" and a["state"] == "firing"
    }


def _longest_label_value(url: str) -> tuple[int, str]:
    longest = (0, "")
    for name in _get(url, "/api/v1/labels"):
        values = _get(url, f"/api/v1/label/{urllib.parse.quote(name)}/values")
        longest = max(longest, max(((len(v.encode()), name) for v in values), default=(0, name)))
    return longest


def test_a_dead_rank_and_a_silent_one_are_named_among_16384_ranks_on_prometheus_and_victoria_metrics(stores):
    member = catalog.COMM_GROUP_MEMBER.prometheus_name
    seq = catalog.COMM_STARTED_SEQ.prometheus_name
    waiting = f"{catalog.COMM_INFLIGHT_DURATION.prometheus_name} > 30"
    urls = {"prometheus": stores["prometheus"], "victoria-metrics": stores["vm"]}
    for url in urls.values():  # every rank but SILENT: 3 groups each
        _until(f"{url} holds every membership series", lambda url=url: _count(url, member) == 3 * (WORLD_SIZE - 1))
    stores["ranks"].page = _page(dead=True)
    for url in urls.values():  # DEAD's series are gone, its and SILENT's peers wait
        _until(
            f"{url} sees DEAD gone and 8,190 ranks waiting",
            lambda url=url: _count(url, f'{seq}{{rank="{DEAD}"}}') == 0 and _count(url, waiting) == 2 * DP - 2,
        )

    dead_group, silent_group = _dp(DEAD), _dp(SILENT)
    for store, url in urls.items():
        job = _analyze(url)
        assert job["job"] == JOB and job["verdict"] == "hang", (store, job)
        assert [s["component"] for s in job["suspects"]] == [f"rank:{DEAD}"], (store, job["suspects"])
        assert job["suspects"][0]["evidence"].startswith(f"rank {DEAD} missing since "), store
        hangs = {h["group"]: h for h in job["hangs"]}
        assert set(hangs) == {dead_group, silent_group}, (store, list(hangs))
        assert [m["rank"] for m in hangs[dead_group]["missing"]] == [DEAD], store
        assert hangs[dead_group]["missing"][0]["last_seq"] == 100, store  # where it was last
        assert [m["rank"] for m in hangs[silent_group]["missing"]] == [SILENT], store  # from the group's stride
        assert hangs[silent_group]["missing"][0]["last_seen"] is None, store  # it never reported
        for hang in hangs.values():
            assert hang["missing_group_ranks"] == [] and len(hang["waiting_ranks"]) == DP - 1, store

    for ruler in (stores["prometheus"], stores["vmalert"]):  # `for: 10s`, evaluated every SCRAPE_S
        _until(f"{ruler} fires RankMissing", lambda ruler=ruler: bool(_rank_missing(ruler)), 60.0)
        assert _rank_missing(ruler) == {(str(DEAD), dead_group)}, ruler

    for store, url in urls.items():
        size, name = _longest_label_value(url)
        assert size <= LONGEST_LABEL, f"{store}: a {size}-byte value of label {name}"
