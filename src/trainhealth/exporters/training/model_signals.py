"""Instability signals from inside the model, sampled and cheap: attention logits and entropy, output log Z,
block activation RMS, and where a non-finite value first appeared.

Forward hooks do the work on the device and hand back small tensors; nothing
is read on the training thread (the Monitor reads them with the step's other
values). Fused attention never materialises the attention probabilities, so
they are recomputed on a sampled slice (the first sequence of the batch, at
most ``sample_tokens`` positions) from the attention module's own inputs:

* ``torch.nn.MultiheadAttention`` (also inside ``TransformerEncoderLayer``):
  the query and key projections of the slice from its ``in_proj_weight``, the
  logits q·kᵀ/√d with the call's causal or additive mask, their maximum and the
  mean entropy of their softmax over keys;
* modules with separate ``q_proj`` and ``k_proj`` linears (Llama, Mistral, Qwen
  in Hugging Face transformers): rotary embeddings are applied after them, so
  the exact logits are not available at that point; the maximum logit is
  bounded by max‖q‖·max‖k‖/√d per head (rotations keep norms), and no entropy.

Output log Z (``logsumexp`` of the output logits, what z-loss penalises) comes
from the model's output head; activation RMS from each layer group's block.
Every step each block's output is checked for non-finite values (one float32
sum per block, read with the step): the first block in forward order that
produced one is the origin.

>>> import torch
>>> model = torch.nn.Sequential(torch.nn.TransformerEncoderLayer(16, 2, 32, batch_first=True), torch.nn.Linear(16, 50))
>>> signals = ModelSignals(torch, model, blocks=["0"], head="1")
>>> signals.sampling = True
>>> _ = model(torch.randn(2, 8, 16))
>>> tensors, order = signals.take()
>>> sorted(name for name, _, _ in tensors), order
(['activation_rms/0', 'attention_entropy/0.self_attn', 'attention_max_logit/0.self_attn', 'finite', 'log_z'], ['0', '1'])
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ModelSignals", "SignalValues"]


@dataclass
class SignalValues:
    """One sampled step's values, by name (host floats); ``nonfinite_origin`` is a block name or None."""

    attention_max_logit: dict[str, float] = field(default_factory=dict)
    attention_entropy: dict[str, float] = field(default_factory=dict)
    activation_rms: dict[str, float] = field(default_factory=dict)
    log_z: float | None = None
    nonfinite_origin: str | None = None


