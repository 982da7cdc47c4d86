"""Training-loop metrics, reported by the Monitor: step timing, throughput, optimizer statistics."""

from __future__ import annotations

from trainhealth._internal.catalog.spec import _C, _G, _H, MetricSpec, Unit

# Step times run from ~10 ms (small models) to minutes (huge ones, or a stall).
STEP_SECONDS_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)

TRAIN_LOSS = MetricSpec("train.loss", _G, Unit.DIMENSIONLESS, "Training loss of the last reported step")
TRAIN_STEP = MetricSpec(
    "train.step",
    _G,
    Unit.DIMENSIONLESS,
    "Training iteration of the last reported step (as given by the training loop)",
)
TRAIN_STEPS = MetricSpec("train.steps", _C, Unit.STEPS, "Training steps reported since the process started")
TRAIN_LAST_STEP_TIMESTAMP = MetricSpec(
    "train.last_step.timestamp",
    _G,
    Unit.SECONDS,
    "Unix time at which the last step was reported",
)
TRAIN_STEP_DURATION = MetricSpec(
    "train.step.duration",
    _H,
    Unit.SECONDS,
    "Wall time between consecutive reported steps",
    buckets=STEP_SECONDS_BUCKETS,
)
TRAIN_LAST_STEP_DURATION = MetricSpec(
    "train.last_step.duration",
    _G,
    Unit.SECONDS,
    "Wall time of the last reported step",
)
_STEP_SPLIT = (
    "Only with the collective logger (comm=True or trainhealth.comm installed) and a Monitor "
    "reporting steps; updated by the logger's flush thread."
)
TRAIN_STEP_WAIT = MetricSpec(
    "train.step.wait",
    _C,
    Unit.SECONDS,
    "Seconds of this rank's steps spent blocked in collectives, summed over steps (its rate over the rate of "
    "trainhealth_train_steps_total is the wait per step); the straggler is the rank that waits least",
    availability=_STEP_SPLIT,
)
TRAIN_STEP_COMPUTE = MetricSpec(
    "train.step.compute",
    _C,
    Unit.SECONDS,
    "Seconds of this rank's steps spent outside collectives (step wall time minus wait), summed over steps",
    availability=_STEP_SPLIT,
)
TRAIN_LAST_STEP_WAIT = MetricSpec(
    "train.last_step.wait",
    _G,
    Unit.SECONDS,
    "Seconds the last accounted step spent blocked in collectives",
    availability=_STEP_SPLIT,
)
TRAIN_LAST_STEP_COMPUTE = MetricSpec(
    "train.last_step.compute",
    _G,
    Unit.SECONDS,
    "Seconds the last accounted step spent outside collectives",
    availability=_STEP_SPLIT,
)
TRAIN_TOKENS = MetricSpec("train.tokens", _C, Unit.TOKENS, "Tokens processed by this rank")
TRAIN_THROUGHPUT = MetricSpec(
    "train.throughput",
    _G,
    Unit.TOKENS_PER_SECOND,
    "Tokens per second processed by this rank in the last step",
)
TRAIN_MFU = MetricSpec(
    "train.mfu",
    _G,
    Unit.RATIO,
    "Model FLOPs utilisation of the last step: achieved over peak FLOP/s",
    availability="Only when flops_per_token and peak_flops are set.",
)
TRAIN_GRAD_NORM = MetricSpec(
    "train.grad_norm",
    _G,
    Unit.DIMENSIONLESS,
    "Total L2 norm of the gradients: the pre-clipping norm the loop passes, else as the optimizer receives them",
)
TRAIN_PARAM_NORM = MetricSpec(
    "train.param_norm",
    _G,
    Unit.DIMENSIONLESS,
    "Total L2 norm of the parameters after the last update",
    availability="Updated every stats_every steps.",
)
TRAIN_UPDATE_RATIO = MetricSpec(
    "train.update_ratio",
    _G,
    Unit.RATIO,
    "Norm of the last optimizer update over the norm of the parameters it updated",
    availability="Needs an optimizer; updated every stats_every steps.",
)
TRAIN_UPDATE_COSINE = MetricSpec(
    "train.update_cosine",
    _G,
    Unit.DIMENSIONLESS,
    "Cosine similarity of two consecutive optimizer updates",
    availability="Needs an optimizer; updated every stats_every steps.",
)
TRAIN_LAYER_GRAD_NORM = MetricSpec(
    "train.layer.grad_norm",
    _G,
    Unit.DIMENSIONLESS,
    "L2 norm of one layer group's gradients as the optimizer receives them",
    labels=("layer_group",),
    availability="Updated every stats_every steps.",
)
TRAIN_LAYER_PARAM_NORM = MetricSpec(
    "train.layer.param_norm",
    _G,
    Unit.DIMENSIONLESS,
    "L2 norm of the parameters of one layer group",
    labels=("layer_group",),
    availability="Updated every stats_every steps.",
)
TRAIN_LAYER_UPDATE_RATIO = MetricSpec(
    "train.layer.update_ratio",
    _G,
    Unit.RATIO,
    "Update-to-parameter norm ratio of one layer group",
    labels=("layer_group",),
    availability="Needs an optimizer; updated every stats_every steps.",
)
TRAIN_LEARNING_RATE = MetricSpec(
    "train.learning_rate",
    _G,
    Unit.DIMENSIONLESS,
    "Learning rate of one optimizer parameter group",
    labels=("param_group",),
    availability="Needs an optimizer.",
)
TRAIN_NONFINITE_STEPS = MetricSpec(
    "train.nonfinite_steps",
    _C,
    Unit.STEPS,
    "Steps whose loss or gradient norm was NaN or infinite, by signal",
    labels=("signal",),
)
