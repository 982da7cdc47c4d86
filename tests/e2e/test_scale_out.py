"""End to end, at scale-out shape: ``trainhealth stack up --store victoriametrics`` runs two shards splitting the
demo's targets by ``hashmod`` (Prometheus agents, or vmagents with ``--agent vmagent``: each kind is a stack of
its own, and each test runs once per kind), ``remote_write`` into a real VictoriaMetrics store, ``vmalert``
evaluating the rule file against the store, and Alertmanager (all Debian packages, on 127.0.0.1).

The single-Prometheus stack (``--store prometheus``, no demo of its own) scrapes the same demo at the same
time with the same rules, as the reference: every alert it fires must fire through vmalert with the same labels
and annotations (values masked: the two evaluate at different instants), the recording rules' results must be
written back into the store, every dashboard query must return data from the store, GpuLost must page through
Alertmanager, and ``trainhealth analyze`` must name the same straggler reading from the store as from
Prometheus. The demo and every stack are the package's ``faulty_demo`` (conftest.py), shared with test_stack:
one demo run feeds both kinds of shard.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.stack_checks import (
    all_series,
    assert_every_panel_has_data,
    assert_metrics_present,
    injections,
    query,
)
from trainhealth._internal import catalog as c
from trainhealth._internal.knowledge.recording import RECORDING_RULES
from trainhealth._internal.stack.topology import AGENTS

pytestmark = pytest.mark.slow  # the slow tier: `pytest -m slow`

TRAINHEALTH = str(Path(sys.executable).parent / "trainhealth")
#: Seconds an alert fires (evaluations, one a second) in one ruler before the other must fire it too.
SOLID_S = 10


def _firing_seconds(port: int) -> dict[frozenset, float]:
    """Every alert that fired in the last 15 minutes (its ALERTS series, before Alertmanager's inhibition and
    grouping), by its labels: for how many evaluations (one a second) it was firing."""
    answer = query(port, 'count_over_time(ALERTS{alertstate="firing"}[15m])')
    return {
        frozenset((k, v) for k, v in r["metric"].items() if k not in ("__name__", "alertstate")): float(r["value"][1])
        for r in answer
    }


def _recorded(port: int, record: str, wait_s: float = 0.0) -> dict[str, float]:
    """The highest value each series of recording rule ``record`` took in the last 15 minutes, by its labels
    other than job (waiting up to ``wait_s`` for one to appear)."""
    deadline = time.monotonic() + wait_s
    while True:
        answer = query(port, f"max_over_time({record}[15m])")
        if answer or time.monotonic() > deadline:
            return {  # MetricsQL's max_over_time keeps the metric's name; PromQL's drops it
                ",".join(v for k, v in sorted(r["metric"].items()) if k not in ("job", "__name__")): float(
                    r["value"][1]
                )
                for r in answer
            }
        time.sleep(2)


#: Series a vmagent writes of each target and a Prometheus agent does not (Prometheus: only with
#: --enable-feature=extra-scrape-metrics); no rule or panel reads it.
VMAGENT_ONLY = {"scrape_timeout_seconds"}


def _scraped(port: int, since: float, leave_out: set[str]) -> set[frozenset]:
    """The series scraped into ``port`` (Prometheus or the store) since ``since``, by their labels: every series
    but the rulers' (ALERTS, ALERTS_FOR_STATE, the recording rules' ``level:metric:operation`` names)."""
    return {
        labels
        for labels in all_series(port, since)
        if ":" not in (name := dict(labels)["__name__"]) and not name.startswith("ALERTS") and name not in leave_out
    }


def _named(result: dict) -> list[dict]:
    """Whom an analyzer result blames: its suspects, or with no ongoing fault its events."""
    return result["suspects"] if result["verdict"] == "compute" else result.get("events", [])


def _analyze(port: int, window_s: float) -> dict:
    done = subprocess.run(
        [TRAINHEALTH, "analyze", "--prometheus", f"http://127.0.0.1:{port}", "--once", "--json"]
        + ["--window", f"{window_s:.0f}", "--step", "10"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    (job,) = json.loads(done.stdout)["jobs"]  # the demo is one run: one job label, judged on its own
    return job


@pytest.mark.parametrize("agent", AGENTS)
def test_the_scale_out_stack_alerts_and_answers_as_one_prometheus_does(faulty_demo, agent, capsys):
    reference, stack = faulty_demo.reference, faulty_demo.scale_out[agent]
    prometheus_port, store_port, receiver = reference.prometheus_port, stack.options.store_port, stack.receiver
    prometheus, vmalert = faulty_demo.prometheus_watch, stack.vmalert_watch
    began = faulty_demo.began
    # vmalert reads what the shards wrote a scrape or two ago: its alerts fire seconds after Prometheus's, so
    # the two are compared once both have had time to evaluate all of theirs. An alert that fired in one ruler
    # only, for under SOLID_S, sat on the edge of its (capped) `for`: a condition that held about as long as the
    # `for` (a rank's target down for the seconds before its server starts; its /metrics up a few seconds
    # before its identity metrics, which TrainhealthMetricsAbsent watches), so seconds of lag decide it. Those
    # are shown, not compared; every other alert must fire in both.
    # what fires as the demo ends (its targets go down) fires long enough in both (the second kind's test starts
    # later: it waits less, or not at all)
    time.sleep(max(0.0, faulty_demo.ended + 3 * SOLID_S - time.time()))
    deadline = time.time() + 120
    while True:
        in_store, in_prometheus = _firing_seconds(store_port), _firing_seconds(prometheus_port)
        only_prometheus, only_store = in_prometheus.keys() - in_store.keys(), in_store.keys() - in_prometheus.keys()
        edge = {k for k in only_prometheus if in_prometheus[k] < SOLID_S} | {
            k for k in only_store if in_store[k] < SOLID_S
        }
        if (only_prometheus | only_store) <= edge or time.time() > deadline:
            break
        time.sleep(2)
    ended = time.time()
    vmalert.stop()  # (Prometheus's watch goes on for the other kind's test; the fixture stops it)
    both = in_store.keys() & in_prometheus.keys()
    with capsys.disabled():
        lags = sorted(
            vmalert.first_seen[k] - prometheus.first_seen[k]
            for k in both & vmalert.first_seen.keys() & prometheus.first_seen.keys()
        ) or [float("nan")]
        # (a median: a rank's target down before its server starts fires in Prometheus, on the edge in vmalert,
        # and both fire it again when the demo ends, minutes later)
        print(
            f"\n{agent} shards: {len(both)} alerts fired in both rulers; vmalert's were first seen firing a median of "
            f"{lags[len(lags) // 2]:.1f} s after Prometheus's"
        )
        for labels in sorted(edge, key=sorted):
            print(
                f"  on the edge of its `for`: {dict(labels)['alertname']} {dict(labels).get('instance', '')}: "
                f"{in_prometheus.get(labels, 0):.0f} s firing in Prometheus, {in_store.get(labels, 0):.0f} s in vmalert"
            )
    assert {dict(k)["alertname"] for k in both} >= {
        "GpuThermalThrottling",
        "StragglerSuspect",
        "GpuLost",
        "GpuXidCritical",
    }
    assert only_prometheus <= edge, only_prometheus - edge
    assert only_store <= edge, only_store - edge
    # the same annotations (values masked), rendered by each ruler from the one rule file
    watched = both & vmalert.annotations.keys() & prometheus.annotations.keys()
    assert len(watched) >= len(both) - 2, both - watched  # the watch polls each second: it sees nearly all
    assert {k: vmalert.annotations[k] for k in watched} == {k: prometheus.annotations[k] for k in watched}

    lost = injections(faulty_demo.out)["xid"][1]
    deadline = time.time() + 60  # Alertmanager holds a page group_wait (10 s) before it sends
    while not receiver.firing("GpuLost") and time.time() < deadline:
        time.sleep(1)
    pages = receiver.firing("GpuLost")
    assert pages, "GpuLost never reached Alertmanager through vmalert"
    (_, page), *_ = pages
    assert page["receiver"] == "page" and page["labels"]["gpu"] == str(lost["gpu"])

    # vmalert wrote the per-job aggregates back into the store, the same ones Prometheus recorded
    recorded = {rule.record: _recorded(prometheus_port, rule.record) for rule in RECORDING_RULES}
    assert sum(map(bool, recorded.values())) >= len(RECORDING_RULES) // 2, recorded
    for name, series in recorded.items():
        assert bool(_recorded(store_port, name, wait_s=60 if series else 0)) == bool(series), name
    # XIDs counted alike: 1 per XID the demo injected, in both (increase() would give 0 in Prometheus, 1 here)
    xids = f"job:{c.GPU_XID_ERRORS.prometheus_name}:increase10m"
    assert _recorded(prometheus_port, xids) == _recorded(store_port, xids, wait_s=60) == {"79": 1.0}
    with capsys.disabled():
        raw = f"sum by (xid) (max_over_time(increase({c.GPU_XID_ERRORS.prometheus_name}[10m])[15m:1s]))"
        print(
            f"  increase() of the XID counter: {query(prometheus_port, raw)[0]['value'][1]} in Prometheus, "
            f"{query(store_port, raw)[0]['value'][1]} in VictoriaMetrics"
        )
    assert_metrics_present(store_port)
    # the shards wrote every series the reference scraped and no other, with the same labels: honor_labels kept the
    # exporters' job, host and rank, each target went to one shard (no series twice), `up` and the scrape's own
    # series alike
    leave_out = VMAGENT_ONLY if agent == "vmagent" else set()
    assert _scraped(store_port, began, leave_out) == _scraped(prometheus_port, began, set())
    assert_every_panel_has_data(store_port, began, ended)

    # every analyzer query is a ratio of two rate()s over one interval; MetricsQL's rate starts from the last
    # sample before the interval and does not extrapolate, PromQL's extrapolates to its edges: the scores
    # differ a little (shown), the suspect must not
    window = time.time() - began
    from_store, from_prometheus = _analyze(store_port, window), _analyze(prometheus_port, window)
    slow = injections(faulty_demo.out)["delay"][1]
    with capsys.disabled():
        for source, result in (("Prometheus", from_prometheus), ("the store", from_store)):
            named = [f"{n['component']} {n.get('score', 0):.3f}" for n in _named(result)[:2]]
            print(f"  analyze reading {source}: {result['verdict']}, {named}")
    # the straggler slowed steps 30-60% of the run and recovered: over the whole run it is an event (a stretch
    # that came and went; the verdict healthy, or imbalance when the window's steps are uneven), or a suspect
    # while its steps still weigh in the window; each names its rank
    assert from_store["verdict"] in ("compute", "healthy", "imbalance"), from_store
    assert _named(from_store) and _named(from_store)[0]["ranks"] == [slow["rank"]], from_store
    assert _named(from_store)[0]["component"] == _named(from_prometheus)[0]["component"]
