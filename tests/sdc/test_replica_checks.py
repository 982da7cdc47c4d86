"""Cross-replica SDC checks on real 4-rank DDP training over gloo, with injected faults."""

from __future__ import annotations

import json

import pytest

from tests.distributed import init_rank, run_ranks
from trainhealth_lab.bench.sdc import Trial, run_trials

pytestmark = pytest.mark.slow  # the slow tier: `pytest -m slow`

WORLD = 4


def _run(rank, world, port, trials, out):
    import torch.distributed as dist

    init_rank(rank, world, port)
    results = run_trials(rank, world, trials)
    with open(f"{out}/rank-{rank}.json", "w") as handle:
        json.dump([r.to_dict() for r in results], handle)
    dist.destroy_process_group()


def _results(tmp_path, trials):
    run_ranks(_run, WORLD, trials, str(tmp_path), steps=sum(trial.steps for trial in trials))
    by_trial: dict[str, list[dict]] = {}
    for rank in range(WORLD):
        for result in json.loads((tmp_path / f"rank-{rank}.json").read_text()):
            by_trial.setdefault(result["trial"], []).append(result)
    return by_trial


def _origins(results):
    """Each rank's first non-finite origin: (step, block, local or received)."""
    return {
        r["rank"]: (r["origin"]["step"], r["origin"]["block"], r["origin"]["where"])
        for r in results
        if r["origin"] is not None
    }


def _detections(results, detector):
    return [d for r in results for d in r["detections"] if d["detector"] == detector]


def test_each_fault_is_caught_by_its_detector_and_names_the_rank(tmp_path):
    checks = {"sdc_interval": 5, "grad_check_every": 1}
    trials = [
        Trial("clean", steps=40, settings=checks),
        Trial(
            "parameter",
            steps=40,
            settings=checks,
            faults=(
                {
                    "kind": "bitflip",
                    "target": "parameter",
                    "tensor": "layers.1.mlp.0.weight",
                    "bit": 23,
                    "step": 12,
                    "ranks": [2],
                },
            ),
        ),
        Trial(
            "gradient",
            steps=40,
            settings=checks,
            faults=(
                {
                    "kind": "bitflip",
                    "target": "gradient",
                    "tensor": "layers.0.attn.in_proj_weight",
                    "bit": 30,
                    "step": 17,
                    "ranks": [1],
                },
            ),
        ),
        Trial(
            "activation_nan",
            steps=40,
            settings=checks,
            faults=({"kind": "nan", "target": "activation", "tensor": "layers.1.mlp", "step": 23, "ranks": [3]},),
        ),
    ]
    results = _results(tmp_path, trials)

    # what reached training (the trials' expected outcome): the loss or the averaged gradient norm going bad
    reached = {name: {r["rank"]: r["reached_training"] for r in results[name]} for name in results}
    assert reached["clean"] == reached["parameter"] == dict.fromkeys(range(WORLD))  # a halved weight stays finite
    assert reached["gradient"] == dict.fromkeys(range(WORLD), 17)  # ~1e35, averaged into every rank's norm
    assert reached["activation_nan"] == dict.fromkeys(range(WORLD), 23)

    # a fault-free run: every check ran on every rank and nobody was named
    clean = results["clean"]
    assert all(_detections(clean, d) == [] for d in ("fingerprint", "grad_norm", "nonfinite"))

    # a weight halved or doubled on rank 2 (lowest exponent bit) stays wrong, silently: the next fingerprint (step 15) names rank 2 and the tensor
    found = _detections(results["parameter"], "fingerprint")
    assert {d["rank"] for d in found} == {2}
    assert min(d["step"] for d in found) == 15
    assert all("layers.1.mlp.0.weight" in d["detail"].split(",") for d in found)
    injected = [e for r in results["parameter"] for e in r["injected"]]
    assert [(e["rank"], e["step"]) for e in injected] == [(2, 12)]

    # a corrupted local gradient on rank 1 is averaged into every replica: replicas agree, the norms do not
    assert _detections(results["gradient"], "fingerprint") == []
    found = _detections(results["gradient"], "grad_norm")
    assert {(d["rank"], d["step"]) for d in found} == {(1, 17)}
    # the flipped exponent made it ~1e35: rank 1 saw it in its own gradient, the others only after the all-reduce
    assert _origins(results["gradient"]) == {
        1: (17, "layers.0", "local"),
        **{r: (17, "all_reduce", "received") for r in (0, 2, 3)},
    }

    # a NaN out of layers.1's MLP on rank 3: its origin there at step 23; the others see it a step later, upstream
    origins = [
        (r["rank"], d["step"], d["detail"])
        for r in results["activation_nan"]
        for d in r["detections"]
        if d["detector"] == "nonfinite" and d["detail"].startswith("layers")
    ]
    first = min(origins, key=lambda o: o[1])
    assert first == (3, 23, "layers.1")
    assert all(step > 23 for rank, step, _ in origins if rank != 3)
    assert _origins(results["activation_nan"]) == {
        3: (23, "layers.1", "local"),
        **{r: (23, "all_reduce", "received") for r in (0, 1, 2)},
    }
