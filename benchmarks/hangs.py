"""The hang lab's figures: real 4-rank jobs that hang, or pause and recover, judged live, on gloo and on NCCL's semantics.

Each case runs a real job (trainhealth_lab.hangs.rank) with the Monitor on every
rank, a real Prometheus (2 s scrapes and rule evaluation, trainhealth's generated
rules) and a real Alertmanager routing with trainhealth's routing tree to a webhook.
Every 2 s the analyzer (the code of `trainhealth analyze --prometheus URL`) is run
once. Every kind runs on each of `--backends` (gloo, and ncclsim: a CPU backend whose
calls return at once and complete later, the host blocking in `synchronize()` where a
GPU job reads a value), except hf_save and long_collective (gloo only).

Printed per case (one JSON line), and summarised per kind and backend: whether the right
rank (and group) was named first, how many seconds after the onset the analyzer said
`hang`, the rule fired and the page arrived; where the target's watcher found it stuck;
for controls, any hang verdict, rule or page, per seed; for two_jobs, whether the hung
job was named, the healthy one never, and whether the two jobs' job labels were
disjoint; the disk stall's page time (at most 60 s); whether the endless pause was
paged with its reason. Crashes (a rank that exits plainly, a size mismatch) end the job
within a second: they are named by `trainhealth localize` on the Flight Recorder dumps
the surviving ranks wrote as their collective failed.

    .venv/bin/python benchmarks/hangs.py --seeds 2 3 4 --backends gloo ncclsim --out /tmp/hanglab
    .venv/bin/python benchmarks/hangs.py --seeds 2 3 4 --backends gloo ncclsim --out /tmp/hanglab --rescore
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from pathlib import Path

from trainhealth_lab.hangs.harness import (
    BACKENDS,
    CONTROLS,
    CRASHES,
    DISK_STALL_PAGE_S,
    GLOO_ONLY,
    HANGS,
    HangCase,
    HangOutcome,
    run_hang_case,
)

KINDS = (*HANGS, *CRASHES, *CONTROLS)
#: the rank that pauses or saves in these kinds
RANK_ZERO = ("checkpoint", "evaluation", "hf_save", "endless_pause")


def _case(kind: str, seed: int, backend: str) -> HangCase:
    """The case table: the culprit, the onset step and the pause or fault's length vary with the seed."""
    world = 4
    target = 0 if kind in RANK_ZERO else (seed + 1) % world or 1  # vary the culprit: 2, 3, 1, ...
    onset = 40 + 10 * seed
    pause_s = {
        "checkpoint": 25.0,
        "evaluation": 25.0,
        "startup_barrier": 25.0,
        "slow_loader": 12.0,  # each shard opening 12-15 s
        "setup_barriers": round(20.0 + 20.0 * random.Random(seed).random(), 1),  # 20-40 s
        "hf_save": 30.0,
        "long_collective": 25.0,
        "disk_stall": 30.0,
        "endless_pause": 3.0,  # the three earlier saves; the last one never ends
    }.get(kind, 0.4)
    steps = {"slow_loader": 3 * onset + 10, "hf_save": onset + 40, "churn_groups": 600}.get(kind, 200)
    watch_s = {
        "slow_loader": 150.0,
        "setup_barriers": 120.0,
        "hf_save": 120.0,
        "endless_pause": 120.0,
        "disk_stall": 90.0,
    }.get(kind, 75.0)
    return HangCase(
        kind,
        seed=seed,
        world=world,
        target=target,
        partner=(target + 1) % world,
        onset_step=onset,
        steps=steps,
        pause_s=pause_s,
        watch_s=watch_s,
        backend=backend,
    )


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):.1f}" if values else "-"


def _spread(values: list[float | None]) -> str:
    """``median / max`` of the values that are there."""
    present = [v for v in values if v is not None]
    return f"{_median(present)} / {max(present):.1f}" if present else "- / -"


def _line(outcome: HangOutcome) -> dict[str, object]:
    case = outcome.case
    return {
        "kind": case.kind,
        "backend": case.backend,
        "seed": case.seed,
        "target": case.target,
        "right": outcome.right,
        "analyzer_s": outcome.analyzer_first_s,
        "analyzer_named": outcome.analyzer_named,
        "group": outcome.analyzer_group,
        "mismatch": outcome.analyzer_mismatch,
        "cli_named": outcome.cli_named,
        "rule_s": outcome.rule_first_s,
        "rule": outcome.rule_name,
        "rule_named": outcome.rule_named,
        "page_s": outcome.page_first_s,
        "page": outcome.page_text,
        "pages_other": outcome.pages_other,
        "where": outcome.where,
        "stuck_state": outcome.stuck_state,
        "groups_seen": outcome.groups_seen,
        "job_labels": outcome.job_labels,
        "healthy_named": outcome.healthy_named if case.kind == "two_jobs" else None,
        "labels_disjoint": outcome.labels_disjoint,
        "fr_named": outcome.fr_named,
        "fr_agrees": outcome.fr_agrees,
        "notes": outcome.notes,
    }


