"""A small GPT-style language model and a synthetic token stream, for CPU runs of real training.

Pre-norm decoder blocks (``torch.nn.MultiheadAttention`` with a causal mask, a
GELU MLP), learned positions and an ``lm_head``: the shapes the model signals
and the SDC checks meet in real models, small enough for four gloo ranks on a
laptop. The data counts upwards through the vocabulary with 10% random tokens,
so the loss falls visibly as the model learns it.

>>> import torch
>>> model = TinyGPT(vocab=64, width=32, layers=2, heads=2, context=16)
>>> batch = synthetic_batch(64, 16, batch=4, seed=1)
>>> tuple(model(batch[:, :-1]).shape)
(4, 16, 64)
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["Block", "TinyGPT", "synthetic_batch"]


class Block(torch.nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.norm1 = torch.nn.LayerNorm(width)
        self.attn = torch.nn.MultiheadAttention(width, heads, batch_first=True)
        self.norm2 = torch.nn.LayerNorm(width)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width)
        )

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class TinyGPT(torch.nn.Module):
    def __init__(self, vocab: int = 256, width: int = 64, layers: int = 2, heads: int = 4, context: int = 64) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.position = torch.nn.Parameter(torch.zeros(context, width))
        self.layers = torch.nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm = torch.nn.LayerNorm(width)
        self.lm_head = torch.nn.Linear(width, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        mask = torch.ones(length, length, dtype=torch.bool, device=tokens.device).triu(1)
        x = self.embed(tokens) + self.position[:length]
        for block in self.layers:
            x = block(x, mask)
        return self.lm_head(self.norm(x))

    def loss(self, batch: torch.Tensor) -> Any:
        logits = self(batch[:, :-1])
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))


def synthetic_batch(vocab: int, context: int, batch: int, seed: int) -> torch.Tensor:
    """``batch`` sequences of ``context + 1`` tokens: x[t] = (x[t-1] + 1) mod vocab, 10% replaced at random."""
    generator = torch.Generator().manual_seed(seed)
    start = torch.randint(0, vocab, (batch, 1), generator=generator)
    tokens = (start + torch.arange(context + 1)) % vocab
    noise = torch.rand(batch, context + 1, generator=generator) < 0.1
    tokens[noise] = torch.randint(0, vocab, (int(noise.sum()),), generator=generator)
    return tokens
