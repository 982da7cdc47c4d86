"""Instability signals from inside the model, sampled and cheap: attention logits and entropy, output log Z,
block activation RMS, and where a non-finite or overflowing value first appeared (see
:mod:`trainhealth._internal.exporters.training.provenance`).

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
Every step the provenance hooks measure the sum of the output of each embedding
and block, and of each parameter's local gradient (under torch.distributed); the
output head is judged by elimination, never read (see
:mod:`~trainhealth._internal.exporters.training.provenance`).

>>> import torch
>>> model = torch.nn.Sequential(torch.nn.TransformerEncoderLayer(16, 2, 32, batch_first=True), torch.nn.Linear(16, 50))
>>> signals = ModelSignals(torch, model, blocks=["0"], head="1")
>>> signals.sampling = True
>>> _ = model(torch.randn(2, 8, 16))
>>> tensors, order = signals.take()
>>> sorted(name for name, _, _ in tensors), order.forward
(['activation_rms/0', 'attention_entropy/0.self_attn', 'attention_max_logit/0.self_attn', 'block_peak', 'log_z'], ('0',))
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trainhealth._internal.exporters.training.provenance import BlockOrder, Origin, Provenance, locate

if TYPE_CHECKING:
    from trainhealth._internal.store import MetricStore

__all__ = ["ModelSignals", "SignalValues"]


@dataclass
class SignalValues:
    """One step's values, by name (host floats); ``nonfinite_origin`` is where a bad value first appeared."""

    attention_max_logit: dict[str, float] = field(default_factory=dict)
    attention_entropy: dict[str, float] = field(default_factory=dict)
    activation_rms: dict[str, float] = field(default_factory=dict)
    log_z: float | None = None
    nonfinite_origin: Origin | None = None


