"""The ``hf_save`` control: a real Hugging Face ``Trainer`` on gloo, whose first checkpoint save on rank 0 is slow.

Every rank runs ``transformers.Trainer`` with trainhealth's callback attached the way
docs/integrations.md tells users to (``callbacks=[TrainhealthCallback(**settings)]``), on a
tiny GPT-2 wrapped by the Trainer in DistributedDataParallel over the process group this
module opens (gloo, from torchrun's variables). ``save_steps`` is the case's onset step, so
the Trainer saves once mid-run (and once at the end). Rank 0 writes the checkpoints; the
first one takes ``pause_s`` longer: the lab wraps the model's ``save_pretrained`` from
outside (the call the Trainer makes in ``_save``), as a save to a slow shared filesystem
would. The other ranks skip writing and go on into the next step's bucket all-reduce,
where they wait for rank 0: a save, not a hang, however the callback announces it.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from typing import Any

from trainhealth_lab.hangs.workload import load_batch, monitor_settings, onset

__all__ = ["main"]


def _slow_first_save(model: Any, out: Path, rank: int, seconds: float) -> None:
    """The first ``save_pretrained`` of ``model`` takes ``seconds`` longer (a lab-side wrapper)."""
    original = model.save_pretrained
    state = {"saves": 0}

    def save_pretrained(*args: Any, **kwargs: Any) -> Any:
        state["saves"] += 1
        if state["saves"] == 1:
            onset(out, rank)
            load_batch(seconds)
        return original(*args, **kwargs)

    model.save_pretrained = save_pretrained


def main(case: dict[str, Any]) -> None:
    import torch
    import torch.distributed as dist
    import transformers

    from trainhealth.integrations.huggingface import TrainhealthCallback

    out = Path(case["out"])
    rank = int(os.environ["RANK"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=case["collective_timeout_s"]))
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=2, n_head=2)
    model = transformers.GPT2LMHeadModel(config)
    if rank == 0:
        _slow_first_save(model, out, rank, case["pause_s"])
    ids = torch.randint(0, 64, (512, 16), generator=torch.Generator().manual_seed(case["seed"]))
    data = [{"input_ids": row, "labels": row} for row in ids]
    args = transformers.TrainingArguments(
        output_dir=str(out / "hf"),
        per_device_train_batch_size=4,
        max_steps=case["steps"],
        save_strategy="steps",
        save_steps=case["onset_step"],
        save_only_model=True,
        logging_steps=10,
        report_to=[],
        use_cpu=True,
        ddp_backend="gloo",
        ddp_timeout=int(case["collective_timeout_s"]),
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=case["seed"],
    )
    callback = TrainhealthCallback(**monitor_settings(case, rank))
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=[callback])
    (out / f"ready-{rank}").write_text("")
    trainer.train()
    (out / f"done-{rank}").write_text("")
    dist.destroy_process_group()
