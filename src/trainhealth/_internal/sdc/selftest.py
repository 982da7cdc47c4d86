"""Proactive validation: deterministic workloads checked against a golden reference and across devices.

Silent data corruption shows only when a result is compared with a known
answer. Each check runs a fixed, seeded workload on a device and compares it
with the same workload computed in float64 on the CPU (the golden reference):

* ``gemm`` — a float32 matrix product; its error must stay within what float32
  accumulation allows (a bound from the sizes, not a guess);
* ``reduction`` — float32 sums of a large vector and of its rows;
* ``elementwise`` — a chain of exp/log/tanh/sqrt, float32 against float64;
* ``repeat`` — the GEMM again, bit-identical to the first run (a device that
  computes differently the second time is broken, whatever the reference says).

Devices of one kind running the same kernels agree bit for bit, so results are
also compared across devices: a device whose GEMM differs from the majority of
its peers is flagged even when it stays within tolerance.

>>> results = run_selftest(["cpu"], size=64)
>>> [(r.check, r.passed) for r in results]
[('gemm', True), ('reduction', True), ('elementwise', True), ('repeat', True)]
"""

from __future__ import annotations

import hashlib
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

__all__ = ["CHECKS", "SelftestResult", "available_devices", "run_selftest"]

CHECKS = ("gemm", "reduction", "elementwise", "repeat")
_EPS32 = 2.0**-24  # float32 unit roundoff


@dataclass(frozen=True)
class SelftestResult:
    """One check on one device: its error against the reference and the tolerance it had to meet."""

    device: str
    check: str
    passed: bool
    max_error: float  # relative to the reference's scale
    tolerance: float
    seconds: float
    digest: str = ""  # hash of the result's bits, for comparing devices
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "check": self.check,
            "passed": self.passed,
            "max_error": self.max_error,
            "tolerance": self.tolerance,
            "seconds": round(self.seconds, 6),
            "detail": self.detail,
        }


def available_devices() -> list[str]:
    """``cpu`` and every CUDA device torch sees."""
    import torch

    return ["cpu"] + [f"cuda:{index}" for index in range(torch.cuda.device_count())]


def run_selftest(
    devices: Sequence[str] | None = None,
    size: int = 1024,
    seed: int = 0,
    inject: Callable[[str, str, Any], None] | None = None,
) -> list[SelftestResult]:
    """Every check on every device (default: all), then the cross-device comparison.

    ``inject(device, check, result)`` may corrupt a result in place before it is
    judged (trainhealth._internal.injectors.bits), to prove the self-test catches what it should.
    """
    import torch

    devices = list(devices) if devices else available_devices()
    generator = torch.Generator().manual_seed(seed)
    a = torch.randn(size, size, generator=generator, dtype=torch.float64)
    b = torch.randn(size, size, generator=generator, dtype=torch.float64)
    v = torch.rand(size * 64, generator=generator, dtype=torch.float64) + 0.5
    inputs = {"a": a, "b": b, "v": v}
    golden = {
        "gemm": a.float().double() @ b.float().double(),
        "reduction": torch.cat([v.float().double().sum().reshape(1), v.float().double().reshape(64, size).sum(dim=1)]),
        "elementwise": _chain(v.float().double()),
    }
    results = []
    for device in devices:
        results += _run_device(torch, device, inputs, golden, size, inject)
    return _compare_devices(results)


def _chain(x: Any) -> Any:
    return (x.exp().log1p() * x.tanh()).sqrt() + x.sin() * 0.5


def _run_device(
    torch: Any,
    device: str,
    inputs: dict[str, Any],
    golden: dict[str, Any],
    size: int,
    inject: Callable[[str, str, Any], None] | None,
) -> list[SelftestResult]:
    on = {name: tensor.to(device=device, dtype=torch.float32) for name, tensor in inputs.items()}
    out = []
    first_gemm = None
    for check in CHECKS:
        began = time.perf_counter()
        if check == "gemm" or check == "repeat":
            result = on["a"] @ on["b"]
        elif check == "reduction":
            result = torch.cat([on["v"].sum().reshape(1), on["v"].reshape(64, size).sum(dim=1)])
        else:
            result = _chain(on["v"])
        if device.startswith("cuda"):
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - began
        if inject is not None:
            inject(device, check, result)
        host = result.double().cpu()
        digest = hashlib.sha256(result.cpu().numpy().tobytes()).hexdigest()[:16]
        if check == "repeat":
            identical = first_gemm is not None and torch.equal(first_gemm, result.cpu())
            out.append(
                SelftestResult(
                    device,
                    check,
                    identical,
                    0.0 if identical else float("inf"),
                    0.0,
                    seconds,
                    digest,
                    "" if identical else "a second run of the same GEMM gave different bits",
                )
            )
            continue
        if check == "gemm":
            first_gemm = result.cpu()
            # rounding errors of float32 accumulation grow like sqrt(terms) * eps * sum|a||b| (16x margin)
            scale = (inputs["a"].abs() @ inputs["b"].abs()).max().item()
            tolerance = 16 * math.sqrt(size) * _EPS32
        elif check == "reduction":
            scale = golden["reduction"].abs().max().item()
            tolerance = 16 * math.sqrt(size * 64) * _EPS32
        else:
            scale = golden["elementwise"].abs().max().item()
            tolerance = 64 * _EPS32
        error = (host - golden[check]).abs().max().item() / max(scale, 1e-300)
        passed = math.isfinite(error) and error <= tolerance
        out.append(
            SelftestResult(
                device,
                check,
                passed,
                error,
                tolerance,
                seconds,
                digest,
                "" if passed else f"error {error:.3g} above tolerance {tolerance:.3g}",
            )
        )
    return out


def _compare_devices(results: list[SelftestResult]) -> list[SelftestResult]:
    """Devices of one kind should agree bit for bit: flag the ones outside the majority of three or more."""
    out = list(results)
    for check in ("gemm", "reduction", "elementwise"):
        for kind in ("cuda",):
            same = [i for i, r in enumerate(out) if r.check == check and r.device.startswith(kind)]
            if len(same) < 3:
                continue
            common, count = Counter(out[i].digest for i in same).most_common(1)[0]
            if count * 2 <= len(same):
                continue
            for i in same:
                if out[i].digest != common:
                    out[i] = replace(
                        out[i],
                        passed=False,
                        detail=(out[i].detail + "; " if out[i].detail else "")
                        + f"differs from {count} of {len(same)} {kind} devices",
                    )
    return out


def publish_results(store: Any, events: Any, results: Sequence[SelftestResult]) -> None:
    """Set the self-test metrics in a :class:`~trainhealth._internal.store.MetricStore`; a failed check is also an event."""
    from trainhealth._internal import catalog
    from trainhealth._internal.events import Event, Severity

    for result in results:
        labels = (result.device, result.check)
        store.set(catalog.SELFTEST_PASSED, 1.0 if result.passed else 0.0, labels)
        if math.isfinite(result.max_error):
            store.set(catalog.SELFTEST_ERROR, result.max_error, labels)
        if not result.passed and events is not None:
            events.emit(
                Event(
                    "selftest_failed",
                    Severity.CRITICAL,
                    f"self-test {result.check} failed on {result.device}: {result.detail}",
                    {"device": result.device, "check": result.check},
                )
            )
    store.set(catalog.SELFTEST_TIMESTAMP, time.time())
