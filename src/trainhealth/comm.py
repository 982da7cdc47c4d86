"""The collective logger: every ``torch.distributed`` collective timed and traced, per rank.

::

    import trainhealth.comm
    trainhealth.comm.install(trace_dir="traces")      # wraps the torch.distributed collectives
    model = trainhealth.comm.instrument_ddp(DistributedDataParallel(model))  # DDP's buckets too
    ...
    trainhealth.comm.uninstall()                      # restores torch.distributed, writes the trace

>>> import trainhealth.comm
>>> trainhealth.comm.installed() is None
True
"""

from trainhealth._internal.exporters.collectives.install import (
    CollectiveLogger,
    install,
    installed,
    instrument_ddp,
    uninstall,
)
from trainhealth._internal.exporters.collectives.probe import probe_links

__all__ = ["CollectiveLogger", "install", "installed", "instrument_ddp", "probe_links", "uninstall"]
