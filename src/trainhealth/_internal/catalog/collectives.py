"""Collective-operation metrics, from the collective logger (:mod:`trainhealth.comm`)."""

from __future__ import annotations

from trainhealth._internal.catalog.spec import _C, _G, _H, _I, MetricSpec, Unit

# Collectives last from microseconds (a small all-reduce on NVLink) to minutes (a stall).
COMM_SECONDS_BUCKETS = (
    1e-5,
    2.5e-5,
    5e-5,
    1e-4,
    2.5e-4,
    5e-4,
    1e-3,
    2.5e-3,
    5e-3,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
)
COMM_OP_DURATION = MetricSpec(
    "comm.op.duration",
    _H,
    Unit.SECONDS,
    "Elapsed time of collective operations on this rank, waiting for the other ranks included",
    labels=("op", "group"),
    buckets=COMM_SECONDS_BUCKETS,
)
COMM_OPS = MetricSpec(
    "comm.ops", _C, Unit.OPERATIONS, "Collective operations completed by this rank", labels=("op", "group")
)
COMM_BYTES = MetricSpec(
    "comm.bytes", _C, Unit.BYTES, "Bytes this rank sent into collective operations", labels=("op", "group")
)
COMM_INFLIGHT_DURATION = MetricSpec(
    "comm.inflight.duration",
    _G,
    Unit.SECONDS,
    "How long the oldest collective this rank launched and has not seen complete has been in flight (on NCCL a call "
    "returns at enqueue: in flight until its Work completes); 0 when none is",
    labels=("op", "group"),
)
COMM_STARTED_SEQ = MetricSpec(
    "comm.started_seq",
    _G,
    Unit.DIMENSIONLESS,
    "Sequence number of the last collective this rank entered in the group; a rank below its peers' lags",
    labels=("group",),
)
COMM_COMPLETED_SEQ = MetricSpec(
    "comm.completed_seq",
    _G,
    Unit.DIMENSIONLESS,
    "Sequence number of the last collective this rank completed in the group",
    labels=("group",),
)
COMM_GROUP_MEMBER = MetricSpec(
    "comm.group.member",
    _I,
    Unit.DIMENSIONLESS,
    "A process group this rank used: its rank within the group (group_rank, 0 to size-1) and how many members the "
    "group has; a position no rank reports, now or in the last minutes, is a member missing",
    labels=("group", "group_rank", "size"),
)
COMM_WATCH_TIMESTAMP = MetricSpec(
    "comm.watch.timestamp",
    _G,
    Unit.SECONDS,
    "Unix time of the hang watcher's last look at this rank (about once a second): when a gone rank was last alive",
)
COMM_HANG_THRESHOLD = MetricSpec(
    "comm.hang.threshold",
    _G,
    Unit.SECONDS,
    "How long a wait in a collective or a stop outside them lasts before this rank counts as stuck: 3x its longest "
    "recent step, collective or checkpoint save, at least 10 s (at least 60 s until the job's first step)",
)
COMM_PAUSED = MetricSpec(
    "comm.paused",
    _G,
    Unit.DIMENSIONLESS,
    "1 while the training loop is in a pause it announced (Monitor.pause: a checkpoint save, an evaluation) and "
    "within its bound; 0 once it ended or passed its bound",
    labels=("reason",),
)
COMM_STUCK_DURATION = MetricSpec(
    "comm.stuck.duration",
    _G,
    Unit.SECONDS,
    "How long this rank has been stuck past its hang threshold, in a collective or outside them, or in an announced "
    "pause past its bound (state in_pause, op its reason), with the top frames of its training thread (where); "
    "absent while it is not",
    labels=("state", "op", "group", "seq", "where"),
)
COMM_FAILURES = MetricSpec(
    "comm.failures",
    _C,
    Unit.OPERATIONS,
    "Collectives that raised on this rank (a peer gone, a timeout, an aborted communicator); the first one's error "
    "heads the stacks file the hang watcher writes",
    labels=("op", "group"),
)
COMM_ABNORMAL_OPS = MetricSpec(
    "comm.abnormal_ops",
    _C,
    Unit.OPERATIONS,
    "Collectives far slower than their recent baseline on this rank (the records kept for shipping)",
    labels=("op", "group"),
)
COMM_RECORDS_DROPPED = MetricSpec(
    "comm.records_dropped",
    _C,
    Unit.RECORDS,
    "Operation records overwritten in the ring buffer before a trace was written",
)
