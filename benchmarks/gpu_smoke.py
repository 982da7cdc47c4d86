"""Real-NVML smoke run: sample every GPU of this machine once and print every metric read.

    python benchmarks/gpu_smoke.py

Run it on a GPU machine (it exits with status 2 and one line where NVML is
absent). It prints the driver and GPUs found, the time of one sampling pass,
every series the pass produced, the readings each GPU answered NOT_SUPPORTED
to, whether XID events can be registered, and whether DCGM is reachable.
"""

from __future__ import annotations

import sys
import time

import pynvml

from trainhealth._internal.events import EventLog
from trainhealth._internal.exporters.gpu.dcgm import DcgmProfiler
from trainhealth._internal.exporters.gpu.sampler import GpuSampler
from trainhealth._internal.exporters.gpu.xid_watcher import XidWatcher
from trainhealth._internal.store import HistogramValue, MetricStore


def main() -> int:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        print(f"gpu_smoke: NVML is not available here: {error}", file=sys.stderr)
        return 2
    print(
        f"driver {pynvml.nvmlSystemGetDriverVersion()}, NVML {pynvml.nvmlSystemGetNVMLVersion()}, "
        f"{pynvml.nvmlDeviceGetCount()} GPU(s)"
    )
    pynvml.nvmlShutdown()

    store, events = MetricStore(), EventLog()
    sampler = GpuSampler(store, pynvml, backend="nvml", events=events)
    sampler.start(thread=False)
    begin = time.perf_counter()
    sampler.sample_once()
    print(f"one sampling pass: {1e3 * (time.perf_counter() - begin):.1f} ms wall")
    for family in store.snapshot():
        for labels, value in family.samples:
            shown = value.count if isinstance(value, HistogramValue) else value
            print(f"  {family.spec.prometheus_name}{dict(zip(family.spec.labels, labels))} {shown}")
    for gpu in sampler._gpus:  # noqa: SLF001 - a diagnostic script may look inside
        print(
            f"GPU {gpu.index} ({gpu.uuid}): not supported: {', '.join(sorted(gpu.unsupported)) or 'nothing'}; "
            f"NVLink links: {list(gpu.links or [])}"
        )
    watcher = XidWatcher(store, pynvml, sampler.gpus, events=events)
    print(f"XID events: {'registered' if watcher.start() else 'not available'}")
    watcher.close()
    try:
        profiler = DcgmProfiler()
        time.sleep(2)
        print(f"DCGM profiling fields: {profiler.read([index for index, _, _ in sampler.gpus])}")
        profiler.close()
    except Exception as error:  # DcgmUnavailable, or an error of DCGM's own bindings
        print(f"DCGM: {error}")
    sampler.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
