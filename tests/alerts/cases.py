"""For every alert: input series that must make it fire (with the labels and text on-call will read) and
near-miss series that must not. Run through ``promtool test rules`` by test_rules.py."""

from __future__ import annotations

from dataclasses import dataclass

L = 'job="train",host="node-1",rank="3"'
RANK = {"job": "train", "host": "node-1", "rank": "3"}
GPU = {**RANK, "gpu": "2", "backend": "nvml"}


@dataclass(frozen=True)
class Firing:
    series: dict[str, str]
    eval_time: str
    labels: dict[str, str]
    summary: str
    description: str


@dataclass(frozen=True)
class Case:
    firing: list[Firing]
    quiet: dict[str, str]  # series that must not fire it
    quiet_eval_time: str
    also_quiet: tuple[dict[str, str], ...] = ()  # more near misses, judged at quiet_eval_time


def _gpu(metric: str, extra: str = "") -> str:
    return f'{metric}{{{L},gpu="2",backend="nvml"{extra}}}'


def _positions(
    seq: int, lagging_at: int, *, inflight: str, lagging: str | None = None, leading: str | None = None
) -> dict[str, str]:
    """Ranks 0-2 of default_pg:0 at sequence ``seq`` (values ``leading``) and waiting in it (``inflight``), rank 3
    at ``lagging_at`` (values ``lagging``)."""
    group = 'group="default_pg:0"'
    series = {
        f'trainhealth_comm_started_seq{{job="train",host="node-1",rank="{r}",{group}}}': leading or f"{seq}x10"
        for r in range(3)
    }
    series[f'trainhealth_comm_started_seq{{job="train",host="node-1",rank="3",{group}}}'] = (
        lagging or f"{lagging_at}x10"
    )
    series.update(
        {
            f'trainhealth_comm_inflight_duration_seconds{{job="train",host="node-1",rank="{r}",'
            f'op="all_reduce",{group}}}': inflight
            for r in range(3)
        }
    )
    return series


def _thresholds(values: str) -> dict[str, str]:
    return {
        f'trainhealth_comm_hang_threshold_seconds{{job="train",host="node-1",rank="{r}"}}': values for r in range(3)
    }


