"""The hang lab's figures: real 4-rank gloo jobs that hang, or pause and recover, judged live.

Each case runs a real job (trainhealth_lab.hangs.rank) with the Monitor on every
rank, a real Prometheus (2 s scrapes and rule evaluation, trainhealth's generated
rules) and a real Alertmanager routing with trainhealth's routing tree to a webhook.
Every 2 s the analyzer (the code of `trainhealth analyze --prometheus URL`) is run
once. Printed per case, and summarised: whether the right rank was named first, how
many seconds after the onset the analyzer said `hang`, the rule fired and the page
arrived, and where the target's watcher found it stuck. Controls must end with no
hang verdict and no hang page. Crashes (a rank that exits plainly, a size mismatch)
end the job within a second: they are named by `trainhealth localize` on the Flight
Recorder dumps the surviving ranks wrote as their collective failed.

    .venv/bin/python benchmarks/hangs.py --seeds 2 3 4 --out /tmp/hanglab
    .venv/bin/python benchmarks/hangs.py --seeds 2 3 4 --out /tmp/hanglab --rescore   # recount, run nothing
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from trainhealth_lab.hangs.harness import (
    CONTROLS,
    CRASHES,
    HANGS,
    HangCase,
    HangOutcome,
    run_hang_case,
)


def _case(kind: str, seed: int) -> HangCase:
    world = 4
    target = (seed + 1) % world or 1  # vary the culprit: 2, 3, 1, ...
    partner = (target + 1) % world
    onset = 40 + 10 * seed
    return HangCase(
        kind,
        seed=seed,
        world=world,
        target=target,
        partner=partner,
        onset_step=onset,
        pause_s=25.0 if kind in ("checkpoint", "evaluation", "startup_barrier") else 0.4,
    )


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):.1f}" if values else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--kinds", nargs="+", default=[*HANGS, *CRASHES, *CONTROLS], choices=[*HANGS, *CRASHES, *CONTROLS]
    )
    parser.add_argument("--out", type=Path, default=Path("/tmp/hanglab"))
    parser.add_argument(
        "--rescore", action="store_true", help="summarise the outcome.json files already under --out; run nothing"
    )
    args = parser.parse_args()
    outcomes: list[HangOutcome] = []
    for seed in args.seeds:
        for kind in args.kinds:
            case = _case(kind, seed)
            if args.rescore:
                outcome = _load(args.out / f"{kind}-{seed}" / "outcome.json")
            else:
                outcome = run_hang_case(case, args.out / f"{kind}-{seed}")
            outcomes.append(outcome)
            print(
                json.dumps(
                    {
                        "kind": kind,
                        "seed": seed,
                        "target": case.target,
                        "right": outcome.right,
                        "analyzer_s": outcome.analyzer_first_s,
                        "analyzer_named": outcome.analyzer_named,
                        "cli_named": outcome.cli_named,
                        "rule_s": outcome.rule_first_s,
                        "rule": outcome.rule_name,
                        "rule_named": outcome.rule_named,
                        "page_s": outcome.page_first_s,
                        "where": outcome.where,
                        "fr_named": outcome.fr_named,
                        "fr_agrees": outcome.fr_agrees,
                        "notes": outcome.notes,
                    }
                ),
                flush=True,
            )
    hangs = [o for o in outcomes if o.case.is_hang]
    crashes = [o for o in outcomes if o.case.is_crash]
    controls = [o for o in outcomes if not o.case.is_hang and not o.case.is_crash]
    print()
    print(
        "| | cases | right rank first | analyzer s (median / max) | rule fired s (median / max) | "
        "page s (median / max) |"
    )
    print("|---|---|---|---|---|---|")
    for kind in [k for k in args.kinds if k in HANGS]:
        group = [o for o in hangs if o.case.kind == kind]
        analyzer = [o.analyzer_first_s for o in group if o.analyzer_first_s is not None]
        rule = [o.rule_first_s for o in group if o.rule_first_s is not None]
        page = [o.page_first_s for o in group if o.page_first_s is not None]
        print(
            f"| {kind} | {len(group)} | {sum(o.right for o in group)}/{len(group)} | {_median(analyzer)} / "
            f"{max(analyzer, default=float('nan')):.1f} | {_median(rule)} / {max(rule, default=float('nan')):.1f} "
            f"| {_median(page)} / {max(page, default=float('nan')):.1f} |"
        )
    stalls = [o for o in hangs if o.case.kind == "host_stall"]
    print(
        f"\nhost stalls whose summary names the stalling function (load_batch): "
        f"{sum('load_batch' in o.where for o in stalls)}/{len(stalls)}"
    )
    for kind in [k for k in args.kinds if k in CRASHES]:
        group = [o for o in crashes if o.case.kind == kind]
        print(
            f"{kind}: trainhealth localize on the survivors' Flight Recorder dumps named the target first in "
            f"{sum(o.right for o in group)}/{len(group)}; torch's fr_trace reported the same ranks in "
            f"{sum(bool(o.fr_agrees) for o in group)}/{len(group)}"
        )
    alarms = [o for o in controls if not o.right]
    print(
        f"controls with a hang verdict or a hang page: {len(alarms)}/{len(controls)}"
        + "".join(
            f"\n  {o.case.kind}-{o.case.seed}: analyzer {o.analyzer_first_s}, rule {o.rule_first_s}, "
            f"page {o.page_first_s}"
            for o in alarms
        )
    )
    right = sum(o.right for o in hangs)
    print(
        f"hangs named right (analyzer and rule, the target first): {right}/{len(hangs)}; "
        f"trainhealth analyze --once --json named it in {sum(o.cli_named == o.case.target for o in hangs)}"
    )
    compared = [o for o in hangs if o.fr_agrees is not None]
    print(
        f"Flight Recorder dumps: trainhealth localize named the target in "
        f"{sum(o.fr_named == o.case.target for o in hangs)}/{len(hangs)}; torch's fr_trace reported the same "
        f"group, sequence number and ranks in {sum(bool(o.fr_agrees) for o in compared)}/{len(compared)} "
        f"compared ({len(hangs) - len(compared)} without a report to compare)"
    )


def _load(path: Path) -> HangOutcome:
    data = json.loads(path.read_text())
    data.pop("right", None)
    data.pop("fr_agrees", None)
    case = HangCase(**data.pop("case"))
    return HangOutcome(case, **data)


if __name__ == "__main__":
    main()
