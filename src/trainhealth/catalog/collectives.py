"""Collective-operation metrics, from the collective logger (:mod:`trainhealth.comm`)."""

from __future__ import annotations

from trainhealth.catalog.spec import _C, _G, _H, MetricSpec, Unit

# Collectives last from microseconds (a small all-reduce on NVLink) to minutes (a stall).
COMM_SECONDS_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1,
                        0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
COMM_OP_DURATION = MetricSpec(
    "comm.op.duration", _H, Unit.SECONDS,
    "Elapsed time of collective operations on this rank, waiting for the other ranks included",
    labels=("op", "group"), buckets=COMM_SECONDS_BUCKETS,
)
COMM_OPS = MetricSpec("comm.ops", _C, Unit.OPERATIONS, "Collective operations completed by this rank", labels=("op", "group"))
COMM_BYTES = MetricSpec("comm.bytes", _C, Unit.BYTES, "Bytes this rank sent into collective operations", labels=("op", "group"))
COMM_INFLIGHT_DURATION = MetricSpec(
    "comm.inflight.duration", _G, Unit.SECONDS,
    "How long this rank has been inside the collective it is waiting in; 0 when it is in none",
    labels=("op", "group"),
)
COMM_STARTED_SEQ = MetricSpec(
    "comm.started_seq", _G, Unit.DIMENSIONLESS,
    "Sequence number of the last collective this rank entered in the group; a rank below its peers' lags",
    labels=("group",),
)
COMM_COMPLETED_SEQ = MetricSpec(
    "comm.completed_seq", _G, Unit.DIMENSIONLESS,
    "Sequence number of the last collective this rank completed in the group",
    labels=("group",),
)
COMM_ABNORMAL_OPS = MetricSpec(
    "comm.abnormal_ops", _C, Unit.OPERATIONS,
    "Collectives far slower than their recent baseline on this rank (the records kept for shipping)",
    labels=("op", "group"),
)
COMM_RECORDS_DROPPED = MetricSpec(
    "comm.records_dropped", _C, Unit.RECORDS,
    "Operation records overwritten in the ring buffer before a trace was written",
)
