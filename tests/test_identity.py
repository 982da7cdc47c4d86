"""Identity from torchrun, Slurm and Kubernetes variables, with explicit overrides."""

from __future__ import annotations

import socket
from types import SimpleNamespace

import pytest

from trainhealth._internal.config import ConfigError, Settings
from trainhealth._internal.identity import NODE_JOB, Identity, RunIdentity, agree_on_run_id


def test_torchrun():
    env = {"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "16", "TORCHELASTIC_RUN_ID": "pretrain", "NODE_NAME": "n2"}
    assert Identity.from_env(env) == Identity("pretrain", "n2", 5, 1, 16)


def test_torchrun_default_run_id_none_is_no_run_id():
    """Every torchrun without --rdzv-id exports TORCHELASTIC_RUN_ID=none: never a job label of its own."""
    env = {"TORCHELASTIC_RUN_ID": "none", "RANK": "1", "WORLD_SIZE": "2", "TRAINHEALTH_JOB": "llm-7b"}
    ident = Identity.from_env(env)
    assert ident.pending and ident.job == "" and ident.job_name == "llm-7b"
    assert Identity.node(env).job == NODE_JOB  # a node exporter or the analyzer: a service, not a run


def test_slurm():
    env = {
        "SLURM_PROCID": "9",
        "SLURM_LOCALID": "1",
        "SLURM_NTASKS": "32",
        "SLURM_JOB_ID": "41234",
        "SLURM_JOB_NAME": "llm-7b",
        "SLURMD_NODENAME": "gpu017",
    }
    assert Identity.from_env(env) == Identity("41234", "gpu017", 9, 1, 32, job_name="llm-7b")
    assert Identity.from_env({**env, "SLURM_RESTART_COUNT": "2"}).job == "41234/2"  # requeued: another run


def test_jobset_and_pytorchjob_names_with_their_restart():
    """The variables a pod maps from its labels and annotations with the downward API (docs/configuration.md)."""
    pod = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "POD_NAMESPACE": "ml", "RANK": "0", "WORLD_SIZE": "8"}
    jobset = {**pod, "JOBSET_NAME": "llm-7b", "JOBSET_RESTART_ATTEMPT": "0"}
    first, restarted = Identity.from_env(jobset), Identity.from_env({**jobset, "JOBSET_RESTART_ATTEMPT": "1"})
    assert (first.job, restarted.job, first.job_name) == ("ml/llm-7b/0", "ml/llm-7b/1", "llm-7b")
    assert Identity.from_env({**jobset, "POD_NAMESPACE": "research"}).job == "research/llm-7b/0"
    pytorchjob = Identity.from_env({**pod, "PYTORCHJOB_NAME": "llm-7b"})
    assert (pytorchjob.job, pytorchjob.job_name) == ("ml/llm-7b", "llm-7b")
    # torchrun inside (an elastic PyTorchJob: PET_RDZV_ID becomes TORCHELASTIC_RUN_ID) comes first
    assert Identity.from_env({**jobset, "TORCHELASTIC_RUN_ID": "rdzv-9"}).job == "rdzv-9"


def test_kubernetes_pod_and_node():
    env = {
        "KUBERNETES_SERVICE_HOST": "10.0.0.1",
        "HOSTNAME": "trainer-worker-3",
        "POD_NAMESPACE": "ml",
        "NODE_NAME": "gpu-node-7",
        "RANK": "3",
        "WORLD_SIZE": "4",
    }
    ident = Identity.from_env(env)
    assert (ident.pod, ident.namespace, ident.host) == ("trainer-worker-3", "ml", "gpu-node-7")
    assert ident.info_labels["pod"] == "trainer-worker-3"
    assert Identity.from_env({**env, "POD_NAME": "explicit-pod"}).pod == "explicit-pod"


def test_outside_kubernetes_hostname_is_not_a_pod():
    ident = Identity.from_env({"HOSTNAME": "laptop"})
    assert ident.pod == ""
    assert ident.host == socket.gethostname()


