"""Where a non-finite or overflowing value first appeared on this rank, and whether this rank made it.

A flip of float32's top exponent bit multiplies a value below 2 by 2¹²⁸ (3.4e38): finite,
and it may stay finite through a block or two before a LayerNorm or a softmax turns it into
NaN downstream, or before the gradient all-reduce carries it to every rank. So a value is
*bad* when it is NaN, infinite or larger in magnitude than :data:`OVERFLOW_BOUND`, and two
things are measured every step, on the device, and read with the step's other values (no
read on the training thread, no collective):

* each block's output: its sum, in float32 (one reduction per block and step);
* each parameter's local gradient, in a post-accumulate-grad hook: after every tensor hook
  and before DDP's reducer averages it (one sum per parameter and step).

A sum is bad when any of its values is: NaN and infinities propagate through it, and one
value above the bound outweighs a clean tensor's sum (the sums of clean block outputs and
gradients stay below 1e5 in the runs of ``benchmarks/sdc_detection.py --provenance``), at half
the cost of the smallest and largest value (``aminmax``) and a 24th of the ∞-norm's on a CPU.
:meth:`Provenance.take` stacks the step's sums into one tensor per kind.

The output head is never read: its logits are the step's largest tensor (batch × sequence ×
vocabulary), and a value there matters only if it reaches training. It is judged by
elimination. A step is judged only when something reached training: its loss or its gradient
norm is bad (a flip the softmax ignored, or a LayerNorm absorbed, leaves both finite and is no
finding). Then the origin (:func:`locate`) is, in this order:

1. the first block, in forward order, whose output was bad: a corrupted activation, or a
   corrupted weight that reaches its block's output;
2. else, when the loss was bad: the first bad value came after the last block, in the output
   head or the loss (block :data:`HEAD_OR_LOSS`);
3. else the first block, in the order backward reached it, whose local gradient was bad: a
   corrupted gradient, or a corrupted weight whose effect the forward absorbed (a saturated
   softmax) and which backward meets before the blocks upstream of it;
4. else, when the gradient norm after the all-reduce was bad: it was received through the
   all-reduce (block ``all_reduce``); another rank produced it — unless a measurement of this
   rank is off (a hook that raised: counted in ``trainhealth_exporter_errors_total{source="provenance"}``
   and turned off for that block or parameter): then this rank may have made it unseen, and the
   origin is unknown (None), never "received".

1 to 3 are :attr:`Where.LOCAL`: this rank produced the value before any exchange. When the loop
reports neither a loss nor a gradient norm, a bad block output is named on its own.

>>> order = BlockOrder(("embed", "layers.0", "layers.1"), ("layers.1",))
>>> locate({"block_peak": [3.0, 2e36, float("nan")], "loss": float("nan")}, order)
Origin(block='layers.0', stage=<Stage.OUTPUT: 'output'>)
>>> locate({"block_peak": [3.0, 4.0, 5.0], "loss": float("inf")}, order)
Origin(block='head_or_loss', stage=<Stage.AFTER_BLOCKS: 'after_blocks'>)
>>> locate({"block_peak": [3.0, 2e36, 5.0], "loss": 2.3, "grad_norm": 0.7}, order) is None  # absorbed
True
>>> locate({"block_peak": [3.0], "grad_peak": [0.1], "grad_norm": float("inf")}, BlockOrder(("embed",), ("embed",)))
Origin(block='all_reduce', stage=<Stage.ALL_REDUCE: 'all_reduce'>)
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainhealth._internal.store import MetricStore

__all__ = ["HEAD_OR_LOSS", "OVERFLOW_BOUND", "BlockOrder", "Origin", "Provenance", "Stage", "Where", "locate"]

#: Magnitude above which a value counts as overflowing. Clean 4-rank TinyGPT runs (benchmarks/sdc_detection.py
#: --provenance, its clean trials) peak below 10 in block outputs and 0.1 in local gradients; the massive
#: activations of large language models reach about 1e4. A top-exponent flip of any |x| > 3e-24 lands above it,
#: and an L2 norm over 1e8 values below it cannot overflow float32.
OVERFLOW_BOUND = 1e15

#: The origin's block when every block output was finite and the loss was not: after the last block.
HEAD_OR_LOSS = "head_or_loss"


class Stage(enum.Enum):
    """Where on the step the first bad value was seen."""

    OUTPUT = "output"  # a block's output, in the forward pass
    AFTER_BLOCKS = "after_blocks"  # the loss, every block output before it finite: the output head or the loss
    GRADIENT = "gradient"  # a block's local gradient, before the all-reduce
    ALL_REDUCE = "all_reduce"  # only in the gradient after the all-reduce


class Where(enum.Enum):
    """Whether this rank produced the value (before the all-reduce) or received it through the all-reduce."""

    LOCAL = "local"
    RECEIVED = "received"


@dataclass(frozen=True)
class Origin:
    """A step's origin: the block (``all_reduce`` when received) and the stage it was seen at."""

    block: str
    stage: Stage

    @property
    def where(self) -> Where:
        return Where.RECEIVED if self.stage is Stage.ALL_REDUCE else Where.LOCAL


@dataclass(frozen=True)
class BlockOrder:
    """The blocks of one step's peaks: ``forward`` in forward order, ``gradients`` in the order backward
    reached them (one entry per parameter, named by its block); ``complete`` is False while a block or
    parameter goes unmeasured (its hook raised and was turned off), or local gradients are not measured."""

    forward: tuple[str, ...] = ()
    gradients: tuple[str, ...] = ()
    complete: bool = True


def _bad(value: float | None) -> bool:
    """Whether ``value`` is NaN, infinite or above :data:`OVERFLOW_BOUND` in magnitude."""
    return value is not None and not abs(value) <= OVERFLOW_BOUND


