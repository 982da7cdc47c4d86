"""Clean and faulty runs of ``trainhealth demo`` under the local stack: false alarms, pages, detection delays.

    python benchmarks/demo_runs.py                            # 3 clean + 3 faulty runs, seeds 1-3 (~25 min, 2 cores)
    python benchmarks/demo_runs.py --seeds 1 --duration 60 --out /tmp/demo-runs

Each run is ``trainhealth stack up`` (the real prometheus and alertmanager binaries on
127.0.0.1, rule ``for`` capped at 30 s as the stack does) around ``trainhealth demo
--seed N``, with ``--no-faults`` for a clean run and the built-in schedule (a thermally
throttled GPU, a straggler, a loss spike, an XID 79) for a faulty one. When the demo's
report is written, Prometheus is asked which alerts fired during the run
(``ALERTS{alertstate="firing"}``), then the stack is stopped.

Counted per run, from the demo's report.json: anomalies (detector events), the live
analyzer's verdicts other than healthy, the detections no injected fault explains
(false alarms, :func:`trainhealth._internal.demo.story.unexplained`), Alertmanager's
notifications (page and ticket receivers) and the alerts Prometheus fired; for
faulty runs, each fault's first detection and its delay. The demo's detector
thresholds were chosen on seed 0 (development runs); these seeds are the report.
One JSON line per run in OUT/results.jsonl.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from trainhealth._internal._ports import free_port
from trainhealth._internal.demo import story
from trainhealth._internal.errors import UsageError
from trainhealth._internal.faults import Fault
from trainhealth._internal.injectors import schedule_file  # noqa: F401  (declares the demo's fault kinds)
from trainhealth._internal.stack.runner import find_binary
from trainhealth_lab.cli import parse_seeds

TRAINHEALTH = str(Path(sys.executable).parent / "trainhealth")


def run_one(out: Path, seed: int, clean: bool, duration_s: float) -> dict[str, Any]:
    """One demo under the stack; its counts and findings."""
    directory = out / f"{'clean' if clean else 'faulty'}-seed{seed}"
    prometheus, alertmanager, webhook = free_port(), free_port(), free_port()
    command = [
        TRAINHEALTH,
        "stack",
        "up",
        "--dir",
        str(directory),
        "--prometheus-port",
        str(prometheus),
        "--alertmanager-port",
        str(alertmanager),
        "--webhook-port",
        str(webhook),
        "--demo-duration",
        str(duration_s),
        f"--demo-arg=--seed={seed}",
    ]
    if clean:
        command.append("--demo-arg=--no-faults")
    began = time.time()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, timeout=120)
    report = directory / "demo" / "report.json"
    try:
        deadline = time.monotonic() + 3 * duration_s + 300
        while not report.exists() and time.monotonic() < deadline:
            time.sleep(2)
        time.sleep(1)  # the report is written in one go; let the demo finish its last line
        fired = _fired_alerts(prometheus, time.time() - began)
    finally:
        subprocess.run([TRAINHEALTH, "stack", "down", "--dir", str(directory)], stdout=subprocess.DEVNULL, timeout=120)
    if not report.exists():
        return {"seed": seed, "clean": clean, "error": "no report (see " + str(directory / "demo.log") + ")"}
    return _summarise(json.loads(report.read_text()), directory / "demo", seed, clean, fired)


def _fired_alerts(port: int, seconds: float) -> list[str]:
    """The alert names Prometheus held firing at any point in the last ``seconds``."""
    query = f'max by (alertname) (max_over_time(ALERTS{{alertstate="firing"}}[{int(seconds) + 30}s]))'
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    with urllib.request.urlopen(url, timeout=10) as answer:
        result = json.loads(answer.read())["data"]["result"]
    return sorted(item["metric"].get("alertname", "?") for item in result)


def _summarise(report: dict[str, Any], demo: Path, seed: int, clean: bool, fired: list[str]) -> dict[str, Any]:
    histories = {
        int(p.stem.split("-")[1]): json.loads(p.read_text())["steps"]
        for p in sorted((demo / "history").glob("rank-*.json"))
    }
    found = story.detections(
        report["events"], histories, report["pages"], report["localization"], report.get("verdicts", [])
    )
    last_step = max((int(r["step"]) for rows in histories.values() for r in rows), default=0)
    schedule = [Fault.from_dict(fault) for fault in report["schedule"]]
    false_alarms = story.unexplained(schedule, found, last_step)
    anomalies = [e for e in report["events"] if e.get("event") == "anomaly"]
    live = [v for v in report.get("verdicts", []) if v.get("verdict") not in ("healthy", "insufficient_data")]
    return {
        "seed": seed,
        "clean": clean,
        "steps": last_step,
        "wall_s": round(float(report.get("wall_s") or 0), 1),
        "anomalies": len(anomalies),
        "analyzer_findings": len(live),
        "final_verdict": (report.get("localization") or {}).get("verdict"),
        "false_alarms": [f"{d.what} (rank {d.rank}, step {d.step})" for d in false_alarms],
        "notifications": sorted(f"{p.get('receiver')}:{p.get('labels', {}).get('alertname')}" for p in report["pages"]),
        "alerts_fired": fired,
        "findings": report["findings"],
    }


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        f"{'run':<16}{'steps':>6}{'wall s':>8}{'anomalies':>10}{'analyzer':>9}{'false alarms':>13}"
        f"{'notified':>9}{'fired':>7}  final verdict"
    ]
    for row in rows:
        name = f"{'clean' if row['clean'] else 'faulty'} seed {row['seed']}"
        if "error" in row:
            lines.append(f"{name:<16}{row['error']}")
            continue
        lines.append(
            f"{name:<16}{row['steps']:>6}{row['wall_s']:>8.0f}{row['anomalies']:>10}"
            f"{row['analyzer_findings']:>9}{len(row['false_alarms']):>13}{len(row['notifications']):>9}"
            f"{len(row['alerts_fired']):>7}  {row['final_verdict']}"
        )
    lines.append("")
    for row in rows:
        name = f"{'clean' if row['clean'] else 'faulty'} seed {row['seed']}"
        for alarm in row.get("false_alarms", []):
            lines.append(f"{name}: false alarm: {alarm}")
        if row.get("alerts_fired"):
            lines.append(f"{name}: alerts fired: {', '.join(row['alerts_fired'])}")
        for finding in row.get("findings", []):
            lines.append(
                f"{name}: {finding['fault']} at {finding['injected']}: {finding['first detection']}"
                f" -> delay {finding['delay']}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="directory for the runs (default: a new temporary directory)")
    parser.add_argument("--seeds", default="1-3", help="seeds, like 1,2,3 or 1-3 (default 1-3; 0 chose the thresholds)")
    parser.add_argument("--duration", type=float, default=150.0, help="seconds of training per run (default 150)")
    parser.add_argument("--only", choices=("clean", "faulty"), help="only clean or only faulty runs")
    parser.add_argument(
        "--rescore",
        action="store_true",
        help="run nothing: recount the runs recorded in --out with the current matching rules",
    )
    args = parser.parse_args(argv)
    try:
        seeds = parse_seeds(args.seeds)
    except UsageError as exc:
        print(f"demo_runs.py: {exc}", file=sys.stderr)
        return 2
    try:
        for name in ("prometheus", "alertmanager"):
            find_binary(name)
    except UsageError as exc:
        print(f"demo_runs.py: {exc}", file=sys.stderr)
        return 2
    if args.rescore:
        if not args.out or not (Path(args.out) / "results.jsonl").is_file():
            print("demo_runs.py: --rescore needs --out DIR holding an earlier run's results.jsonl", file=sys.stderr)
            return 2
        return _report(_rescored(Path(args.out)), Path(args.out))
    out = Path(args.out or tempfile.mkdtemp(prefix="trainhealth-demo-runs-"))
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    kinds = [clean for clean in (True, False) if args.only is None or clean == (args.only == "clean")]
    for clean in kinds:
        for seed in seeds:
            began = time.monotonic()
            row = run_one(out, seed, clean, args.duration)
            rows.append(row)
            with (out / "results.jsonl").open("a") as results:
                results.write(json.dumps(row) + "\n")
            print(
                f"  {'clean' if clean else 'faulty'} seed {seed}: {time.monotonic() - began:.0f} s, "
                f"{len(row.get('false_alarms', []))} false alarms",
                flush=True,
            )
    return _report(rows, out)


def _rescored(out: Path) -> list[dict[str, Any]]:
    """The rows of ``out``'s results.jsonl, recounted from each run's report with the current rules."""
    rows = []
    for line in (out / "results.jsonl").read_text().splitlines():
        row = json.loads(line)
        demo = out / f"{'clean' if row['clean'] else 'faulty'}-seed{row['seed']}" / "demo"
        if "error" not in row and (demo / "report.json").is_file():
            row = _summarise(
                json.loads((demo / "report.json").read_text()), demo, row["seed"], row["clean"], row["alerts_fired"]
            )
        rows.append(row)
    return rows


def _report(rows: list[dict[str, Any]], out: Path) -> int:
    print()
    print(table(rows))
    clean_rows = [r for r in rows if r["clean"] and "error" not in r]
    faulty_rows = [r for r in rows if not r["clean"] and "error" not in r]
    print()
    if clean_rows:
        print(
            f"clean runs: {sum(r['anomalies'] + r['analyzer_findings'] for r in clean_rows)} anomalies and "
            f"analyzer findings, {sum(len(r['notifications']) for r in clean_rows)} notifications, "
            f"{sum(len(r['alerts_fired']) for r in clean_rows)} alerts fired over {len(clean_rows)} runs"
        )
    if faulty_rows:
        faults = [f for r in faulty_rows for f in r["findings"]]
        caught = [f for f in faults if f["first detection"] != "not detected"]
        print(
            f"faulty runs: {len(caught)} of {len(faults)} injected faults detected; "
            f"{sum(len(r['false_alarms']) for r in faulty_rows)} false alarms over {len(faulty_rows)} runs"
        )
    print(f"results: {out / 'results.jsonl'}")
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