def test_explicit_settings_win():
    env = {"RANK": "5", "WORLD_SIZE": "16", "TORCHELASTIC_RUN_ID": "pretrain"}
    settings = Settings.resolve(env={}, run_id="run-0412", job="llm-7b", rank=2, host="h", gpu_uuid="GPU-1234")
    ident = Identity.from_env(env, settings)
    assert (ident.job, ident.rank, ident.world_size, ident.host, ident.gpu_uuid) == ("run-0412", 2, 16, "h", "GPU-1234")
    assert ident.resource_attributes["hw.id"] == "GPU-1234"
    assert ident.resource_attributes["trainhealth.job_name"] == "llm-7b"


def test_the_job_setting_is_the_logical_name_never_the_job_label():
    settings = Settings.resolve(env={"TRAINHEALTH_JOB": "llm-7b"})
    ident = Identity.from_env({"TORCHELASTIC_RUN_ID": "pretrain"}, settings)
    assert (ident.job, ident.job_name, ident.info_labels["job_name"]) == ("pretrain", "llm-7b", "llm-7b")
    assert "job_name" not in ident.labels  # on trainhealth_rank_info only


@pytest.mark.parametrize("setting", ["job", "run_id"])
def test_a_blank_job_or_run_id_is_a_config_error(setting):
    with pytest.raises(ConfigError) as error:
        Settings.resolve(env={}, **{setting: "  "})
    assert error.value.setting == setting


@pytest.mark.parametrize(
    "env, setting",
    [({"RANK": "two"}, "rank"), ({"RANK": "4", "WORLD_SIZE": "4"}, "rank"), ({"WORLD_SIZE": "x"}, "world_size")],
)
def test_bad_environment_is_a_config_error(env, setting):
    with pytest.raises(ConfigError) as error:
        Identity.from_env(env)
    assert error.value.setting == setting


def test_two_single_process_runs_of_one_name_get_two_job_labels():
    env = {"TRAINHEALTH_JOB": "llm-7b"}
    first, second = (RunIdentity(Identity.from_env(env)).current() for _ in range(2))
    assert first is not None and second is not None
    assert first.job != second.job and first.job_name == second.job_name == "llm-7b"


def test_a_rank_without_torch_distributed_waits_then_runs_on_its_own():
    run = RunIdentity(Identity.from_env({"TORCHELASTIC_RUN_ID": "none", "RANK": "1", "WORLD_SIZE": "2"}))
    assert run.current() is None and run.identity.pending  # torch.distributed may come: nothing exported yet
    fixed = run.current(final=True)  # the loop stepped without it
    assert fixed is not None and len(fixed.job) == 12 and run.current() == fixed