def _summary(outcomes: list[HangOutcome], kinds: list[str], backends: list[str]) -> None:
    hangs = [o for o in outcomes if o.case.is_hang]
    crashes = [o for o in outcomes if o.case.is_crash]
    controls = [o for o in outcomes if not o.case.is_hang and not o.case.is_crash]
    print()
    print(
        "| | backend | cases | right first | groups named | analyzer s (median / max) | rule fired s (median / max) | "
        "page s (median / max) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for kind in [k for k in kinds if k in HANGS]:
        for backend in backends:
            group = [o for o in hangs if o.case.kind == kind and o.case.backend == backend]
            if not group:
                continue
            named = sorted(
                {
                    o.analyzer_group + (f" (mismatch {o.analyzer_mismatch})" if o.analyzer_mismatch else "")
                    for o in group
                }
                - {""}
            )
            print(
                f"| {kind} | {backend} | {len(group)} | {sum(o.right for o in group)}/{len(group)} | "
                f"{', '.join(named) or '-'} | {_spread([o.analyzer_first_s for o in group])} | "
                f"{_spread([o.rule_first_s for o in group])} | {_spread([o.page_first_s for o in group])} |"
            )
    stalls = [o for o in hangs if o.case.kind == "host_stall"]
    if stalls:
        print(
            f"\nhost stalls whose summary names the stalling function (load_batch): "
            f"{sum('load_batch' in o.where for o in stalls)}/{len(stalls)}"
        )
    for kind in [k for k in kinds if k in CRASHES]:
        group = [o for o in crashes if o.case.kind == kind]
        if not group:
            continue
        print(
            f"{kind}: trainhealth localize on the survivors' Flight Recorder dumps named the target first in "
            f"{sum(o.right for o in group)}/{len(group)}; torch's fr_trace reported the same ranks in "
            f"{sum(bool(o.fr_agrees) for o in group)}/{len(group)}"
        )
    if controls:
        print("\ncontrols: hang verdict / hang rule / hang page, seconds after the onset, per seed ('-': none)")
        for kind in [k for k in kinds if k in CONTROLS]:
            for backend in backends:
                group = [o for o in controls if o.case.kind == kind and o.case.backend == backend]
                if group:
                    seeds = "; ".join(
                        f"seed {o.case.seed}: {_dash(o.analyzer_first_s)} / {_dash(o.rule_first_s)} / "
                        f"{_dash(o.page_first_s)}" + ("" if o.right else " FAILED")
                        for o in group
                    )
                    print(f"  {kind} ({backend}): {sum(not o.right for o in group)}/{len(group)} alarmed; {seeds}")
    two = [o for o in hangs if o.case.kind == "two_jobs"]
    if two:
        print(
            f"\ntwo jobs of one logical name, one Prometheus: the hung one named {sum(o.named for o in two)}/{len(two)}, "
            f"the healthy one never named {sum(not o.healthy_named for o in two)}/{len(two)}, job labels disjoint "
            f"{sum(bool(o.labels_disjoint) for o in two)}/{len(two)}"
            + "".join(
                f"\n  {o.case.name}: {o.job_labels} (job_name {o.job_names}); the healthy job judged "
                f"{o.healthy_judged} times"
                for o in two
            )
        )
    disk = [o for o in hangs if o.case.kind == "disk_stall"]
    if disk:
        print(
            f"disk stalled 30 s from the onset: paged within {DISK_STALL_PAGE_S:.0f} s in "
            f"{sum(o.page_first_s is not None and o.page_first_s <= DISK_STALL_PAGE_S for o in disk)}/{len(disk)}; "
            f"page s: {', '.join(_dash(o.page_first_s) for o in disk)}; after the disk came back, stack files in "
            f"{sum(o.stacks_files > 0 for o in disk)}/{len(disk)}, Flight Recorder dumps named the target in "
            f"{sum(o.fr_named == o.case.target for o in disk)}/{len(disk)}"
        )
    endless = [o for o in hangs if o.case.kind == "endless_pause"]
    if endless:
        print(
            f"endless pause: named rank 0 and paged with its reason in {sum(o.right for o in endless)}/{len(endless)}"
            + "".join(
                f"\n  {o.case.name}: page {_dash(o.page_first_s)} s, {o.page_alerts}: {o.page_text[:160]!r}"
                for o in endless
            )
        )
    right = sum(o.right for o in hangs)
    print(
        f"hangs named right (analyzer and rule, the target first, and each kind's own condition): {right}/{len(hangs)}; "
        f"trainhealth analyze --once --json named it in {sum(o.cli_named == o.case.target for o in hangs)}"
    )
    compared = [o for o in hangs if o.fr_agrees is not None]
    print(
        f"Flight Recorder dumps: trainhealth localize named the target in "
        f"{sum(o.fr_named == o.case.target for o in hangs)}/{len(hangs)}; torch's fr_trace reported the same "
        f"group, sequence number and ranks in {sum(bool(o.fr_agrees) for o in compared)}/{len(compared)} "
        f"compared ({len(hangs) - len(compared)} without a report to compare)"
    )


def _dash(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS)
    parser.add_argument("--out", type=Path, default=Path("/tmp/hanglab"))
    parser.add_argument(
        "--rescore", action="store_true", help="summarise the outcome.json files already under --out; run nothing"
    )
    args = parser.parse_args()
    outcomes: list[HangOutcome] = []
    for seed in args.seeds:
        for kind in args.kinds:
            for backend in args.backends:
                if backend != "gloo" and kind in GLOO_ONLY:
                    continue
                case = _case(kind, seed, backend)
                if args.rescore:
                    path = args.out / case.name / "outcome.json"
                    if not path.is_file():
                        print(f"# not run: {path}", flush=True)
                        continue
                    outcome = HangOutcome.from_dict(json.loads(path.read_text()))
                else:
                    outcome = run_hang_case(case, args.out / case.name)
                outcomes.append(outcome)
                print(json.dumps(_line(outcome)), flush=True)
    _summary(outcomes, args.kinds, args.backends)


if __name__ == "__main__":
    main()
