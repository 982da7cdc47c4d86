"""Lazy access to PyTorch, which is an optional dependency."""

from __future__ import annotations

from types import ModuleType

__all__ = ["require_torch", "TORCH_INSTALL_HINT"]

TORCH_INSTALL_HINT = (
    "install it with: pip install 'trainhealth[torch]' "
    "(without a GPU, install the CPU build first: pip install torch --index-url https://download.pytorch.org/whl/cpu)"
)


def require_torch(feature: str) -> ModuleType:
    """Import torch, or raise ImportError saying what ``feature`` needs and how to install it."""
    try:
        import torch
    except ImportError as exc:
        raise ImportError(f"{feature} needs PyTorch, which is not installed; {TORCH_INSTALL_HINT}") from exc
    return torch