class _Store:
    """A store without compare-and-set (a custom one), over a real torch HashStore."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def set(self, key, value):
        self.inner.set(key, value)

    def get(self, key):
        return self.inner.get(key)

    def wait(self, keys, timeout):
        self.inner.wait(keys, timeout)


def _dist(store, rank: int) -> SimpleNamespace:
    return SimpleNamespace(distributed_c10d=SimpleNamespace(_get_default_store=lambda: store), get_rank=lambda: rank)


def test_ranks_agree_through_any_store():
    import threading

    import torch.distributed as dist

    shared = dist.HashStore()
    assert agree_on_run_id(_dist(shared, 1)) == agree_on_run_id(_dist(shared, 0))  # compare-and-set: first wins
    plain, got = _Store(dist.HashStore()), {}
    waiting = threading.Thread(target=lambda: got.update(rank1=agree_on_run_id(_dist(plain, 1), timeout_s=30)))
    waiting.start()  # rank 1 asks first and waits for rank 0's id
    got["rank0"] = agree_on_run_id(_dist(plain, 0))
    waiting.join(30)
    assert got["rank0"] == got["rank1"] and len(got["rank0"]) == 12


def test_a_failing_store_is_logged_counted_and_never_raised(monkeypatch):
    import torch.distributed as dist

    class Broken:
        def compare_set(self, *args):
            raise ConnectionResetError("store gone")

    errors = []
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist.distributed_c10d, "_get_default_store", lambda: Broken())
    run = RunIdentity(Identity("", "h", 0, 0, 2), on_error=errors.append)
    fixed = run.current()
    assert fixed is not None and len(fixed.job) == 12 and [type(e) for e in errors] == [ConnectionResetError]


def test_labels_are_the_bounded_identity_only():
    ident = Identity("j", "h", 3, 0, 8, gpu_uuid="GPU-x", pod="p", namespace="n")
    assert ident.labels == {"job": "j", "host": "h", "rank": "3"}


def _report_identity(rank: int, world: int, port: int, out: str) -> None:
    import json
    import os
    from datetime import timedelta
    from pathlib import Path

    import torch.distributed as dist

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS"):
        os.environ.pop(name, None)  # as torch.multiprocessing.spawn starts a rank: only torch.distributed knows it
    before = Identity.from_env({})
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=timedelta(seconds=60)
    )
    after = Identity.from_env({})
    Path(out, f"rank-{rank}.json").write_text(
        json.dumps(
            {
                "before": [before.rank, before.world_size],
                "after": [after.rank, after.world_size],
                "label": after.labels["rank"],
                "explicit": Identity.from_env({"RANK": "0", "WORLD_SIZE": "2"}).rank,
            }
        )
    )
    dist.destroy_process_group()


def test_rank_from_torch_distributed_when_no_variable_gives_it(tmp_path):
    import json

    from tests.distributed import run_ranks

    run_ranks(_report_identity, 2, str(tmp_path), timeout_s=120)  # no steps
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"rank-{rank}.json").read_text())
        assert seen["before"] == [0, 1]  # not initialised yet: the defaults
        assert seen["after"] == [rank, 2] and seen["label"] == str(rank)
        assert seen["explicit"] == 0  # a launcher's variable still wins


def test_import_trainhealth_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, trainhealth._internal.identity; trainhealth._internal.identity.Identity.from_env({}); print('torch' in sys.modules)"
    assert (
        subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.strip()
        == "False"
    )


def _run_of_llm(rank: int, world: int, port: int, out: str, tag: str) -> None:
    """A rank as torchrun starts it without --rdzv-id (TORCHELASTIC_RUN_ID=none), of a job named llm-7b, whose
    Monitor starts before torch.distributed: it exports nothing until the ranks agreed on their job label."""
    import json
    import os
    from pathlib import Path

    import torch.distributed as dist

    from tests.distributed import init_rank
    from tests.helpers import scrape
    from trainhealth import Monitor

    os.environ.update(TORCHELASTIC_RUN_ID="none", TRAINHEALTH_JOB="llm-7b", RANK=str(rank), WORLD_SIZE=str(world))
    monitor = Monitor(prometheus_addr="127.0.0.1", prometheus_port=0, otel=False, gpu_backend="off")
    before = scrape(monitor.metrics_url).labels_of("trainhealth_rank_info")
    init_rank(rank, world, port)
    (info,) = scrape(monitor.metrics_url).labels_of("trainhealth_rank_info")  # the scrape fixes the label
    monitor.step(loss=1.0)
    Path(out, f"{tag}-{rank}.json").write_text(
        json.dumps({"before": before, "info": info, "identity": monitor.identity.job})
    )
    monitor.close()
    dist.destroy_process_group()


def test_two_runs_of_one_name_started_at_once_get_two_labels_and_each_run_agrees(tmp_path):
    import json

    from tests.distributed import join, start_ranks

    runs = [start_ranks(_run_of_llm, 2, str(tmp_path), tag) for tag in ("first", "second")]  # at once
    for context in runs:
        join(context, timeout_s=180)
    seen = {
        tag: [json.loads((tmp_path / f"{tag}-{rank}.json").read_text()) for rank in (0, 1)]
        for tag in ("first", "second")
    }
    labels = {}
    for tag, ranks in seen.items():
        assert all(rank["before"] == [] for rank in ranks)  # nothing exported with a provisional label
        jobs = {rank["info"]["job"] for rank in ranks} | {rank["identity"] for rank in ranks}
        assert len(jobs) == 1, jobs  # the run's ranks agree, through its own store
        assert [rank["info"]["job_name"] for rank in ranks] == ["llm-7b", "llm-7b"]
        labels[tag] = jobs.pop()
    assert labels["first"] != labels["second"] and all(len(label) == 12 for label in labels.values())
