"""The three learning tasks of the corpus: a model, its data stream, a shifted stream and a corrupted batch.

``tiny_gpt`` learns a counting token stream (x[t] = x[t-1] + 1 mod 64, 10% random tokens); its
shifted shard counts in steps of 5. ``mlp`` learns a fixed random teacher's labels of Gaussian inputs;
its shifted shard is labelled by another teacher. ``convnet`` classifies noisy shapes; its shifted
shard shows them in negative on a bright background. A corrupted batch is random tokens, or inputs
scaled by 10 with random labels.

>>> import torch
>>> task = TASKS["mlp"]
>>> model = task.model(seed=0)
>>> batch = task.batch(torch.Generator().manual_seed(0), seed=0, shifted=False)
>>> task.loss(model, batch).item() > 0
True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from trainhealth._internal.demo.tiny_gpt import TinyGPT
from trainhealth_lab.models.convnet import ConvNet, shape_batch
from trainhealth_lab.models.mlp import MLP, Teacher

__all__ = ["TASKS", "Task"]

Batch = Any  # a token tensor, or (inputs, labels)


class Task(Protocol):
    """A model and its data: batches (``shifted``: the bad shard's), a corrupted batch, the loss, and the
    output layer whose input the overflow scenario scales."""

    @property
    def name(self) -> str: ...

    @property
    def peak_lr(self) -> float: ...

    def model(self, seed: int) -> torch.nn.Module: ...

    def batch(self, generator: torch.Generator, *, seed: int, shifted: bool) -> Batch: ...

    def corrupt(self, batch: Batch, generator: torch.Generator) -> Batch: ...

    def loss(self, model: torch.nn.Module, batch: Batch) -> torch.Tensor: ...

    def output_layer(self, model: torch.nn.Module) -> torch.nn.Module: ...


@dataclass(frozen=True)
class TokenTask:
    name: str = "tiny_gpt"
    peak_lr: float = 3e-3
    vocab: int = 64
    context: int = 32
    size: int = 16

    def model(self, seed: int) -> torch.nn.Module:
        torch.manual_seed(seed)
        return TinyGPT(vocab=self.vocab, width=32, layers=2, heads=2, context=self.context)

    def batch(self, generator: torch.Generator, *, seed: int, shifted: bool) -> Batch:
        stride = 5 if shifted else 1
        start = torch.randint(0, self.vocab, (self.size, 1), generator=generator)
        tokens = (start + stride * torch.arange(self.context + 1)) % self.vocab
        noise = torch.rand(self.size, self.context + 1, generator=generator) < 0.1
        tokens[noise] = torch.randint(0, self.vocab, (int(noise.sum()),), generator=generator)
        return tokens

    def corrupt(self, batch: Batch, generator: torch.Generator) -> Batch:
        return torch.randint(0, self.vocab, batch.shape, generator=generator)

    def loss(self, model: torch.nn.Module, batch: Batch) -> torch.Tensor:
        logits = model(batch[:, :-1])
        return torch.nn.functional.cross_entropy(logits.reshape(-1, self.vocab).float(), batch[:, 1:].reshape(-1))

    def output_layer(self, model: torch.nn.Module) -> torch.nn.Module:
        return model.get_submodule("lm_head")


def _classification_loss(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    inputs, labels = batch
    return torch.nn.functional.cross_entropy(model(inputs).float(), labels)


def _corrupt_classes(batch: Batch, generator: torch.Generator, classes: int) -> Batch:
    inputs, labels = batch
    return 10.0 * inputs, torch.randint(0, classes, labels.shape, generator=generator)


@dataclass(frozen=True)
class TeacherTask:
    name: str = "mlp"
    peak_lr: float = 2e-3
    inputs: int = 32
    classes: int = 10
    size: int = 64

    def model(self, seed: int) -> torch.nn.Module:
        torch.manual_seed(seed)
        return MLP(inputs=self.inputs, classes=self.classes)

    def batch(self, generator: torch.Generator, *, seed: int, shifted: bool) -> Batch:
        return Teacher(self.inputs, self.classes, seed=seed + (7919 if shifted else 0)).batch(self.size, generator)

    def corrupt(self, batch: Batch, generator: torch.Generator) -> Batch:
        return _corrupt_classes(batch, generator, self.classes)

    def loss(self, model: torch.nn.Module, batch: Batch) -> torch.Tensor:
        return _classification_loss(model, batch)

    def output_layer(self, model: torch.nn.Module) -> torch.nn.Module:
        return model.get_submodule("head")


@dataclass(frozen=True)
class ShapesTask:
    name: str = "convnet"
    peak_lr: float = 2e-3
    classes: int = 6
    size: int = 32

    def model(self, seed: int) -> torch.nn.Module:
        torch.manual_seed(seed)
        return ConvNet(classes=self.classes)

    def batch(self, generator: torch.Generator, *, seed: int, shifted: bool) -> Batch:
        images, labels = shape_batch(self.size, generator)
        return (1.5 - images if shifted else images), labels

    def corrupt(self, batch: Batch, generator: torch.Generator) -> Batch:
        return _corrupt_classes(batch, generator, self.classes)

    def loss(self, model: torch.nn.Module, batch: Batch) -> torch.Tensor:
        return _classification_loss(model, batch)

    def output_layer(self, model: torch.nn.Module) -> torch.nn.Module:
        return model.get_submodule("head")


TASKS: dict[str, Task] = {task.name: task for task in (TokenTask(), TeacherTask(), ShapesTask())}
