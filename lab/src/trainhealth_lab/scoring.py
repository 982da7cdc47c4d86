"""The one localization scorer: an answer (verdict, suspects, events) against what a right answer is.

Every lab scores with it: the simulated tables (:mod:`trainhealth_lab.bench.localization`), the
production-noise runs (:mod:`trainhealth_lab.bench.production`) and the real-run lab
(:mod:`trainhealth_lab.realrun`). A lab says what it injected as an :class:`Expected`; the rules are here.

- **Blamed:** under a ``compute`` or ``communication`` verdict, the top suspect and every suspect
  scored :data:`BLAME_SCORE` or more. No other verdict blames anyone.
- **Top-1:** the verdict is accepted, and the top blamed suspect covers the fault. For a fault
  that came and went (transient) and with nobody blamed, the first event covers it instead: a
  transient excursion is reported as an event, not as a faulty device.
- **Top-3:** one of the first three suspects covers the fault, or with nobody blamed in a
  transient fault, one of the first three events does. The verdict is not checked.
- **False blame:** someone is blamed in a control, or a blamed suspect shares no rank with the fault.

A suspect **covers** the fault when its component is one of the expected components, or, for a
link fault, when it names the faulty rank alone and is not its GPU.

>>> fault = Expected("compute", ("compute",), components=("gpu:rank-1",), ranks=(1,))
>>> s = score(fault, "compute", [("gpu:rank-1", (1,), 0.9), ("gpu:rank-3", (3,), 0.3)])
>>> s.verdict_right, s.top1, s.top3, s.false_blame, s.blamed
(True, True, True, False, ('gpu:rank-1',))
>>> score(fault, "compute", [("gpu:rank-1", (1,), 0.9), ("gpu:rank-3", (3,), 0.6)]).false_blame
True
>>> score(fault, "communication", [("gpu:rank-1", (1,), 0.9)]).top1  # the right device, the wrong class
False
>>> control = Expected("healthy", ("healthy", "imbalance"))
>>> s = score(control, "imbalance", [])
>>> s.verdict_right, s.top1, s.false_blame
(True, None, False)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["BLAME_SCORE", "Expected", "Score", "score", "score_result"]

#: A suspect at this score or more is blamed (docs/trace-format.md, "Localization result": 0.5 is the threshold).
BLAME_SCORE = 0.5
#: The verdicts that blame a component.
BLAMING = ("compute", "communication")


@dataclass(frozen=True)
class Expected:
    """What a right answer is.

    ``verdict`` is the one expected, ``accepted`` every verdict that counts as right; ``components``
    the suspects that name the fault and ``ranks`` its ranks (both empty for a control).
    """

    verdict: str
    accepted: tuple[str, ...]
    components: tuple[str, ...] = ()
    ranks: tuple[int, ...] = ()
    link: bool = False  # a link fault: a suspect of the faulty rank alone, not its GPU, covers it
    transient: bool = False  # the fault came and went: with nobody blamed, an event may name it

    @property
    def control(self) -> bool:
        return not self.ranks

    def covers(self, component: str | None, ranks: Sequence[int]) -> bool:
        if component is not None and component in self.components:
            return True
        return (
            self.link
            and tuple(ranks) == self.ranks
            and len(self.ranks) == 1
            and (component is None or not component.startswith("gpu:"))
        )


@dataclass(frozen=True)
class Score:
    verdict: str
    top: str | None  # the top suspect's component
    blamed: tuple[str, ...]
    verdict_right: bool
    top1: bool | None  # None for a control (nothing to name)
    top3: bool | None
    false_blame: bool
    suspects: tuple[str, ...] = field(default=(), repr=False)  # every suspect's component, best first

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "top": self.top,
            "blamed": list(self.blamed),
            "verdict_right": self.verdict_right,
            "top1": self.top1,
            "top3": self.top3,
            "false_blame": self.false_blame,
        }


def score(
    expected: Expected,
    verdict: str,
    suspects: Iterable[tuple[str | None, Sequence[int], float]],
    events: Iterable[tuple[str | None, Sequence[int]]] = (),
) -> Score:
    """Score ``verdict``, ``suspects`` ((component, ranks, score), best first) and ``events``
    ((component, ranks), strongest first) against ``expected``."""
    suspects = [(component, tuple(ranks), float(value)) for component, ranks, value in suspects]
    events = [(component, tuple(ranks)) for component, ranks in events]
    blamed = (
        [(c, r) for i, (c, r, s) in enumerate(suspects) if i == 0 or s >= BLAME_SCORE] if verdict in BLAMING else []
    )
    top = suspects[0][0] if suspects else None
    verdict_right = verdict in expected.accepted
    named = [str(c) for c, _ in blamed]
    components = tuple(str(c or "") for c, _, _ in suspects)
    if expected.control:
        return Score(verdict, top, tuple(named), verdict_right, None, None, bool(blamed), components)
    by_event = not blamed and expected.transient and bool(events)
    ranked = events if by_event else [(c, r) for c, r, _ in suspects]
    top1 = verdict_right and bool(ranked) and expected.covers(*ranked[0]) and (by_event or bool(blamed))
    top3 = any(expected.covers(c, r) for c, r in ranked[:3])
    wrong = any(not set(r) & set(expected.ranks) for _, r in blamed)
    return Score(verdict, top, tuple(named), verdict_right, top1, top3, wrong, components)


def score_result(expected: Expected, result: Any) -> Score:
    """Score a :class:`~trainhealth.localize.LocalizationResult`."""
    suspects = [(s.component, tuple(s.ranks), float(s.score)) for s in result.suspects]
    events = [(e.get("component"), tuple(e.get("ranks", ()))) for e in result.details.get("events", [])]
    return score(expected, str(result.verdict), suspects, events)
