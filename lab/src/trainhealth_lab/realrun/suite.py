"""Run a suite of real-run cases, write one JSON line per run, and tabulate the scores.

The table is by fault kind (and pattern) x layout x severity band: runs, right verdict,
top-1 right, false blame, median live detection delay (steps after the onset) and the
naive baselines' top-1 ("cmp": the rank with the largest time outside collectives;
"wait": the rank whose collectives are shortest).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from trainhealth_lab.realrun.launcher import HOG_CODE, CaseOutcome, run_case, score_run
from trainhealth_lab.realrun.spec import CaseSpec, LabFault, Truth

__all__ = [
    "RESULTS_FILE",
    "SLOW_FACTOR",
    "ResultsError",
    "load_results",
    "rescore",
    "run_suite",
    "shape_label",
    "shape_summary",
    "shape_table",
    "summary",
    "table",
]

RESULTS_FILE = "results.jsonl"
#: A rank this many times slower than planned must never be called healthy (issue 30).
SLOW_FACTOR = 1.5


def run_suite(
    cases: Sequence[CaseSpec],
    out: str | os.PathLike[str],
    *,
    noise: bool = False,
    live: bool = True,
    report: Callable[[CaseOutcome], None] | None = None,
) -> list[dict[str, Any]]:
    """Run ``cases`` one after another into ``out``; with ``noise`` a busy process runs beside them all."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    hog = None
    if noise:  # unpinned: the scheduler spreads it over both cores, slowing every rank alike
        hog = subprocess.Popen([sys.executable, "-c", HOG_CODE], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with open(out / RESULTS_FILE, "w", encoding="utf-8") as sink:
            for case in cases:
                outcome = run_case(case, out, live=live, noise=noise)
                row = outcome.to_dict()
                row.pop("answer", None)
                sink.write(json.dumps(row, sort_keys=True, default=str) + "\n")
                sink.flush()
                results.append(row)
                if report is not None:
                    report(outcome)
    finally:
        if hog is not None:
            hog.kill()
            hog.wait(timeout=10)
    return results


class ResultsError(ValueError):
    """A results file that is not a suite's ``results.jsonl``: names the file, the line and the field."""


#: A results file larger than this is not one a suite wrote.
MAX_RESULTS_BYTES = 256 << 20
_NUMBER = (int, float)
_ROW = {"case": str, "status": str, "reason": str, "run_dir": str, "truth": dict, "wall_s": _NUMBER}
_SCORED = {
    "localize": dict,
    "baseline_compute": dict,
    "baseline_wait": dict,
    "live_detection_delay": (int, type(None)),
    "localize_probe": (dict, type(None)),
}
_TRUTH = {
    "kind": str,
    "pattern": str,
    "layout": str,
    "severity_band": str,
    "target": (int, type(None)),
    "severity": (int, float, type(None)),
    "fault": dict,
}
_ANSWER = {"verdict_right": (bool, type(None)), "top1": (bool, type(None)), "false_blame": (bool, type(None))}


def _check(where: str, data: dict[str, Any], fields: dict[str, Any]) -> None:
    for name, kind in fields.items():
        value = data.get(name, ...)
        if (
            value is ...
            or isinstance(value, bool)
            and bool not in (kind if isinstance(kind, tuple) else (kind,))
            or not isinstance(value, kind)
        ):
            wanted = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
            raise ResultsError(
                f"{where}: {name} must be {wanted}, got {'nothing' if value is ... else repr(value)[:80]}"
            )


def _checked(row: Any, where: str) -> dict[str, Any]:
    if not isinstance(row, dict):
        raise ResultsError(f"{where}: expected a JSON object, got {type(row).__name__}")
    _check(where, row, _ROW)
    if row["status"] not in ("ok", "error", "skipped"):
        raise ResultsError(f"{where}: status must be ok, error or skipped, got {row['status']!r}")
    _check(f"{where}: truth", row["truth"], _TRUTH)
    try:
        kind = LabFault(row["truth"]["kind"])
    except ValueError as exc:
        raise ResultsError(f"{where}: truth: kind: {exc}") from None
    if kind.link:
        _check(f"{where}: truth", row["truth"], {"onset": int})
    if row["status"] == "ok":
        _check(where, row, _SCORED)
        for name in ("localize", "baseline_compute", "baseline_wait"):
            if isinstance(row[name], dict) and "top1_right" in row[name]:  # written before the one scorer
                row[name]["top1"] = row[name].pop("top1_right")
            _check(
                f"{where}: {name}",
                row[name],
                _ANSWER
                if name == "localize"
                else {key: kind for key, kind in _ANSWER.items() if key != "verdict_right"},
            )
        _check(f"{where}: localize", row["localize"], {"verdict": (str, type(None))})
    return row


def load_results(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The rows of a suite's ``results.jsonl``, each checked; a :class:`ResultsError` names the line and field."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_RESULTS_BYTES + 1)
    except OSError as exc:
        raise ResultsError(f"{path}: unreadable ({exc.strerror or exc})") from None
    if len(data) > MAX_RESULTS_BYTES:
        raise ResultsError(f"{path}: larger than {MAX_RESULTS_BYTES} bytes; not a lab results file")
    rows = []
    for number, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}: line {number}"
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):
            raise ResultsError(f"{where}: not a JSON object; not a lab results file") from None
        rows.append(_checked(row, where))
    return rows


