"""A rank's stand-in GPU kernels: paced sleeps inside autograd and the optimizer's step.

The model's "kernels" live inside autograd (the forward and backward of every layer) and in
the optimizer's step: on a CPU box a sleeping host thread is what a slow GPU kernel looks
like from the host, and a sleep does not take a core from the other ranks.

The kernels are *paced* (:class:`Clock`): each kernel of a step (every layer's forward
and backward, the optimizer's) ends when the nominal kernel time so far, times the work
factor (:meth:`CaseSpec.work_factor`), has passed since the step began, not counting
time blocked in this rank's own collectives. The host's own work (the torch math, autograd,
DDP, the Monitor) and late wake-ups are absorbed into the sleeps instead of adding to
them, so 8 ranks sharing 2 cores compute as evenly as 4, and a compute fault of
severity s makes the rank's compute per step s times as long. A ``cpu_share`` of each
kernel is a CPU-bound loop instead of a sleep (host-side launch overhead and
preprocessing); it is not paced, so a rank that loses its CPU to a competing process
really computes longer.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from trainhealth_lab.realrun.spec import CaseSpec

__all__ = [
    "BACKWARD_SHARE",
    "FORWARD_SHARE",
    "OPTIMIZER_SHARE",
    "Clock",
    "build_model",
    "kernel_function",
    "pace_blocks",
]

FORWARD_SHARE, BACKWARD_SHARE, OPTIMIZER_SHARE = 0.3, 0.6, 0.1


class Clock:
    """This rank's kernels, paced per step and scaled by the step's work factor (set once per step by the loop).

    The kernels of a step end when ``nominal x factor`` seconds of compute have passed since the step
    began (:meth:`begin_step`): the host's own work before a kernel is absorbed into its sleep. Time in
    :meth:`blocked` (this rank's collectives) does not count, and neither does the wall time of the
    CPU-bound share, which is measured in CPU time so that a rank that loses its core computes longer.

    With ``paced=False`` each kernel simply sleeps its time, on top of the host's work: for code whose
    collectives the lab cannot mark as :meth:`blocked` (they run inside a library's hooks, as FSDP2's do),
    where pacing would fold the wait for a slow peer into the next kernel's sleep.
    """

    def __init__(
        self, forward_s: float, backward_s: float, optimizer_s: float, cpu_share: float = 0.0, paced: bool = True
    ) -> None:
        self.base = (forward_s, backward_s, optimizer_s)
        self.cpu_share = cpu_share
        self.paced = paced
        self.factor = 1.0
        self._began = 0.0
        self._blocked = 0.0  # seconds in collectives this step
        self._owed = 0.0  # paced kernel seconds due this step so far
        self._spun = 0.0  # wall seconds of the CPU-bound share this step
        self._busy = 0.0
        self.last_kernel_end = 0.0

    @property
    def forward_s(self) -> float:
        return self.base[0] * self.factor

    @property
    def backward_s(self) -> float:
        return self.base[1] * self.factor

    @property
    def optimizer_s(self) -> float:
        return self.base[2] * self.factor

    def begin_step(self, factor: float) -> None:
        """A step begins now: its host work up to each kernel counts as kernel time."""
        self.factor = factor
        self._began = self.last_kernel_end = time.perf_counter()
        self._blocked = self._owed = self._spun = self._busy = 0.0

    def kernel(self, seconds: float) -> None:
        """One kernel of ``seconds`` (already scaled by the factor): a CPU-bound share, then a paced sleep."""
        began = time.perf_counter()
        spin = seconds * self.cpu_share
        if spin > 0:
            cpu_began = time.thread_time()
            while time.thread_time() - cpu_began < spin:
                pass
            self._spun += time.perf_counter() - began
        if self.paced:
            self._owed += seconds - spin
            elapsed = self._elapsed() - self._spun
            if self._owed > elapsed:
                time.sleep(self._owed - elapsed)
        else:
            time.sleep(seconds - spin)
        self.last_kernel_end = time.perf_counter()
        self._busy = self._elapsed() if self.paced else self._busy + self.last_kernel_end - began

    def _elapsed(self) -> float:
        return time.perf_counter() - self._began - self._blocked

    def add_blocked(self, seconds: float) -> None:
        self._blocked += max(0.0, seconds)

    @contextlib.contextmanager
    def blocked(self) -> Iterator[None]:
        """Time spent in this rank's own collective (not compute: the pacing skips it)."""
        began = time.perf_counter()
        try:
            yield
        finally:
            self.add_blocked(time.perf_counter() - began)

    def busy_s(self) -> float:
        """Seconds this step computed: from its start to its last kernel's end, less the time blocked (unpaced:
        the kernels' own seconds)."""
        return self._busy


def kernel_function(torch: Any, clock: Clock, layers: int) -> Any:
    """An identity autograd function whose forward is one layer's forward kernel and whose backward its backward."""

    class Kernel(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any) -> Any:
            clock.kernel(clock.forward_s / layers)
            return x.clone()

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            clock.kernel(clock.backward_s / layers)
            return grad

    return Kernel


def pace_blocks(torch: Any, blocks: Any, clock: Clock) -> list[Any]:
    """Forward hooks that pass each block's output (a tensor, or a tuple's first) through one layer's kernels.

    For models the lab does not build (a ``transformers`` model's decoder blocks): the hooks change no value,
    only when it is ready. Returns the hook handles.
    """
    blocks = list(blocks)
    kernel = kernel_function(torch, clock, len(blocks))

    def paced(module: Any, args: Any, output: Any) -> Any:
        if isinstance(output, tuple):
            return (kernel.apply(output[0]),) + output[1:]
        return kernel.apply(output)

    return [block.register_forward_hook(paced) for block in blocks]


def build_model(torch: Any, spec: CaseSpec, layers: int, clock: Clock) -> Any:
    """A stack of ``layers`` Linear+ReLU layers whose forward and backward each sleep like a kernel."""
    nn: Any = torch.nn
    Kernel = kernel_function(torch, clock, layers)

    class Layer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(spec.width, spec.width)

        def forward(self, x: Any) -> Any:
            return Kernel.apply(torch.relu(self.linear(x)))

    return nn.Sequential(*[Layer() for _ in range(layers)])
