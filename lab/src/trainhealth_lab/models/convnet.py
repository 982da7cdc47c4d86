"""A small convolutional network, and noisy images of simple shapes for it to classify.

Each image is a ``size`` x ``size`` canvas with one of six 7x7 shapes (outlined square, filled
square, plus, cross, horizontal bar, vertical bar) at a random place and brightness, under
Gaussian noise: a task a small ConvNet learns in a few hundred steps, with a loss that stays
above zero because of the noise.

>>> import torch
>>> images, labels = shape_batch(4, torch.Generator().manual_seed(0))
>>> tuple(images.shape), tuple(ConvNet()(images).shape)
((4, 1, 16, 16), (4, 6))
"""

from __future__ import annotations

import torch

__all__ = ["SHAPES", "ConvNet", "shape_batch"]

_STAMP = 7


def _stamps() -> torch.Tensor:
    stamps = torch.zeros(6, _STAMP, _STAMP)
    stamps[0] = 1.0
    stamps[0, 1:-1, 1:-1] = 0.0  # outlined square
    stamps[1, 1:-1, 1:-1] = 1.0  # filled square
    stamps[2, _STAMP // 2, :] = stamps[2, :, _STAMP // 2] = 1.0  # plus
    stamps[3] = torch.eye(_STAMP) + torch.eye(_STAMP).flip(1)  # cross
    stamps[3].clamp_(max=1.0)
    stamps[4, _STAMP // 2 - 1 : _STAMP // 2 + 2, :] = 1.0  # horizontal bar
    stamps[5, :, _STAMP // 2 - 1 : _STAMP // 2 + 2] = 1.0  # vertical bar
    return stamps


SHAPES = _stamps()


def shape_batch(
    size: int, generator: torch.Generator, *, canvas: int = 16, noise: float = 0.6
) -> tuple[torch.Tensor, torch.Tensor]:
    """``size`` images ``(size, 1, canvas, canvas)`` and their shape labels."""
    labels = torch.randint(0, len(SHAPES), (size,), generator=generator)
    rows = torch.randint(0, canvas - _STAMP + 1, (size,), generator=generator).tolist()
    columns = torch.randint(0, canvas - _STAMP + 1, (size,), generator=generator).tolist()
    brightness = 0.5 + torch.rand(size, generator=generator)
    images = noise * torch.randn(size, 1, canvas, canvas, generator=generator)
    for index, (row, column) in enumerate(zip(rows, columns)):
        images[index, 0, row : row + _STAMP, column : column + _STAMP] += brightness[index] * SHAPES[labels[index]]
    return images, labels


class ConvNet(torch.nn.Module):
    """Two 3x3 convolutions with ReLU and max-pooling, then a linear ``head``."""

    def __init__(self, classes: int = 6, canvas: int = 16, channels: int = 16) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Conv2d(1, channels // 2, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(channels // 2, channels, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.MaxPool2d(2),
            torch.nn.Flatten(),
        )
        self.head = torch.nn.Linear(channels * (canvas // 4) ** 2, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))