def rescore(results: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The rows of a suite's ``results.jsonl`` with each run localized again by this code from its saved traces.

    What happened while the job ran (the live analyzer's polls and delays, the measured slowdowns) is kept as
    recorded; the final answers, with and without the probe, and the baselines are new. Nothing is written:
    the run directories named in the file are only read.
    """
    rows = []
    for row in load_results(results):
        if row.get("status") == "ok" and Path(row["run_dir"]).is_dir():
            try:
                scores = score_run(Truth.from_dict(row["truth"]), row["run_dir"], save=False)
            except Exception as exc:  # noqa: BLE001 - one unreadable run is reported in its row, not fatal
                row = {**row, "status": "error", "reason": str(exc)}
            else:
                scores.pop("answer", None)
                row = {**row, **scores}
        rows.append(row)
    return rows


def _kind(row: dict[str, Any]) -> LabFault:
    return LabFault(row["truth"]["kind"])


def _label(row: dict[str, Any]) -> str:
    truth = row["truth"]
    kind = _kind(row)
    if truth["target"] is None:
        return kind.value
    if kind.link and truth["onset"] == 0 and not truth.get("notes"):
        return f"{kind.value}/start"
    return f"{kind.value}/{truth['pattern']}"


def _percent(values: Iterable[bool | None]) -> str:
    known = [bool(v) for v in values if v is not None]
    return f"{100.0 * sum(known) / len(known):5.0f}%" if known else "     -"


def table(rows: Sequence[dict[str, Any]]) -> str:
    """The score table of ``rows`` (the suite's JSON lines)."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    skipped: dict[str, str] = {}
    errors = []
    for row in rows:
        if row["status"] == "skipped":
            skipped[_label(row)] = row["reason"]
            continue
        if row["status"] != "ok":
            errors.append(f"{row['case']}: {row['reason'][:160]}")
            continue
        groups[(_label(row), row["truth"]["layout"], row["truth"]["severity_band"])].append(row)
    header = (
        f"{'fault':<28}{'layout':<7}{'severity':<9}{'runs':>5}{'verdict':>8}{'top-1':>7}{'false':>7}"
        f"{'delay':>7}{'base cmp':>9}{'base wait':>10}"
    )
    lines = [header, "-" * len(header)]
    for (label, layout, band), members in sorted(groups.items()):
        delays = [r["live_detection_delay"] for r in members if r["live_detection_delay"] is not None]
        delay = f"{np.median(delays):7.0f}" if delays else "      -"
        lines.append(
            f"{label:<28}{layout:<7}{band:<9}{len(members):>5}"
            f"{_percent(r['localize']['verdict_right'] for r in members):>8}"
            f"{_percent(r['localize']['top1'] for r in members):>7}"
            f"{_percent(r['localize']['false_blame'] for r in members):>7}{delay}"
            f"{_percent(r['baseline_compute']['top1'] if r['truth']['target'] is not None else not r['baseline_compute']['false_blame'] for r in members):>9}"
            f"{_percent(r['baseline_wait']['top1'] if r['truth']['target'] is not None else not r['baseline_wait']['false_blame'] for r in members):>10}"
        )
    for label, reason in sorted(skipped.items()):
        lines.append(f"{label:<28}skipped: {reason}")
    for error in errors:
        lines.append(f"error: {error}")
    lines.append(
        "(verdict: accepted verdict; top-1: an accepted verdict and the top suspect names the injected component; "
        "false: anyone wrongly blamed; delay: median live detection, steps after onset; base: the naive baselines' "
        "top-1, or for controls the share of runs where they blame nobody)"
    )
    return "\n".join(lines)


def summary(rows: Sequence[dict[str, Any]]) -> str:
    """The issue's acceptance figures, computed from ``rows``."""
    done = [r for r in rows if r["status"] == "ok"]

    def share(selected: list[dict[str, Any]], key: Callable[[dict[str, Any]], bool]) -> str:
        return f"{sum(map(key, selected))}/{len(selected)}" if selected else "0/0"

    def fault(r: dict[str, Any], kinds: tuple[LabFault, ...], patterns: tuple[str, ...]) -> bool:
        t = r["truth"]
        return _kind(r) in kinds and t["pattern"] in patterns and (t["severity"] is None or t["severity"] >= 1.2)

    host_side = (LabFault.COMPUTE, LabFault.CPU_CONTENTION, LabFault.DATALOADER)
    persistent = [r for r in done if fault(r, host_side, ("persistent",))]
    passing = [r for r in done if fault(r, (LabFault.COMPUTE,), ("transient", "intermittent"))]
    controls = [r for r in done if r["truth"]["target"] is None]
    links = [r for r in done if _kind(r).link]
    delays = [r["live_detection_delay"] for r in done if r["live_detection_delay"] is not None]
    detected = [r for r in done if r["truth"]["target"] is not None]
    lines = [
        f"runs: {len(rows)} ({len(done)} scored, {sum(r['status'] == 'skipped' for r in rows)} skipped, "
        f"{sum(r['status'] == 'error' for r in rows)} failed); median wall time per run "
        f"{np.median([r['wall_s'] for r in done]) if done else float('nan'):.1f}s",
        f"top-1, persistent compute faults (slow kernels, contention, data-loader stalls), severity >= 1.2: "
        f"{share(persistent, lambda r: r['localize']['top1'])}",
        f"top-1, transient and intermittent compute faults, severity >= 1.2: {share(passing, lambda r: r['localize']['top1'])}",
        f"controls with an accepted verdict and nobody blamed: "
        f"{share(controls, lambda r: r['localize']['verdict_right'] and not r['localize']['false_blame'])}",
        f"link faults answered 'communication' from timings alone: "
        f"{share(links, lambda r: r['localize']['verdict'] == 'communication')}, 'imbalance': "
        f"{share(links, lambda r: r['localize']['verdict'] == 'imbalance')}; with the probe: 'communication' "
        f"{share([r for r in links if r['localize_probe']], lambda r: r['localize_probe'].get('verdict') == 'communication')}"
        f", the slow rank's link named "
        f"{share([r for r in links if r['localize_probe']], lambda r: bool(r['localize_probe'].get('top1')))}",
        f"false blame over all runs: {share(done, lambda r: r['localize']['false_blame'])}",
        f"live detection: {len(delays)}/{len(detected)} faults detected, median delay "
        f"{np.median(delays) if delays else float('nan'):.0f} steps after onset",
        f"naive baselines top-1 over faults: cmp {share(detected, lambda r: bool(r['baseline_compute']['top1']))}, "
        f"wait {share(detected, lambda r: bool(r['baseline_wait']['top1']))}",
    ]
    return "\n".join(lines)


def shape_label(truth: dict[str, Any]) -> str:
    """The shape of a run from its truth: driver (or the lab's layout), markers, ranks.

    >>> shape_label({"driver": "fsdp", "layout": "ddp", "markers": False, "ranks": 4})
    'fsdp-nomarkers-r4'
    >>> shape_label({"layout": "dp_pp", "ranks": 2})  # a truth file from before drivers: the lab's loop
    'dp_pp-r2'
    """
    driver = truth.get("driver", "lab")
    shape = truth["layout"] if driver == "lab" else driver
    return f"{shape}{'' if truth.get('markers', True) else '-nomarkers'}-r{truth['ranks']}"


def _fault_label(truth: dict[str, Any]) -> str:
    kind = LabFault(truth["kind"])
    if truth["target"] is None:
        return kind.value
    if "issue30" in truth["case"]:  # cases.issue30_repro: its own line
        return "issue30-repro"
    return f"{kind.value}/{'start' if truth['onset'] == 0 else 'mid'}"


def _slow(row: dict[str, Any]) -> bool:
    """Whether a rank was planned at least :data:`SLOW_FACTOR` times slow (a compute fault)."""
    truth = row["truth"]
    return (
        LabFault(truth["kind"]) is LabFault.COMPUTE
        and truth["severity"] is not None
        and truth["severity"] >= SLOW_FACTOR
    )


def _right_or_insufficient(row: dict[str, Any]) -> bool:
    verdict = row["localize"]["verdict"]
    return bool(row["localize"]["verdict_right"]) or verdict == "insufficient_data"


def shape_table(rows: Sequence[dict[str, Any]]) -> str:
    """Per shape and fault (``compute/mid``, ``compute/start``, ``clean``): the verdicts given, how many are
    right (or ``insufficient_data``), top-1, false blame and ``healthy`` answers while a rank was slow."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    errors = []
    for row in rows:
        if row["status"] == "ok":
            groups[(shape_label(row["truth"]), _fault_label(row["truth"]))].append(row)
        elif row["status"] == "error":
            errors.append(f"{row['case']}: {row['reason'][:160]}")
    header = (
        f"{'shape':<24}{'fault':<15}{'runs':>5}{'right|insuf':>12}{'top-1':>7}{'false':>7}{'healthy&slow':>14}"
        "  verdicts"
    )
    lines = [header, "-" * (len(header) + 20)]
    for (shape, fault), members in sorted(groups.items()):
        verdicts: dict[str, int] = defaultdict(int)
        for r in members:
            verdicts[str(r["localize"]["verdict"])] += 1
        slow = [r for r in members if _slow(r)]
        top1 = [r["localize"]["top1"] for r in members if r["truth"]["target"] is not None]
        lines.append(
            f"{shape:<24}{fault:<15}{len(members):>5}"
            f"{sum(map(_right_or_insufficient, members)):>7}/{len(members):<4}"
            f"{_percent(top1) if top1 else '     -':>7}"
            f"{sum(bool(r['localize']['false_blame']) for r in members):>7}"
            f"{sum(r['localize']['verdict'] == 'healthy' for r in slow):>9}/{len(slow):<4}  "
            + ", ".join(f"{v} {n}" for v, n in sorted(verdicts.items()))
        )
    lines += [f"error: {error}" for error in errors]
    lines.append(
        "(right|insuf: an accepted verdict or insufficient_data; top-1: the top suspect is the slow "
        "rank's component; false: runs blaming anyone wrongly; healthy&slow: 'healthy' while a rank was "
        f"planned >= {SLOW_FACTOR}x slow)"
    )
    return "\n".join(lines)


def shape_summary(rows: Sequence[dict[str, Any]]) -> str:
    """Issue 30's acceptance lines over ``rows``."""
    done = [r for r in rows if r["status"] == "ok"]
    slow = [r for r in done if _slow(r)]
    never_healthy = sum(r["localize"]["verdict"] != "healthy" for r in slow)
    blamed = sum(bool(r["localize"]["false_blame"]) for r in done)
    right = sum(map(_right_or_insufficient, done))
    share = 100.0 * blamed / len(done) if done else float("nan")
    return "\n".join(
        [
            (
                f"runs: {len(rows)} ({len(done)} scored, {sum(r['status'] == 'error' for r in rows)} failed, "
                f"{sum(r['status'] == 'skipped' for r in rows)} skipped)"
            ),
            f"never `healthy` while a rank is >={SLOW_FACTOR}x slow: {never_healthy}/{len(slow)}",
            f"false blame: {blamed}/{len(done)} runs ({share:.1f}%; target <= 1%)",
            f"verdict right or insufficient_data: {right}/{len(done)}",
        ]
    )
