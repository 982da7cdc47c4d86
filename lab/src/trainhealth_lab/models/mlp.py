"""A small multilayer perceptron, and a fixed random teacher network whose labels it learns.

The teacher is a random ``tanh`` network; its arg-max over classes labels Gaussian inputs, a
task the student learns visibly but not perfectly within a thousand steps. A teacher with another
seed labels the same inputs differently (a shifted data source).

>>> import torch
>>> teacher = Teacher(inputs=32, classes=10, seed=0)
>>> x, y = teacher.batch(8, torch.Generator().manual_seed(1))
>>> tuple(MLP(inputs=32, classes=10)(x).shape), tuple(y.shape)
((8, 10), (8,))
"""

from __future__ import annotations

import torch

__all__ = ["MLP", "Teacher"]


class MLP(torch.nn.Module):
    """``inputs -> hidden -> hidden -> classes`` with ReLU; the last layer is ``head``."""

    def __init__(self, inputs: int = 32, classes: int = 10, hidden: int = 128) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Linear(inputs, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden), torch.nn.ReLU()
        )
        self.head = torch.nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


class Teacher:
    """A fixed random network ``inputs -> 64 (tanh) -> classes``; labels are its arg-max."""

    def __init__(self, inputs: int, classes: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.inputs = inputs
        self.hidden = torch.randn(inputs, 64, generator=generator) / inputs**0.5
        self.out = torch.randn(64, classes, generator=generator)

    def label(self, x: torch.Tensor) -> torch.Tensor:
        return (torch.tanh(x @ self.hidden) @ self.out).argmax(dim=1)

    def batch(self, size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """``size`` standard Gaussian inputs and their labels."""
        x = torch.randn(size, self.inputs, generator=generator)
        return x, self.label(x)
