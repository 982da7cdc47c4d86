"""Slow paths from transfer times: which communicator got slower, and the one rank its slow groups share.

The last member to arrive at a collective did not wait, so the shortest member
duration is the transfer time. Per communicator and step the transfer seconds
are compared with the communicator's own other steps (a link that slowed down
mid-run) and, when several communicators do the same kind of work, with theirs
(a link slow from the start). The rank that every slow communicator contains and
no healthy one does is the one whose link (NIC, cable, switch port) is slow.
When every collective spans every rank, as in pure data parallelism, timings
cannot say which link: the finding names the communicator, and a pairwise probe
(``trainhealth probe``) confirms the rank.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd

from trainhealth._internal.localize.stretches_scan import step_noise, strongest_shift
from trainhealth._internal.localize.timings import Message
from trainhealth._internal.localize.waits import Measured

__all__ = ["LinkSettings", "SlowPath", "find_slow_paths"]

#: messages named for a slow link: those of its first slow communicators
_MAX_MESSAGES = 3


@dataclass(frozen=True)
class LinkSettings:
    z: float = 6.0
    min_effect: float = math.log(1.25)  # transfers 25% slower: below that a busy network is not paged on
    min_length: int = 3
    noise_floor: float = 0.01
    class_effect: float = math.log(1.5)  # a communicator slower than its kind's others from the start
    class_z: float = 4.0
    min_step_share: float = 0.05  # a slow path adds at least 5% to the step: tiny transfers jitter by multiples


@dataclass(frozen=True)
class SlowPath:
    """A slow link or communicator, as measured (:func:`.wording.slow_path_sentence` says it in words)."""

    ranks: tuple[int, ...]  # one rank: its link; several: a communicator's members
    component: str  # nic:rank-N, or group:NAME
    z: float
    effect: float  # log(transfer time / usual)
    since: int | None  # trace step of the onset; None for slow throughout
    groups: tuple[str, ...]  # the slow communicators
    messages: tuple[Message, ...] = ()  # what the slow communicators' collectives most often carry, each once


def find_slow_paths(measured: Measured, settings: LinkSettings) -> tuple[list[SlowPath], float]:
    """Slow communicators, and the ranks whose links explain them; with the per-step noise."""
    table = measured.transfer
    if table.empty:
        return [], settings.noise_floor
    wide = table.pivot(index="group", columns="step", values="seconds").reindex(columns=measured.steps)
    names = wide.index.to_numpy().astype(str)
    members = {name: _members(measured, name) for name in names}
    with np.errstate(divide="ignore"):
        logs = np.log(wide.to_numpy(dtype=np.float64))
    logs[~np.isfinite(logs)] = np.nan
    with np.errstate(all="ignore"):
        centred = logs - np.nanmedian(logs, axis=1, keepdims=True)
    sigma = step_noise(centred, settings.noise_floor)
    shift = strongest_shift(centred, sigma, settings.min_length, allowance=np.inf)
    slow: dict[str, tuple[float, float, int | None]] = {}  # group -> (z, effect, onset)
    measured_columns = np.isfinite(logs)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a communicator or step without a measurement
        usual = np.exp(np.nanmedian(logs, axis=1))
        step_seconds = float(np.nanmedian(measured.step_time))
    # seconds a slow path must add per step: a 0.2 ms transfer that takes 1 ms under a busy scheduler is 5x
    # slower and drags nobody
    matters = settings.min_step_share * step_seconds if np.isfinite(step_seconds) else 0.0
    for row, name in enumerate(names):
        finite = np.flatnonzero(measured_columns[row])
        if (
            len(finite)
            and shift.stop[row] > finite[-1]
            and shift.start[row] > finite[0]
            and shift.effect[row] >= settings.min_effect
            and shift.z[row] >= settings.z
            and usual[row] * math.expm1(shift.effect[row]) >= matters
        ):
            slow[name] = (float(shift.z[row]), float(shift.effect[row]), int(measured.steps[shift.start[row]]))
    for name, z, effect, extra in _slower_than_their_kind(names, logs, members, settings):
        if extra >= matters:
            slow.setdefault(name, (z, effect, None))
    if not slow:
        return [], sigma
    return _explain(slow, members, names, measured.messages), sigma


def _members(measured: Measured, name: str) -> tuple[int, ...]:
    return measured.members.get(name, ())


def _slower_than_their_kind(
    names: np.ndarray, logs: np.ndarray, members: dict[str, tuple[int, ...]], settings: LinkSettings
) -> list[tuple[str, float, float, float]]:
    """Communicators whose usual transfer time is far above that of the others of their kind and size: name,
    z, effect and the seconds per step above the kind's usual."""
    with np.errstate(all="ignore"):
        usual = np.nanmedian(logs, axis=1)
    kind = pd.Series([f"{_kind(name)}/{len(members[name])}" for name in names])
    out = []
    for _, positions in kind.groupby(kind).groups.items():
        positions = np.asarray(positions)
        if len(positions) < 3:
            continue  # two alike cannot say which of them is the slow one
        values = usual[positions]
        centre = float(np.nanmedian(values))
        spread = max(1.4826 * float(np.nanmedian(np.abs(values - centre))), settings.noise_floor)
        for position, value in zip(positions, values):
            effect = value - centre
            if effect >= settings.class_effect and effect / spread >= settings.class_z:
                out.append((str(names[position]), effect / spread, effect, math.exp(value) - math.exp(centre)))
    return out


def _kind(name: str) -> str:
    if "->" in name:
        return "p2p"
    head = name.split(":", 1)[0]
    return "".join(ch for ch in head if ch.isalpha())[:4] or "group"


def _explain(
    slow: dict[str, tuple[float, float, int | None]],
    members: dict[str, tuple[int, ...]],
    names: np.ndarray,
    messages: dict[str, Message],
) -> list[SlowPath]:
    """The one rank in every slow communicator (or, of several, the one in no healthy communicator); else the
    slow communicators themselves."""
    slow_sets = [set(members[name]) for name in slow if members[name]]
    shared = set.intersection(*slow_sets) if slow_sets else set()
    if len(shared) > 1:  # several ranks in every slow communicator: those in no healthy one
        shared -= set().union(*(set(members[name]) for name in names if name not in slow))
    z = max(v[0] for v in slow.values())
    effect = float(np.median([v[1] for v in slow.values()]))
    onsets = [v[2] for v in slow.values() if v[2] is not None]
    since = min(onsets) if onsets else None
    groups = tuple(sorted(slow))
    if len(shared) == 1:
        rank = shared.pop()
        carried = tuple(dict.fromkeys(messages[name] for name in groups if name in messages))
        return [SlowPath((rank,), f"nic:rank-{rank}", z, effect, since, groups, carried[:_MAX_MESSAGES])]
    out = []
    for name in groups:
        z_group, effect_group, onset = slow[name]
        carried = (messages[name],) if name in messages else ()
        out.append(SlowPath(members[name], f"group:{name}", z_group, effect_group, onset, (name,), carried))
    return out