class ModelSignals:
    """Hooks on ``model``: attention modules, the output head and the blocks named in ``blocks``; ``signals``
    and ``provenance`` choose the sampled instability signals and the every-step NaN provenance, ``gradients``
    whether provenance also measures each parameter's local gradient."""

    def __init__(
        self,
        torch: Any,
        model: Any,
        blocks: Iterable[str],
        *,
        sample_tokens: int = 64,
        head: str | None = None,
        store: MetricStore | None = None,
        signals: bool = True,
        provenance: bool = True,
        gradients: bool = True,
    ) -> None:
        self._torch = torch
        self._store = store
        self._off: set[str] = set()  # hooks that raised (by signal and label): no longer measured
        self._sample = sample_tokens
        self.sampling = False  # set for the steps whose signals are read
        self._handles: list[Any] = []
        self._attention: dict[str, list[Any]] = {}  # layer -> [max logit, entropy or None] device tensors
        self._rms: dict[str, Any] = {}
        self._log_z: Any = None
        modules = dict(model.named_modules())
        self.block_names = [name for name in blocks if name in modules]
        self.attention_names: list[str] = []
        for name, module in modules.items() if signals else ():
            label = _label(name)
            if isinstance(module, torch.nn.MultiheadAttention):
                self.attention_names.append(label)
                self._handles.append(module.register_forward_pre_hook(self._mha_hook(label, module), with_kwargs=True))
            elif _has_linear(module, "q_proj", torch) and _has_linear(module, "k_proj", torch):
                self.attention_names.append(label)
                self._hook_projections(label, module)
        for name in self.block_names if signals else ():
            self._handles.append(modules[name].register_forward_hook(self._block_hook(_label(name))))
        self.head_name = head if head in modules else _find_head(model, torch)
        if self.head_name is not None and signals:
            self._handles.append(modules[self.head_name].register_forward_hook(self._head_hook()))
        embeddings = [name for name, module in modules.items() if isinstance(module, torch.nn.Embedding)]
        # the head's logits are never read: a bad loss with every block output finite names it by elimination
        traced = embeddings + [name for name in self.block_names if name not in embeddings]
        self.provenance = Provenance(
            torch,
            modules,
            traced if provenance else [],
            model.named_parameters() if provenance and gradients else [],
            _label,
            store,
        )

    # --- per step -------------------------------------------------------------------
    def take(self) -> tuple[list[tuple[str, Any, int]], BlockOrder]:
        """The device tensors of this step (name, tensor, length) and the blocks of the provenance peaks;
        clears them for the next step."""
        out, order = self.provenance.take()
        for layer, (max_logit, entropy) in self._attention.items():
            out.append((f"attention_max_logit/{layer}", max_logit, 1))
            if entropy is not None:
                out.append((f"attention_entropy/{layer}", entropy, 1))
        for block, rms in self._rms.items():
            out.append((f"activation_rms/{block}", rms, 1))
        if self._log_z is not None:
            out.append(("log_z", self._log_z, 1))
        self._attention, self._rms, self._log_z = {}, {}, None
        return out, order

    @staticmethod
    def interpret(read: dict[str, Any], order: BlockOrder) -> SignalValues:
        """The host values of :meth:`take`'s tensors (and the step's ``grad_norm``) as :class:`SignalValues`."""
        values = SignalValues(nonfinite_origin=locate(read, order))
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
        self.provenance.close()

    # --- hooks ----------------------------------------------------------------------
    def _slice(self, tensor: Any, batch_first: bool) -> Any:
        """(tokens, features) of the first sequence, at most ``sample_tokens`` tokens."""
        if tensor.dim() == 2:
            return tensor[: self._sample]
        first = tensor[0] if batch_first else tensor[:, 0]
        return first[: self._sample]

    def _mha_hook(self, label: str, module: Any) -> Any:
        torch = self._torch
        signal = f"attention/{label}"

        def hook(mod: Any, args: tuple, kwargs: dict) -> None:
            if not self.sampling or signal in self._off:
                return
            try:
                query = args[0] if args else kwargs["query"]
                key = args[1] if len(args) > 1 else kwargs.get("key", query)
                batch_first = getattr(mod, "batch_first", False)
                with torch.no_grad():
                    q_in, k_in = self._slice(query.detach(), batch_first), self._slice(key.detach(), batch_first)
                    d_model, heads = mod.embed_dim, mod.num_heads
                    if mod.in_proj_weight is not None:
                        w_q, w_k = mod.in_proj_weight[:d_model], mod.in_proj_weight[d_model : 2 * d_model]
                    else:
                        w_q, w_k = mod.q_proj_weight, mod.k_proj_weight
                    bias = mod.in_proj_bias
                    q = torch.nn.functional.linear(q_in, w_q, None if bias is None else bias[:d_model])
                    k = torch.nn.functional.linear(k_in, w_k, None if bias is None else bias[d_model : 2 * d_model])
                    logits = _head_logits(q, k, heads)
                    mask = kwargs.get("attn_mask", args[5] if len(args) > 5 else None)
                    causal = bool(kwargs.get("is_causal", False))
                    logits = _masked(torch, logits, mask, causal)
                    finite = torch.isfinite(logits)
                    max_logit = torch.where(finite, logits, torch.full_like(logits, -math.inf)).amax()
                    probabilities = torch.softmax(logits.float(), dim=-1)
                    entropy = -(probabilities * torch.log(probabilities.clamp_min(1e-30))).sum(-1).mean()
                self._attention[label] = [max_logit.float(), entropy.float()]
            except Exception as error:  # a signal must never break the forward pass
                self._turn_off(signal, error)

        return hook

    def _hook_projections(self, label: str, module: Any) -> None:
        torch = self._torch
        heads = _heads(module)
        captured: dict[str, Any] = {}
        signal = f"attention/{label}"

        def capture(name: str) -> Any:
            def hook(mod: Any, inputs: tuple, output: Any) -> None:
                if not self.sampling or heads is None or signal in self._off:
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
                except Exception as error:
                    captured.clear()
                    self._turn_off(signal, error)

            return hook

        self._handles.append(module.q_proj.register_forward_hook(capture("q")))
        self._handles.append(module.k_proj.register_forward_hook(capture("k")))

    def _block_hook(self, label: str) -> Any:
        torch = self._torch
        signal = f"activation_rms/{label}"

        def hook(mod: Any, inputs: tuple, output: Any) -> None:
            if not self.sampling or signal in self._off:
                return
            try:
                tensor = output[0] if isinstance(output, (tuple, list)) else output
                if isinstance(tensor, torch.Tensor) and tensor.is_floating_point():
                    with torch.no_grad():
                        # a norm allocates nothing of the output's size: pow(2) would, on every sampled step
                        norm = torch.linalg.vector_norm(tensor.detach(), dtype=torch.float32)
                        self._rms[label] = norm / math.sqrt(max(tensor.numel(), 1))
            except Exception as error:
                self._turn_off(signal, error)

        return hook

    def _head_hook(self) -> Any:
        torch = self._torch

        def hook(mod: Any, inputs: tuple, output: Any) -> None:
            if not self.sampling or "log_z" in self._off:
                return
            try:
                logits = output[0] if isinstance(output, (tuple, list)) else output
                with torch.no_grad():
                    sample = self._slice(logits.detach(), True).float()
                    self._log_z = torch.logsumexp(sample, dim=-1).mean()
            except Exception as error:
                self._turn_off("log_z", error)

        return hook

    def _turn_off(self, key: str, error: Exception) -> None:
        """A signal's hook raised: counted in ``trainhealth_exporter_errors_total{source="model_signals"}`` (a
        warning the first time) and that signal no longer measured; the others go on."""
        self._off.add(key)
        if self._store is not None:
            self._store.record_error("model_signals", error)


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
            module, torch.nn.Linear
        ):
            return name
    return None
