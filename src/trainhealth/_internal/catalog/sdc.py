"""Silent data corruption and instability metrics: cross-replica checks, loss spikes, model signals, self-tests."""

from __future__ import annotations

from trainhealth._internal.catalog.spec import _C, _G, MetricSpec, Unit

SDC_SUSPECT = MetricSpec(
    "sdc.suspect",
    _G,
    Unit.DIMENSIONLESS,
    "1 while the last check found this rank computing different numbers from its peers, else 0; check is "
    "fingerprint (parameters differ from the other replicas) or grad_norm (local gradient norm far from the peers')",
    labels=("check",),
    availability="With torch.distributed initialised, from the first check step.",
)
SDC_CHECKS = MetricSpec(
    "sdc.checks",
    _C,
    Unit.EVENTS,
    "Cross-replica checks this rank took part in, by check",
    labels=("check",),
    availability="With torch.distributed initialised.",
)
SDC_MISMATCHES = MetricSpec(
    "sdc.mismatches",
    _C,
    Unit.EVENTS,
    "Cross-replica checks that found this rank in the minority, by check",
    labels=("check",),
    availability="With torch.distributed initialised.",
)
SDC_MISMATCHED_TENSORS = MetricSpec(
    "sdc.mismatched_tensors",
    _G,
    Unit.DIMENSIONLESS,
    "Parameter tensors whose fingerprint differed from the other replicas' at the last check (names in the "
    "sdc_suspect event)",
    availability="With torch.distributed initialised.",
)
TRAIN_LOCAL_GRAD_NORM = MetricSpec(
    "train.local_grad_norm",
    _G,
    Unit.DIMENSIONLESS,
    "This rank's gradient norm before the data-parallel all-reduce, on check steps",
    availability="With torch.distributed initialised; every grad_check_every steps.",
)
TRAIN_LOCAL_GRAD_NORM_PEER_RATIO = MetricSpec(
    "train.local_grad_norm.peer_ratio",
    _G,
    Unit.RATIO,
    "This rank's local gradient norm over the median of the other ranks'",
    availability="With torch.distributed initialised; every grad_check_every steps.",
)
TRAIN_NONFINITE_ORIGIN = MetricSpec(
    "train.nonfinite_origin",
    _C,
    Unit.STEPS,
    "Steps with a non-finite or overflowing loss or gradient norm whose first bad value on this rank came out of "
    "this block (its output, else its local gradient); head_or_loss when every block output was finite and the "
    "loss was not (the output head or the loss, judged by elimination); all_reduce when only the averaged "
    "gradient had one",
    labels=("block",),
    availability="With model signals on, after a non-finite value.",
)
TRAIN_NONFINITE_FIRST_STEP = MetricSpec(
    "train.nonfinite_origin.first_step",
    _G,
    Unit.DIMENSIONLESS,
    "Step at which this rank first saw a non-finite or overflowing value; where is local when it produced it "
    "before the gradient all-reduce, received when it came through the all-reduce. The rank with where=local "
    "(the lowest value, if several) is the origin",
    labels=("where",),
    availability="With model signals on, after a non-finite value.",
)
TRAIN_LOSS_SPIKE_UNRECOVERED = MetricSpec(
    "train.loss_spike.unrecovered",
    _G,
    Unit.DIMENSIONLESS,
    "1 when the last loss spike had not recovered 50 steps after it began, 0 when it had",
    availability="After a loss spike has been followed for 50 steps.",
)
TRAIN_LOSS_SPIKE_ONSET_STEP = MetricSpec(
    "train.loss_spike.onset_step",
    _G,
    Unit.DIMENSIONLESS,
    "Step at which the last followed loss spike began",
    availability="After a loss spike has been followed for 50 steps.",
)
TRAIN_LOSS_SPIKE_REWIND_STEP = MetricSpec(
    "train.loss_spike.rewind_step",
    _G,
    Unit.DIMENSIONLESS,
    "Step of the last checkpoint saved before the last unrecovered loss spike began: where to rewind to",
    availability="After an unrecovered loss spike, when Monitor.checkpoint_saved() reported an earlier checkpoint.",
)
MODEL_ATTENTION_MAX_LOGIT = MetricSpec(
    "model.attention.max_logit",
    _G,
    Unit.DIMENSIONLESS,
    "Largest attention logit q.k/sqrt(d) on a sampled slice (an upper bound for rotary q_proj/k_proj attention)",
    labels=("layer",),
    availability="With model signals on; every stats_every steps.",
)
MODEL_ATTENTION_ENTROPY = MetricSpec(
    "model.attention.entropy",
    _G,
    Unit.DIMENSIONLESS,
    "Mean entropy (nats) of the attention probabilities on a sampled slice; collapse towards 0 precedes instability",
    labels=("layer",),
    availability="With model signals on, for torch.nn.MultiheadAttention layers; every stats_every steps.",
)
MODEL_OUTPUT_LOG_Z = MetricSpec(
    "model.output.log_z",
    _G,
    Unit.DIMENSIONLESS,
    "Mean log-sum-exp of the output logits on a sampled slice (what z-loss keeps near 0)",
    availability="With model signals on and an output head found; every stats_every steps.",
)
MODEL_ACTIVATION_RMS = MetricSpec(
    "model.activation.rms",
    _G,
    Unit.DIMENSIONLESS,
    "Root mean square of a block's output activations",
    labels=("block",),
    availability="With model signals on; every stats_every steps.",
)
SELFTEST_PASSED = MetricSpec(
    "selftest.passed",
    _G,
    Unit.DIMENSIONLESS,
    "1 when the last self-test check on this device matched the golden reference, else 0",
    labels=("device", "check"),
    identity=("job", "host"),
    availability="From trainhealth selftest --metrics-file or Monitor.selftest().",
)
SELFTEST_ERROR = MetricSpec(
    "selftest.error",
    _G,
    Unit.DIMENSIONLESS,
    "Largest relative error of the last self-test check against the golden reference",
    labels=("device", "check"),
    identity=("job", "host"),
    availability="From trainhealth selftest --metrics-file or Monitor.selftest().",
)
SELFTEST_TIMESTAMP = MetricSpec(
    "selftest.timestamp",
    _G,
    Unit.SECONDS,
    "Unix time of the last self-test on this host",
    identity=("job", "host"),
    availability="From trainhealth selftest --metrics-file or Monitor.selftest().",
)