def locate(read: Mapping[str, Any], order: BlockOrder) -> Origin | None:
    """The origin among a step's read values (``block_peak``, ``grad_peak``, ``loss``, ``grad_norm``), or None
    when nothing bad reached the loss or the gradient norm."""
    loss, norm = read.get("loss"), read.get("grad_norm")
    if (loss is not None or norm is not None) and not (_bad(loss) or _bad(norm)):
        return None  # nothing reached training: a bad value the forward absorbed is no finding
    first = _first_bad(read.get("block_peak"), order.forward)
    if first is not None:
        return Origin(first, Stage.OUTPUT)
    if _bad(loss):
        return Origin(HEAD_OR_LOSS, Stage.AFTER_BLOCKS)
    first = _first_bad(read.get("grad_peak"), order.gradients)
    if first is not None:
        return Origin(first, Stage.GRADIENT)
    if _bad(norm) and order.complete:  # incomplete: this rank may have made it unseen
        return Origin("all_reduce", Stage.ALL_REDUCE)
    return None


def _first_bad(peaks: Any, blocks: tuple[str, ...]) -> str | None:
    """The block of the first bad value among ``peaks`` (one per entry of ``blocks``), or None."""
    if peaks is None:
        return None
    for block, peak in zip(blocks, peaks if isinstance(peaks, list) else [peaks]):
        if _bad(peak):
            return block
    return None


class Provenance:
    """Hooks measuring the sums of the outputs of ``blocks`` (module names, labelled by ``label``) and of the
    gradients of ``parameters`` (name, parameter), each gradient named by the block holding it."""

    def __init__(
        self,
        torch: Any,
        modules: Mapping[str, Any],
        blocks: Iterable[str],
        parameters: Iterable[tuple[str, Any]],
        label: Any,
        store: MetricStore | None = None,
    ) -> None:
        self._torch = torch
        self._store = store
        self._off: set[object] = set()  # blocks and parameters (by id) whose hook raised: no longer measured
        self._block_peaks: dict[str, Any] = {}  # block -> device sum, in forward order
        self._grad_peaks: dict[int, tuple[str, Any]] = {}  # parameter id -> (block, device sum), backward order
        names = list(blocks)
        parameters = [(name, parameter) for name, parameter in parameters if parameter.requires_grad]
        self._gradients = bool(parameters)  # without them, a bad gradient norm cannot be said to be received
        self._handles = [modules[name].register_forward_hook(self._output_hook(label(name))) for name in names]
        labels = [label(name) for name in names]
        for name, parameter in parameters:
            self._handles.append(
                parameter.register_post_accumulate_grad_hook(self._gradient_hook(_owner(label(name), labels)))
            )

    def take(self) -> tuple[list[tuple[str, Any, int]], BlockOrder]:
        """This step's peaks (name, device tensor, length) and their blocks; clears them."""
        out: list[tuple[str, Any, int]] = []
        order = BlockOrder(
            tuple(self._block_peaks),
            tuple(block for block, _ in self._grad_peaks.values()),
            complete=self._gradients and not self._off,
        )
        if self._block_peaks:
            out.append(("block_peak", self._magnitudes(list(self._block_peaks.values())), len(self._block_peaks)))
        if self._grad_peaks:
            out.append(
                (
                    "grad_peak",
                    self._magnitudes([total for _, total in self._grad_peaks.values()]),
                    len(self._grad_peaks),
                )
            )
        self._block_peaks, self._grad_peaks = {}, {}
        return out, order

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _magnitudes(self, sums: list[Any]) -> Any:
        """The magnitudes of the sums, as one float32 device tensor (NaN stays NaN)."""
        return self._torch.stack(sums).abs()

    def _output_hook(self, block: str) -> Any:
        torch = self._torch

        def hook(module: Any, inputs: tuple, output: Any) -> None:
            if block in self._block_peaks or block in self._off:  # the step's first call (checkpointing recomputes)
                return
            try:
                tensor = output[0] if isinstance(output, (tuple, list)) else output
                if isinstance(tensor, torch.Tensor) and tensor.is_floating_point():
                    with torch.no_grad():
                        self._block_peaks[block] = torch.sum(tensor.detach(), dtype=torch.float32)
            except Exception as error:  # never break the forward pass: this block goes unmeasured
                self._turn_off(block, error)

        return hook

    def _gradient_hook(self, block: str) -> Any:
        def hook(parameter: Any) -> None:
            if id(parameter) in self._off:
                return
            try:
                grad = parameter.grad  # with accumulation, the last micro-batch's sum counts
                if grad is not None:
                    with self._torch.no_grad():
                        if grad.is_sparse:  # its stored values: the zeros it leaves out are never bad
                            grad = grad.coalesce().values()
                        if grad.is_complex():  # a complex sum would not stack with the real ones
                            raise TypeError(f"complex gradient ({grad.dtype}) not measured")
                        self._grad_peaks[id(parameter)] = (
                            block,
                            self._torch.sum(grad.detach(), dtype=self._torch.float32),
                        )
            except Exception as error:  # never break backward
                self._turn_off(id(parameter), error)

        return hook

    def _turn_off(self, key: object, error: Exception) -> None:
        """A hook raised: counted (a warning the first time), and that block or parameter no longer measured."""
        self._off.add(key)
        if self._store is not None:
            self._store.record_error("provenance", error)


def _owner(parameter: str, blocks: list[str]) -> str:
    """The block holding ``parameter``, else the module holding it (the parameter itself at the top)."""
    holders = [block for block in blocks if parameter.startswith(block + ".")]
    if holders:
        return max(holders, key=len)
    return parameter.rsplit(".", 1)[0] if "." in parameter else parameter
