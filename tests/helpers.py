"""Shared test helpers: a tiny GPT-style model, HTTP scraping and parsing."""

from __future__ import annotations

import ssl
import urllib.request
from dataclasses import dataclass

import torch
from prometheus_client.parser import text_string_to_metric_families

VOCAB, D_MODEL, SEQ, BATCH = 64, 32, 16, 4


class TinyGPT(torch.nn.Module):
    """Embedding, two causal transformer blocks in ``layers``, and an output head."""

    def __init__(self, sparse_embedding: bool = False) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, D_MODEL, sparse=sparse_embedding)
        self.layers = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(D_MODEL, 2, 2 * D_MODEL, dropout=0.0, batch_first=True) for _ in range(2)
        )
        self.head = torch.nn.Linear(D_MODEL, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        mask = torch.nn.Transformer.generate_square_subsequent_mask(tokens.shape[1])
        hidden = self.embed(tokens)
        for layer in self.layers:
            hidden = layer(hidden, src_mask=mask, is_causal=True)
        return self.head(hidden)


def batch(step: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 + step)
    return torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=generator)


def lm_loss(model: torch.nn.Module, step: int) -> torch.Tensor:
    tokens = batch(step)
    logits = model(tokens[:, :-1])
    return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))


def expected_group(name: str) -> str:
    """The layer group a TinyGPT parameter belongs to, worked out independently of trainhealth."""
    parts = name.split(".")
    return f"layers.{parts[1]}" if parts[0] == "layers" else parts[0]


@dataclass
class Scrape:
    status: int
    text: str

    def samples(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        out = {}
        for family in text_string_to_metric_families(self.text):
            for sample in family.samples:
                out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        return out

    def value(self, name: str, **labels: str) -> float:
        matches = [
            v
            for (n, lab), v in self.samples().items()
            if n == name and all(dict(lab).get(k) == want for k, want in labels.items())
        ]
        if len(matches) != 1:
            raise AssertionError(f"{len(matches)} samples of {name} with {labels}")
        return matches[0]

    def labels_of(self, name: str) -> list[dict[str, str]]:
        return [dict(lab) for (n, lab), _ in self.samples().items() if n == name]


def scrape(url: str, *, context: ssl.SSLContext | None = None, headers: dict[str, str] | None = None) -> Scrape:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            return Scrape(response.status, response.read().decode())
    except urllib.error.HTTPError as error:
        return Scrape(error.code, error.read().decode())