XID = "trainhealth_gpu_xid_errors_total"
CASES: dict[str, Case] = {
    "GpuXidCritical": Case(
        [
            Firing(
                {_gpu(XID, ',xid="79"'): "0x4 1x10"},
                "8m",
                {**GPU, "xid": "79"},
                "Critical XID 79 on GPU 2 on node-1",
                "GPU 2 on node-1 reported 1 XID 79 error(s) in 10 minutes. XID 79: GPU has fallen off the bus; "
                "action: reboot the machine, then contact vendor support.",
            ),
            # the exporter creates the series at the first XID, at 1: increase() alone would never see it
            Firing(
                {_gpu(XID, ',xid="79"'): "_x4 1x10"},
                "8m",
                {**GPU, "xid": "79"},
                "Critical XID 79 on GPU 2 on node-1",
                "GPU 2 on node-1 reported 1 XID 79 error(s) in 10 minutes. XID 79: GPU has fallen off the bus; "
                "action: reboot the machine, then contact vendor support.",
            ),
        ],
        {_gpu(XID, ',xid="13"'): "0x4 1x10"},
        "8m",
    ),
    "GpuXidWarning": Case(
        [
            Firing(
                {_gpu(XID, ',xid="13"'): "0x4 1x10"},
                "8m",
                {**GPU, "xid": "13"},
                "XID 13 on GPU 2 on node-1",
                "GPU 2 on node-1 reported 1 XID 13 error(s) in 10 minutes. XID 13: graphics engine exception; "
                "action: restart the application (usually an application bug).",
            )
        ],
        {_gpu(XID, ',xid="43"'): "0x4 1x10"},
        "8m",
    ),
    "GpuEccUncorrectable": Case(
        [
            Firing(
                {
                    _gpu(
                        "trainhealth_gpu_ecc_errors_total", ',error_type="uncorrected",counter_type="volatile"'
                    ): "0x4 2x10"
                },
                "8m",
                {**GPU, "error_type": "uncorrected", "counter_type": "volatile"},
                "Uncorrectable ECC error on GPU 2 on node-1",
                "GPU 2 on node-1 had 2 uncorrectable ECC error(s) in 10 minutes: its results are not trustworthy.",
            )
        ],
        {
            _gpu("trainhealth_gpu_ecc_errors_total", ',error_type="corrected",counter_type="volatile"'): "0x4 2x10",
            # a series that appears at 0 is not an error
            _gpu(
                "trainhealth_gpu_ecc_errors_total", ',error_type="uncorrected",counter_type="volatile",gpu_="x"'
            ): "_x4 0x10",
        },
        "8m",
    ),
    "GpuRowRemapFailure": Case(
        [
            Firing(
                {_gpu("trainhealth_gpu_row_remap_failure"): "0x4 1x10"},
                "8m",
                GPU,
                "Row remapping failed on GPU 2 on node-1",
                "GPU 2 on node-1 could not remap a failing memory row: the GPU needs service.",
            )
        ],
        {_gpu("trainhealth_gpu_row_remap_failure"): "0x15"},
        "8m",
    ),
    "GpuRowRemapPending": Case(
        [
            Firing(
                {_gpu("trainhealth_gpu_row_remap_pending"): "1x30"},
                "20m",
                GPU,
                "Row remap pending on GPU 2 on node-1",
                "GPU 2 on node-1 has a row remap waiting for the next GPU reset.",
            )
        ],
        {_gpu("trainhealth_gpu_row_remap_pending"): "1x10 0x20"},
        "20m",
    ),
    "GpuLost": Case(
        [
            Firing(
                {_gpu("trainhealth_gpu_up"): "1 1 0x10"},
                "6m",
                GPU,
                "GPU lost: GPU 2 on node-1",
                "GPU 2 on node-1 does not answer NVML (lost, fallen off the bus or needing a reset).",
            )
        ],
        {_gpu("trainhealth_gpu_up"): "1x10"},
        "6m",
    ),
    "GpuThermalThrottling": Case(
        [
            Firing(
                {_gpu("trainhealth_gpu_clocks_event_active", ',reason="hw_thermal_slowdown"'): "1x20"},
                "15m",
                {"job": "train", "host": "node-1", "gpu": "2", "backend": "nvml"},
                "Thermal throttling on GPU 2 on node-1",
                "GPU 2 on node-1 has held its clocks down for heat for 10 minutes: it is slower than its peers and "
                "drags every synchronous step.",
            )
        ],
        {_gpu("trainhealth_gpu_clocks_event_active", ',reason="gpu_idle"'): "1x20"},
        "15m",
    ),
    "GpuPowerThrottling": Case(
        [
            Firing(
                {_gpu("trainhealth_gpu_clocks_event_active", ',reason="sw_power_cap"'): "1x40"},
                "35m",
                {"job": "train", "host": "node-1", "gpu": "2", "backend": "nvml"},
                "Power capping on GPU 2 on node-1",
                "GPU 2 on node-1 has been power capped for 30 minutes.",
            )
        ],
        {_gpu("trainhealth_gpu_clocks_event_active", ',reason="sw_power_cap"'): "1x20 0x20"},
        "35m",
    ),
    "GpuPcieReplays": Case(
        [
            Firing(
                {_gpu("trainhealth_gpu_pcie_replays_total"): "0+5x30"},
                "25m",
                GPU,
                "PCIe replays on GPU 2 on node-1",
                "GPU 2 on node-1 retransmits 5.0 PCIe packets a minute: a marginal link or riser.",
            )
        ],
        {_gpu("trainhealth_gpu_pcie_replays_total"): "0+0.5x30"},
        "25m",
    ),
    "GpuNvlinkErrors": Case(
        [
            Firing(
                {_gpu("trainhealth_gpu_nvlink_errors_total", ',link="4",error_type="crc_flit"'): "0+1x30"},
                "20m",
                {"job": "train", "host": "node-1", "gpu": "2", "link": "4"},
                "NVLink errors on GPU 2 on node-1 link 4",
                "GPU 2 on node-1 link 4 had 10 errors in 10 minutes.",
            )
        ],
        {_gpu("trainhealth_gpu_nvlink_errors_total", ',link="4",error_type="crc_flit"'): "0x30"},
        "20m",
    ),
    "GpuSelftestFailed": Case(
        [
            Firing(
                {'trainhealth_selftest_passed{job="train",host="node-1",device="cuda:1",check="gemm"}': "1 1 0x5"},
                "3m",
                {"job": "train", "host": "node-1", "device": "cuda:1", "check": "gemm"},
                "Self-test gemm failed on cuda:1 of node-1",
                "cuda:1 on node-1 got the gemm check wrong against the golden reference: silent data corruption.",
            )
        ],
        {'trainhealth_selftest_passed{job="train",host="node-1",device="cuda:1",check="gemm"}': "1x5"},
        "3m",
    ),
    "LossSpike": Case(
        [
            Firing(
                {f'trainhealth_anomalies_total{{{L},detector="zscore",signal="loss"}}': "0x5 1x5"},
                "7m",
                {"job": "train"},
                "Loss spike in train",
                "The loss of train spiked; trainhealth follows whether it recovers (LossSpikeNotRecovered).",
            ),
            Firing(
                {f'trainhealth_anomalies_total{{{L},detector="zscore",signal="loss"}}': "_x5 1x5"},
                "7m",
                {"job": "train"},
                "Loss spike in train",
                "The loss of train spiked; trainhealth follows whether it recovers (LossSpikeNotRecovered).",
            ),
        ],
        {f'trainhealth_anomalies_total{{{L},detector="nonfinite",signal="loss"}}': "0x5 1x5"},
        "7m",
    ),
    "LossSpikeNotRecovered": Case(
        [
            Firing(
                {
                    f"trainhealth_train_loss_spike_unrecovered{{{L}}}": "0x3 1x5",
                    f"trainhealth_train_loss_spike_rewind_step{{{L}}}": "250x8",
                },
                "5m",
                {"job": "train"},
                "Loss spike in train has not recovered",
                "The loss of train is still high 50 steps after the spike. Rewind to the checkpoint of step 250, "
                "the last one before the spike.",
            ),
            Firing(
                {f"trainhealth_train_loss_spike_unrecovered{{{L}}}": "0x3 1x5"},
                "5m",
                {"job": "train"},
                "Loss spike in train has not recovered",
                "The loss of train is still high 50 steps after the spike. No checkpoint before the spike was "
                "reported (Monitor.checkpoint_saved).",
            ),
        ],
        {
            f"trainhealth_train_loss_spike_unrecovered{{{L}}}": "0x8",
            f"trainhealth_train_loss_spike_rewind_step{{{L}}}": "250x8",
        },
        "5m",
    ),
    "NonFiniteTraining": Case(
        [
            Firing(
                {f'trainhealth_train_nonfinite_steps_total{{{L},signal="loss"}}': "0x3 1x5"},
                "5m",
                {**RANK, "signal": "loss"},
                "Non-finite loss on rank 3 on node-1",
                "loss was NaN or infinite on 1 step(s) of rank 3 on node-1; the rank whose "
                "trainhealth_train_nonfinite_origin_first_step has where=local produced it (the lowest step if "
                "several); ranks with where=received got it through the gradient all-reduce.",
            ),
            Firing(
                {f'trainhealth_train_nonfinite_steps_total{{{L},signal="loss"}}': "_x3 2x5"},
                "5m",
                {**RANK, "signal": "loss"},
                "Non-finite loss on rank 3 on node-1",
                "loss was NaN or infinite on 2 step(s) of rank 3 on node-1; the rank whose "
                "trainhealth_train_nonfinite_origin_first_step has where=local produced it (the lowest step if "
                "several); ranks with where=received got it through the gradient all-reduce.",
            ),
        ],
        {f'trainhealth_train_nonfinite_steps_total{{{L},signal="loss"}}': "0x10"},
        "5m",
    ),
    "GradNormSpike": Case(
        [
            Firing(
                {f'trainhealth_anomalies_total{{{L},detector="spike",signal="grad_norm"}}': "0x5 1x5"},
                "7m",
                {"job": "train"},
                "Gradient-norm spike in train",
                "The gradient norm of train spiked; loss spikes often follow.",
            )
        ],
        {f'trainhealth_anomalies_total{{{L},detector="spike",signal="loss_scale"}}': "0x5 1x5"},
        "7m",
    ),
    "IrregularSteps": Case(
        [
            Firing(
                {f'trainhealth_train_irregularity_ratio{{{L},signal="step_time"}}': "0.2x20"},
                "15m",
                RANK,
                "δ-irregular steps on rank 3 on node-1",
                "20% of the last 100 steps of rank 3 on node-1 took 1.5× the recent average.",
            )
        ],
        {f'trainhealth_train_irregularity_ratio{{{L},signal="step_time"}}': "0.02x20"},
        "15m",
    ),
    "ThroughputDrop": Case(
        [
            Firing(
                {f"trainhealth_train_throughput_tokens_per_second{{{L}}}": "1000x80 500x30"},
                "100m",
                {"job": "train"},
                "Throughput of train dropped",
                "train processes 500 tokens/s, under 70% of its last hour.",
            )
        ],
        # a drop in the job's first hour: the baseline hour is not full yet
        {f"trainhealth_train_throughput_tokens_per_second{{{L}}}": "1000x10 500x20"},
        "25m",
        also_quiet=({f"trainhealth_train_throughput_tokens_per_second{{{L}}}": "1000x110"},),
    ),
    "ThroughputDegraded": Case(
        [
            Firing(
                {f"trainhealth_train_throughput_tokens_per_second{{{L}}}": "1000x360 800x240"},
                "560m",
                {"job": "train"},
                "Throughput of train degraded for an hour",
                "train has run at 800 tokens/s for an hour, under 90% of the six hours before.",
            )
        ],
        {f"trainhealth_train_throughput_tokens_per_second{{{L}}}": "1000x560"},
        "560m",
    ),
    "TrainingStalled": Case(
        [
            Firing(
                {
                    f"trainhealth_train_last_step_timestamp_seconds{{{L}}}": "0+60x10 600x30",
                    f"trainhealth_train_last_step_duration_seconds{{{L}}}": "1x40",
                },
                "20m",
                {"job": "train"},
                "train has made no step progress",
                "No rank of train has finished a step for 10m 0s.",
            )
        ],
        {
            f"trainhealth_train_last_step_timestamp_seconds{{{L}}}": "0+60x40",
            f"trainhealth_train_last_step_duration_seconds{{{L}}}": "1x40",
        },
        "20m",
    ),
    "HungCollective": Case(
        [
            Firing(
                {**_positions(41, 40, inflight="30x10"), **_thresholds("12x10")},
                "5m",
                {**RANK, "group": "default_pg:0"},
                "Collective in default_pg:0 waits for rank 3 on node-1",
                "Ranks of train wait in a default_pg:0 collective that rank 3 on node-1 never entered (it is at "
                "sequence 40); its stack: trainhealth_comm_stuck_duration_seconds and the stacks/ files beside its "
                "trace.",
            ),
            # ranks of an older version export no threshold: a minute
            Firing(
                _positions(41, 40, inflight="90x10"),
                "5m",
                {**RANK, "group": "default_pg:0"},
                "Collective in default_pg:0 waits for rank 3 on node-1",
                "Ranks of train wait in a default_pg:0 collective that rank 3 on node-1 never entered (it is at "
                "sequence 40); its stack: trainhealth_comm_stuck_duration_seconds and the stacks/ files beside its "
                "trace.",
            ),
            # rank 3's pause is past its bound (stuck in it): the pause holds no longer
            Firing(
                {
                    **_positions(41, 40, inflight="30x10"),
                    **_thresholds("12x10"),
                    f'trainhealth_comm_paused{{{L},reason="checkpoint"}}': "1x10",
                    f'trainhealth_comm_stuck_duration_seconds{{{L},state="in_pause",op="checkpoint",'
                    f'where="train.py:save:88"}}': "2000x10",
                },
                "5m",
                {**RANK, "group": "default_pg:0"},
                "Collective in default_pg:0 waits for rank 3 on node-1",
                "Ranks of train wait in a default_pg:0 collective that rank 3 on node-1 never entered (it is at "
                "sequence 40); its stack: trainhealth_comm_stuck_duration_seconds and the stacks/ files beside its "
                "trace.",
            ),
        ],
        # the same wait while rank 0 is in an announced pause (a checkpoint save)
        {
            **_positions(41, 40, inflight="30x10"),
            **_thresholds("12x10"),
            'trainhealth_comm_paused{job="train",host="node-1",rank="0",reason="checkpoint"}': "1x10",
        },
        "5m",
        also_quiet=(
            {**_positions(41, 40, inflight="8x10"), **_thresholds("2x10")},  # under the floor (10 s)
            {**_positions(41, 40, inflight="30x10"), **_thresholds("40x10")},  # a job whose steps take 13 s
            {**_positions(41, 40, inflight="30x10")},  # no threshold exported: a minute
        ),
    ),
    "RankMissing": Case(
        [
            Firing(
                {**_positions(20, 19, inflight="30x10", lagging="19 19 19 stale"), **_thresholds("12x10")},
                "6m",
                {**RANK, "group": "default_pg:0"},
                "Rank 3 of train is gone while default_pg:0 waits for it",
                "Rank 3 on node-1 stopped reporting (last at sequence 19 of default_pg:0) while its peers wait in the "
                "group's collective: a dead process or a lost host.",
            )
        ],
        # every rank still reports
        {**_positions(20, 19, inflight="30x10"), **_thresholds("12x10")},
        "6m",
        also_quiet=(
            # the job ended: every rank gone, nobody waits
            {**_positions(20, 20, inflight="0 0 0 stale", lagging="20 20 20 stale", leading="20 20 20 stale")},
            # a rank gone while its peers compute (an elastic job shrinking)
            {**_positions(20, 19, inflight="0x10", lagging="19 19 19 stale"), **_thresholds("12x10")},
        ),
    ),
    "PauseOverrun": Case(
        [
            Firing(
                {
                    f'trainhealth_comm_stuck_duration_seconds{{{L},state="in_pause",op="checkpoint",'
                    f'where="train.py:save:88"}}': "1900+60x10"
                },
                "5m",
                {**RANK, "state": "in_pause", "op": "checkpoint", "where": "train.py:save:88"},
                "Rank 3 of train is stuck in a pause (checkpoint)",
                "Rank 3 on node-1 has been in its announced pause (checkpoint) for 36m 40s, past the pause's bound; "
                "its peers wait for it. Where: train.py:save:88; the stacks/ file beside its trace says since when.",
            )
        ],
        # stuck, but in a collective: HungCollective's case, not a pause
        {
            f'trainhealth_comm_stuck_duration_seconds{{{L},state="in_collective",op="all_reduce",'
            f'group="default_pg:0",seq="41",where="train.py:step:12"}}': "30+60x10"
        },
        "5m",
    ),
    "HangWatcherStopped": Case(
        [
            Firing(
                {f"trainhealth_comm_watch_timestamp_seconds{{{L}}}": "0+60x3 180x10"},
                "10m",
                RANK,
                "Hang detection is blind on rank 3 of train",
                "The hang watcher of rank 3 on node-1 last looked 7m 0s ago while the rank still answers scrapes: "
                "trainhealth's own thread stopped, so HungCollective and RankMissing cannot fire for this rank. This "
                "is trainhealth's failure, not the job's: see trainhealth_exporter_errors_total{source=~\"comm_.*\"} "
                "and the rank's log.",
            )
        ],
        # a watcher that looks every minute (the series is as fresh as the scrapes)
        {f"trainhealth_comm_watch_timestamp_seconds{{{L}}}": "0+60x20"},
        "10m",
        also_quiet=(
            # a rank gone: its series went stale, RankMissing's case
            {f"trainhealth_comm_watch_timestamp_seconds{{{L}}}": "0+60x3 stale"},
        ),
    ),
    "StragglerSuspect": Case(
        [
            Firing(
                {
                    'trainhealth_suspect_score{job="train",rank="5",host="node-2",gpu="1",kind="gpu",'
                    'component="gpu:rank-5"}': "0.9x10"
                },
                "8m",
                {"job": "train", "rank": "5", "host": "node-2", "gpu": "1", "kind": "gpu", "component": "gpu:rank-5"},
                "gpu suspect: gpu:rank-5",
                "The analyzer blames gpu gpu:rank-5 (rank 5, host node-2, GPU 1) for slow iterations of train, "
                "score 0.90.",
            )
        ],
        {
            'trainhealth_suspect_score{job="train",rank="5",host="node-2",gpu="1",kind="gpu",component="gpu:rank-5"}': "0.3x10"
        },
        "8m",
    ),
    "SdcSuspect": Case(
        [
            Firing(
                {f'trainhealth_sdc_suspect{{{L},check="fingerprint"}}': "0x3 1 0x5"},
                "6m",
                {**RANK, "check": "fingerprint"},
                "Silent data corruption suspected on rank 3 on node-1",
                "rank 3 on node-1 computed different numbers from its data-parallel peers (fingerprint check).",
            )
        ],
        {f'trainhealth_sdc_suspect{{{L},check="fingerprint"}}': "0x10"},
        "6m",
    ),
    "TrainhealthTargetDown": Case(
        [
            Firing(
                {'up{job="trainhealth-ranks",instance="10.0.0.1:9450"}': "0x10"},
                "6m",
                {"job": "trainhealth-ranks", "instance": "10.0.0.1:9450"},
                "Scrape target 10.0.0.1:9450 is down",
                "Prometheus cannot scrape 10.0.0.1:9450 (trainhealth-ranks): its metrics and alerts are blind.",
            )
        ],
        {'up{job="trainhealth-ranks",instance="10.0.0.1:9450"}': "1x10"},
        "6m",
    ),
    "TrainhealthMetricsAbsent": Case(
        [
            Firing(
                {'up{job="trainhealth-ranks",instance="10.0.0.1:9450"}': "1x15"},
                "12m",
                {"job": "trainhealth-ranks", "instance": "10.0.0.1:9450"},
                "10.0.0.1:9450 answers without trainhealth metrics",
                "10.0.0.1:9450 is up but exports none of trainhealth's identity metrics: a wrong port, or something "
                "else is listening there.",
            )
        ],
        {
            'up{job="trainhealth-ranks",instance="10.0.0.1:9450"}': "1x15",
            f'trainhealth_rank_info{{{L},instance="10.0.0.1:9450",local_rank="3",world_size="8"}}': "1x15",
        },
        "12m",
    ),
    "GpuTelemetryDown": Case(
        [
            Firing(
                {f'trainhealth_exporter_gpu_backend_up{{{L},backend="nvml"}}': "0x10"},
                "6m",
                {**RANK, "backend": "nvml"},
                "GPU telemetry down on node-1",
                "The nvml backend on node-1 is not sampling: GPU alerts there are blind.",
            )
        ],
        {f'trainhealth_exporter_gpu_backend_up{{{L},backend="nvml"}}': "1x10"},
        "6m",
    ),
    "AnalyzerStale": Case(
        [
            Firing(
                {f"trainhealth_analysis_last_run_timestamp_seconds{{{L}}}": "0x30"},
                "20m",
                RANK,
                "The trainhealth analyzer has not localized for 10 minutes",
                "trainhealth analyze for train last finished 20m 0s ago: suspects are stale.",
            )
        ],
        {f"trainhealth_analysis_last_run_timestamp_seconds{{{L}}}": "0+60x30"},
        "20m",
    ),
}
