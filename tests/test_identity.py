"""Identity from torchrun, Slurm and Kubernetes variables, with explicit overrides."""

from __future__ import annotations

import socket

import pytest

from trainhealth._internal.config import ConfigError, Settings
from trainhealth._internal.identity import Identity


def test_torchrun():
    env = {"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "16", "TORCHELASTIC_RUN_ID": "pretrain", "NODE_NAME": "n2"}
    assert Identity.from_env(env) == Identity("pretrain", "n2", 5, 1, 16)


def test_torchrun_standalone_run_id_none_is_not_a_job_name():
    assert Identity.from_env({"TORCHELASTIC_RUN_ID": "none"}).job == "trainhealth"


def test_slurm():
    env = {
        "SLURM_PROCID": "9",
        "SLURM_LOCALID": "1",
        "SLURM_NTASKS": "32",
        "SLURM_JOB_ID": "41234",
        "SLURMD_NODENAME": "gpu017",
    }
    assert Identity.from_env(env) == Identity("41234", "gpu017", 9, 1, 32)


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
    settings = Settings.resolve(env={}, job="override", rank=2, host="h", gpu_uuid="GPU-1234")
    ident = Identity.from_env(env, settings)
    assert (ident.job, ident.rank, ident.world_size, ident.host, ident.gpu_uuid) == ("override", 2, 16, "h", "GPU-1234")
    assert ident.resource_attributes["hw.id"] == "GPU-1234"


@pytest.mark.parametrize(
    "env, setting",
    [({"RANK": "two"}, "rank"), ({"RANK": "4", "WORLD_SIZE": "4"}, "rank"), ({"WORLD_SIZE": "x"}, "world_size")],
)
def test_bad_environment_is_a_config_error(env, setting):
    with pytest.raises(ConfigError) as error:
        Identity.from_env(env)
    assert error.value.setting == setting


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
