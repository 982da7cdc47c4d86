"""Train a tiny GPT-style model on the CPU with trainhealth's Monitor and serve /metrics.

    python examples/train_tiny.py [--steps 600] [--port 9450] [--linger 0]

The data is synthetic but learnable (each token is mostly the previous one plus
one), so the loss falls visibly. While it runs, scrape the printed URL:

    curl -s http://127.0.0.1:9450/metrics | grep trainhealth_train_
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

import trainhealth

VOCAB, D_MODEL, LAYERS, HEADS, SEQ, BATCH = 256, 128, 2, 4, 64, 16
CHECKPOINT_EVERY = 200


class TinyGPT(torch.nn.Module):
    """A causal transformer language model: token and position embeddings, pre-norm blocks, a head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, D_MODEL)
        self.position = torch.nn.Embedding(SEQ, D_MODEL)
        block = torch.nn.TransformerEncoderLayer(
            D_MODEL, HEADS, 4 * D_MODEL, dropout=0.0, batch_first=True, norm_first=True
        )
        self.blocks = torch.nn.TransformerEncoder(block, LAYERS, enable_nested_tensor=False)
        self.head = torch.nn.Linear(D_MODEL, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        mask = torch.nn.Transformer.generate_square_subsequent_mask(length)
        hidden = self.embed(tokens) + self.position(torch.arange(length))
        return self.head(self.blocks(hidden, mask=mask, is_causal=True))


def synthetic_batch(step: int) -> torch.Tensor:
    """Sequences where each token is the previous one plus one, 10% replaced at random: learnable."""
    generator = torch.Generator().manual_seed(step)
    start = torch.randint(0, VOCAB, (BATCH, 1), generator=generator)
    tokens = (start + torch.arange(SEQ + 1)) % VOCAB
    noise = torch.rand(BATCH, SEQ + 1, generator=generator) < 0.1
    tokens[noise] = torch.randint(0, VOCAB, (int(noise.sum()),), generator=generator)
    return tokens


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=600, help="training steps (default 600, about half a minute)")
    parser.add_argument("--port", type=int, default=None, help="/metrics port (default 9450 + LOCAL_RANK)")
    parser.add_argument(
        "--addr", default=None, help="address to serve on (default TRAINHEALTH_PROMETHEUS_ADDR or 0.0.0.0)"
    )
    parser.add_argument("--checkpoint", default=None, help="checkpoint file (default: one in a temporary directory)")
    parser.add_argument("--linger", type=float, default=0.0, help="seconds to keep serving after training")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    model = TinyGPT()
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}], lr=3e-3
    )
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3, total_steps=args.steps, pct_start=0.1)
    n_params = sum(p.numel() for p in model.parameters())

    checkpoint = args.checkpoint or str(Path(tempfile.mkdtemp(prefix="train_tiny-")) / "checkpoint.pt")
    try:
        monitor = trainhealth.Monitor(
            model,
            optimizer,
            flops_per_token=6 * n_params,
            prometheus_port=args.port,
            prometheus_addr=args.addr,
        )
    except trainhealth.ConfigError as error:
        print(f"train_tiny: error: {error}", file=sys.stderr)
        return 2
    with monitor:
        print(f"trainhealth {trainhealth.__version__}: {n_params / 1e6:.2f}M parameters, {args.steps} steps")
        if monitor.metrics_url:
            print(
                f"serving metrics at {monitor.metrics_url}  (try: curl -s {monitor.metrics_url} | grep trainhealth_train_)"
            )
        for step in range(args.steps):
            tokens = synthetic_batch(step)
            logits = model(tokens[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            schedule.step()
            monitor.step(loss=loss, tokens=BATCH * SEQ, grad_norm=grad_norm, step=step)
            if step > 0 and step % CHECKPOINT_EVERY == 0:
                began = time.perf_counter()
                torch.save({"model": model.state_dict(), "step": step}, checkpoint)
                monitor.checkpoint_saved(step, duration_s=time.perf_counter() - began)
            latest = monitor.latest
            if latest is not None and (step % 25 == 0 or step == args.steps - 1):
                rate = f"{latest.tokens_per_second:,.0f} tok/s" if latest.tokens_per_second else "—"
                print(f"step {latest.step:4d}  loss {latest.loss:.3f}  grad norm {latest.grad_norm:.3f}  {rate}")
        if args.linger > 0 and monitor.metrics_url:
            print(f"training done; serving {monitor.metrics_url} for {args.linger:.0f} s more (Ctrl-C to stop)")
            try:
                time.sleep(args.linger)
            except KeyboardInterrupt:
                pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
