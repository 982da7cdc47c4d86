"""Localization metrics, from ``trainhealth analyze``: suspects, per-rank compute and wait, verdicts.

What the analyzer says about a job carries that job's own label (``job`` is the metric's first label: one
analyzer judges every job of its Prometheus, each on its own); what it says about itself (when it last ran, how
long it took, whether it is stale) carries its own identity."""

from __future__ import annotations

from trainhealth._internal.catalog.spec import _G, MetricSpec, Unit

SUSPECT_SCORE = MetricSpec(
    "suspect.score",
    _G,
    Unit.DIMENSIONLESS,
    "Localization score of a suspect component, 0 to 1 (0.5 and more blames it); rank, host and gpu name "
    "the suspect (empty for a switch), kind is gpu, nic, host or switch",
    labels=("job", "rank", "host", "gpu", "kind", "component"),
    identity=(),
    availability="From trainhealth analyze, while it names suspects.",
)
SUSPECT_SLOWDOWN = MetricSpec(
    "suspect.slowdown",
    _G,
    Unit.DIMENSIONLESS,
    "How many times as long the suspect computes as its peers (a GPU), or its transfers take as usual (a link), "
    "where the localizer measured it; labels as trainhealth_suspect_score",
    labels=("job", "rank", "host", "gpu", "kind", "component"),
    identity=(),
    availability="From trainhealth analyze, while it names suspects measured from step markers and arrivals.",
)
SUSPECT_SINCE_STEP = MetricSpec(
    "suspect.since_step",
    _G,
    Unit.STEPS,
    "The training step at which the suspect's slowness began (the change point); absent when it was slow "
    "throughout the window",
    labels=("job", "rank", "host", "gpu", "kind", "component"),
    identity=(),
    availability="From trainhealth analyze, while it names suspects with an onset.",
)
ANALYSIS_RANK_COMPUTE = MetricSpec(
    "analysis.rank.compute",
    _G,
    Unit.SECONDS,
    "Median seconds per step each rank of the analysed window spent computing (step time less the time blocked "
    "in collectives); the straggler computes longest",
    labels=("job", "rank"),
    identity=(),
    availability="From trainhealth analyze over trace files with step markers or inferred iterations.",
)
ANALYSIS_RANK_WAIT = MetricSpec(
    "analysis.rank.wait",
    _G,
    Unit.SECONDS,
    "Median seconds per step each rank of the analysed window waited in collectives for later arrivals; the "
    "straggler waits least",
    labels=("job", "rank"),
    identity=(),
    availability="From trainhealth analyze over trace files with step markers or inferred iterations.",
)
ANALYSIS_VERDICT = MetricSpec(
    "analysis.verdict",
    _G,
    Unit.DIMENSIONLESS,
    "1 for the verdict of the last localization of each job (healthy, compute, communication, imbalance, "
    "insufficient_data, hang), 0 for the others; job is the job judged",
    labels=("job", "verdict"),
    identity=(),
    availability="From trainhealth analyze.",
)
ANALYSIS_IRREGULAR_STEPS = MetricSpec(
    "analysis.irregular_steps",
    _G,
    Unit.STEPS,
    "Steps of the analysed window that took delta times the window's median step time",
    labels=("job",),
    identity=(),
    availability="From trainhealth analyze.",
)
ANALYSIS_DETECTABLE_SLOWDOWN = MetricSpec(
    "analysis.detectable_slowdown",
    _G,
    Unit.DIMENSIONLESS,
    "The detection power of the last localization: the smallest slowdown of one rank, over its last 10 steps "
    "or all window, that it blamed in at least 95% of injections at the window's own noise; a healthy verdict "
    "needs it at most 1.5",
    labels=("job",),
    identity=(),
    availability="From trainhealth analyze, when the window was long enough to measure its noise.",
)
ANALYSIS_JOB_SLOWDOWN = MetricSpec(
    "analysis.job_slowdown",
    _G,
    Unit.DIMENSIONLESS,
    "How many times slower (nearly) every rank of the job was at once in the last localization's window, a "
    "slowdown no single device explains (storage, network, another job on the hosts); 1 when there was none",
    labels=("job",),
    identity=(),
    availability="From trainhealth analyze, when the window had enough steps to judge.",
)
ANALYSIS_UNCOVERED_RANKS = MetricSpec(
    "analysis.uncovered_ranks",
    _G,
    Unit.DIMENSIONLESS,
    "Ranks the last localization could not measure in most of its window (no records, or no step markers "
    "where other ranks have them); while above 0 the verdict is never healthy",
    labels=("job",),
    identity=(),
    availability="From trainhealth analyze.",
)
ANALYSIS_EVENTS = MetricSpec(
    "analysis.events",
    _G,
    Unit.DIMENSIONLESS,
    "Slow stretches in the last localization's window that blame no device: they came and went, or healthy "
    "members of the run show the same",
    labels=("job",),
    identity=(),
    availability="From trainhealth analyze.",
)
ANALYSIS_RANKS = MetricSpec(
    "analysis.ranks",
    _G,
    Unit.DIMENSIONLESS,
    "Ranks seen in the analysed window",
    labels=("job",),
    identity=(),
    availability="From trainhealth analyze.",
)
ANALYSIS_DURATION = MetricSpec(
    "analysis.duration",
    _G,
    Unit.SECONDS,
    "Wall time of the last localization, reading its input included",
    availability="From trainhealth analyze.",
)
ANALYSIS_LAST_RUN_TIMESTAMP = MetricSpec(
    "analysis.last_run.timestamp",
    _G,
    Unit.SECONDS,
    "Unix time the last localization finished; an old value means the analyzer is stuck or has no input",
    availability="From trainhealth analyze.",
)
ANALYSIS_STALE = MetricSpec(
    "analysis.stale",
    _G,
    Unit.DIMENSIONLESS,
    "1 while the last run of the analyzer failed (its source gave no usable answer) and the verdict and suspects "
    "served are those of an earlier run, 0 after a run that succeeded; how old they are is "
    "time() - trainhealth_analysis_last_run_timestamp_seconds",
    availability="From trainhealth analyze, after its first run.",
)
ANALYSIS_CONSECUTIVE_FAILURES = MetricSpec(
    "analysis.consecutive_failures",
    _G,
    Unit.DIMENSIONLESS,
    "Runs of the analyzer that failed in a row since its last good one (each is also counted in "
    'trainhealth_exporter_errors_total{source="analyze"}); 0 after a run that succeeded',
    availability="From trainhealth analyze, after its first run.",
)