class ModelSignals:
    """Hooks on ``model``: attention modules, the output head and the blocks named in ``blocks``."""

    def __init__(self, torch: Any, model: Any, blocks: Iterable[str], *, sample_tokens: int = 64,
                 head: str | None = None) -> None:
        self._torch = torch
        self._sample = sample_tokens
        self.sampling = False  # set for the steps whose signals are read
        self._handles: list[Any] = []
        self._attention: dict[str, list[Any]] = {}  # layer -> [max logit, entropy or None] device tensors
        self._rms: dict[str, Any] = {}
        self._log_z: Any = None
        self._finite: dict[str, Any] = {}  # block -> device bool (all finite), every step
        modules = dict(model.named_modules())
        self.block_names = [name for name in blocks if name in modules]
        self.attention_names: list[str] = []
        for name, module in modules.items():
            label = _label(name)
            if isinstance(module, torch.nn.MultiheadAttention):
                self.attention_names.append(label)
                self._handles.append(module.register_forward_pre_hook(self._mha_hook(label, module), with_kwargs=True))
            elif _has_linear(module, "q_proj", torch) and _has_linear(module, "k_proj", torch):
                self.attention_names.append(label)
                self._hook_projections(label, module)
        for name in self.block_names:
            self._handles.append(modules[name].register_forward_hook(self._block_hook(_label(name))))
        self.head_name = head if head in modules else _find_head(model, torch)
        if self.head_name is not None:
            self._handles.append(modules[self.head_name].register_forward_hook(self._head_hook()))
            if self.head_name not in self.block_names:
                self._handles.append(modules[self.head_name].register_forward_hook(self._block_hook(
                    _label(self.head_name), rms=False)))

    # --- per step -------------------------------------------------------------------
    def take(self) -> tuple[list[tuple[str, Any, int]], list[str]]:
        """The device tensors of this step (name, tensor, length) and the block order of the finite flags;
        clears them for the next step."""
        out: list[tuple[str, Any, int]] = []
        order = list(self._finite)
        if order:
            flags = self._torch.stack([self._finite[name] for name in order]).float()
            out.append(("finite", flags, len(order)))
        for layer, (max_logit, entropy) in self._attention.items():
            out.append((f"attention_max_logit/{layer}", max_logit, 1))
            if entropy is not None:
                out.append((f"attention_entropy/{layer}", entropy, 1))
        for block, rms in self._rms.items():
            out.append((f"activation_rms/{block}", rms, 1))
        if self._log_z is not None:
            out.append(("log_z", self._log_z, 1))
        self._attention, self._rms, self._log_z, self._finite = {}, {}, None, {}
        return out, order

    @staticmethod
    def interpret(read: dict[str, Any], order: list[str]) -> SignalValues:
        """The host values of :meth:`take`'s tensors as :class:`SignalValues`."""
        values = SignalValues()
        finite = read.get("finite")
        if finite is not None:
            flags = finite if isinstance(finite, list) else [finite]
            bad = [name for name, ok in zip(order, flags) if ok < 0.5]
            values.nonfinite_origin = bad[0] if bad else None
        for key, value in read.items():
            kind, _, name = key.partition("/")
            if kind == "attention_max_logit":
                values.attention_max_logit[name] = value
            elif kind == "attention_entropy":
                values.attention_entropy[name] = value
            elif kind == "activation_rms":
                values.activation_rms[name] = value
        if "log_z" in read:
            values.log_z = read["log_z"]
        return values

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    # --- hooks ----------------------------------------------------------------------
    def _slice(self, tensor: Any, batch_first: bool) -> Any:
        """(tokens, features) of the first sequence, at most ``sample_tokens`` tokens."""
        if tensor.dim() == 2:
            return tensor[: self._sample]
        first = tensor[0] if batch_first else tensor[:, 0]
        return first[: self._sample]

    def _mha_hook(self, label: str, module: Any) -> Any:
        torch = self._torch

        def hook(mod: Any, args: tuple, kwargs: dict) -> None:
            if not self.sampling:
                return
            try:
                query = args[0] if args else kwargs["query"]
                key = args[1] if len(args) > 1 else kwargs.get("key", query)
                batch_first = getattr(mod, "batch_first", False)
                with torch.no_grad():
                    q_in, k_in = self._slice(query.detach(), batch_first), self._slice(key.detach(), batch_first)
                    d_model, heads = mod.embed_dim, mod.num_heads
                    if mod.in_proj_weight is not None:
                        w_q, w_k = mod.in_proj_weight[:d_model], mod.in_proj_weight[d_model: 2 * d_model]
                    else:
                        w_q, w_k = mod.q_proj_weight, mod.k_proj_weight
                    bias = mod.in_proj_bias
                    q = torch.nn.functional.linear(q_in, w_q, None if bias is None else bias[:d_model])
                    k = torch.nn.functional.linear(k_in, w_k, None if bias is None else bias[d_model: 2 * d_model])
                    logits = _head_logits(q, k, heads)
                    mask = kwargs.get("attn_mask", args[5] if len(args) > 5 else None)
                    causal = bool(kwargs.get("is_causal", False))
                    logits = _masked(torch, logits, mask, causal)
                    finite = torch.isfinite(logits)
                    max_logit = torch.where(finite, logits, torch.full_like(logits, -math.inf)).amax()
                    probabilities = torch.softmax(logits.float(), dim=-1)
                    entropy = -(probabilities * torch.log(probabilities.clamp_min(1e-30))).sum(-1).mean()
                self._attention[label] = [max_logit.float(), entropy.float()]
            except Exception:  # a signal must never break the forward pass
                return

        return hook

    def _hook_projections(self, label: str, module: Any) -> None:
        torch = self._torch
        heads = _heads(module)
        captured: dict[str, Any] = {}

        def capture(name: str) -> Any:
            def hook(mod: Any, inputs: tuple, output: Any) -> None:
                if not self.sampling or heads is None:
                    return
                try:
                    with torch.no_grad():
                        captured[name] = self._slice(output.detach(), True).float()
                        if "q" in captured and "k" in captured:
                            q, k = captured.pop("q"), captured.pop("k")
                            d = q.shape[-1] // heads
                            q_norm = q.reshape(q.shape[0], heads, -1).norm(dim=-1).amax(dim=0)
                            k_heads = k.shape[-1] // d
                            k_norm = k.reshape(k.shape[0], k_heads, -1).norm(dim=-1).amax(dim=0)
                            k_norm = k_norm.repeat_interleave(heads // k_heads) if k_heads != heads else k_norm
                            self._attention[label] = [(q_norm * k_norm).amax() / math.sqrt(d), None]
                except Exception:
                    return

            return hook

        self._handles.append(module.q_proj.register_forward_hook(capture("q")))
        self._handles.append(module.k_proj.register_forward_hook(capture("k")))

    def _block_hook(self, label: str, rms: bool = True) -> Any:
        torch = self._torch

        def hook(mod: Any, inputs: tuple, output: Any) -> None:
            try:
                tensor = output[0] if isinstance(output, (tuple, list)) else output
                if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point():
                    return
                with torch.no_grad():
                    if label not in self._finite:  # the first call of the step (gradient checkpointing recomputes)
                        # one float32 sum: NaN and inf propagate through it, and it reads the tensor once without
                        # a mask the size of the output (isfinite().all() on the logits of a small LM took 8% of
                        # a CPU step); a sum that overflows float32 needs values near 1e31, an instability too
                        self._finite[label] = torch.isfinite(tensor.detach().sum(dtype=torch.float32))
                    if rms and self.sampling:
                        self._rms[label] = tensor.detach().float().pow(2).mean().sqrt()
            except Exception:
                return

        return hook

    def _head_hook(self) -> Any:
        torch = self._torch

        def hook(mod: Any, inputs: tuple, output: Any) -> None:
            if not self.sampling:
                return
            try:
                logits = output[0] if isinstance(output, (tuple, list)) else output
                with torch.no_grad():
                    sample = self._slice(logits.detach(), True).float()
                    self._log_z = torch.logsumexp(sample, dim=-1).mean()
            except Exception:
                return

        return hook


def _label(name: str) -> str:
    return name.removeprefix("module.") or "model"


def _has_linear(module: Any, name: str, torch: Any) -> bool:
    return isinstance(getattr(module, name, None), torch.nn.Linear)


def _heads(module: Any) -> int | None:
    for attribute in ("num_heads", "num_attention_heads", "n_heads"):
        value = getattr(module, attribute, None)
        if isinstance(value, int) and value > 0:
            return value
    config = getattr(module, "config", None)
    value = getattr(config, "num_attention_heads", None)
    return value if isinstance(value, int) and value > 0 else None


def _head_logits(q: Any, k: Any, heads: int) -> Any:
    """(heads, tokens, tokens) scaled dot products."""
    tokens, width = q.shape
    d = width // heads
    q = q.reshape(tokens, heads, d).transpose(0, 1).float()
    k = k.reshape(k.shape[0], heads, d).transpose(0, 1).float()
    return q @ k.transpose(1, 2) / math.sqrt(d)


def _masked(torch: Any, logits: Any, mask: Any, causal: bool) -> Any:
    tokens, keys = logits.shape[-2], logits.shape[-1]
    if isinstance(mask, torch.Tensor):
        cut = mask[..., :tokens, :keys]
        if cut.dim() == 3:
            cut = cut[: logits.shape[0]] if cut.shape[0] == logits.shape[0] else cut[0]
        if cut.dtype == torch.bool:
            return logits.masked_fill(cut, -math.inf)
        return logits + cut.float()
    if causal:
        upper = torch.ones(tokens, keys, dtype=torch.bool, device=logits.device).triu(1)
        return logits.masked_fill(upper, -math.inf)
    return logits


def _find_head(model: Any, torch: Any) -> str | None:
    """The output head: a Linear named lm_head, head, output or output_projection, else none."""
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] in ("lm_head", "head", "output", "output_projection") and isinstance(
                module, torch.nn.Linear):
            return name
    return None
