"""The sentences a suspect's or event's ``evidence`` says: what was measured, in words, worded once here.

The measuring modules hand over numbers (:mod:`.gpus` and :mod:`.paths` on the
recorded path's :class:`~.timings.Timings`, :mod:`.stragglers` and :mod:`.links`
on the measured path); the same fact reads the same whichever found it: a
stretch of steps, an event that came and went, a recurrent fault, the size and
operation of the messages a slow link carried.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import numpy as np

from trainhealth._internal.localize.links import SlowPath
from trainhealth._internal.localize.stragglers import Straggler
from trainhealth._internal.localize.timings import P2P, Message

__all__ = [
    "Basis",
    "event_note",
    "explained_path_note",
    "gpu_sentence",
    "host_sentence",
    "message_text",
    "messages_text",
    "network_wide_note",
    "nic_sentence",
    "probe_sentence",
    "ranks_text",
    "recurrent_gpu_sentence",
    "recurrent_nic_sentence",
    "since_text",
    "size_text",
    "slow_path_sentence",
    "steps_text",
    "straggler_sentence",
    "switch_sentence",
]

#: what a GPU's slowness is measured against: its own usual (an onset in the history), its peers all window,
#: its peers' compute in a stretch, or its peers' time outside collectives (compute derived from collectives)
Basis = Literal["own", "peers", "compute", "derived"]

#: a message's operation in the plural where it is not the operation's name with dashes and an s
_PLURALS = {P2P: "sends and receives", "send": "sends", "recv": "receives", "all_to_all": "all-to-alls"}


def steps_text(steps: np.ndarray, start: int, stop: int) -> str:
    """Steps ``start``-``stop`` (indices into ``steps``, ``stop`` excluded) in words.

    >>> steps_text(np.arange(10, 20), 2, 10), steps_text(np.arange(10, 20), 0, 10)
    ('in steps 12-19', 'throughout the window')
    """
    if start <= 0 and stop >= len(steps):
        return _since_step(None)
    return _in_steps(int(steps[start]), int(steps[stop - 1]))


def since_text(steps: np.ndarray, start: int) -> str:
    """ "since step N", or where steps before N were not read (the history begins after the run's first steps),
    "since a step between M and N".

    >>> since_text(np.array([3, 4, 5]), 1), since_text(np.array([3, 9]), 1)
    ('since step 4', 'since a step between 3 and 9 (the steps between were not read)')
    """
    if start > 0 and steps[start] - steps[start - 1] > 1:
        return f"since a step between {steps[start - 1]} and {steps[start]} (the steps between were not read)"
    return _since_step(int(steps[start]))


def ranks_text(ranks: np.ndarray | Sequence[int]) -> str:
    """Up to eight ranks, and how many there are beyond them.

    >>> ranks_text(np.arange(3)), ranks_text(np.arange(10))
    ('0, 1, 2', '0, 1, 2, 3, 4, 5, 6, 7, ... (10 ranks)')
    """
    shown = ", ".join(str(int(r)) for r in ranks[:8])
    return shown + (f", ... ({len(ranks)} ranks)" if len(ranks) > 8 else "")


def event_note(shape: str, others: str, thing: str) -> str:
    """What an event's sentence adds, why it pages nobody (nothing for a fault): ``others`` are the members of
    the run it is compared with (``GPUs``, ``NICs``, ``ranks``), ``thing`` what it does not blame.

    >>> event_note("transient", "GPUs", "device")
    '; it came and went: an event, not a faulty device'
    """
    if shape == "transient":
        return f"; it came and went: an event, not a faulty {thing}"
    if shape == "ordinary":
        return f"; other {others} of this run went as far for as long: an event, not a faulty {thing}"
    return ""


def size_text(nbytes: int) -> str:
    """A message size in binary units, to three figures.

    >>> size_text(1 << 28), size_text(3 << 19), size_text(100_000), size_text(12)
    ('256 MiB', '1.5 MiB', '97.7 KiB', '12 B')
    """
    for unit, power in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << power:
            value = nbytes / (1 << power)
            digits = 0 if value >= 100 else 1 if value >= 10 else 2
            return f"{value:.{digits}f}".rstrip("0").rstrip(".") + f" {unit}"
    return f"{nbytes} B"


def message_text(message: Message) -> str:
    """A message in words, plural: its size where the trace has it, and its operation.

    >>> message_text(Message("all_reduce", 1 << 26)), message_text(Message("p2p", None))
    ('64 MiB all-reduces', 'sends and receives')
    """
    op = _PLURALS.get(message.op, message.op.replace("_", "-") + "s")
    return op if message.nbytes is None else f"{size_text(message.nbytes)} {op}"


def messages_text(messages: Sequence[Message]) -> str:
    """Messages in words, joined; empty where none has a size (the trace does not record it).

    >>> messages_text([Message("all_reduce", 1 << 20), Message("send", 4096)])
    '1 MiB all-reduces and 4 KiB sends'
    """
    if not any(m.nbytes is not None for m in messages):
        return ""
    words = [message_text(m) for m in messages]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def gpu_sentence(
    steps: np.ndarray,
    last_share: float,
    basis: Basis,
    derived: bool,
    start: int,
    stop: int,
    effect: float,
    z: float,
    shape: str = "persistent",
) -> str:
    """A GPU slow in steps ``start``-``stop`` (indices into ``steps``) by ``effect`` (a log-ratio) against
    ``basis``; ``derived``: its compute is the time outside collectives."""
    factor = math.exp(effect)
    if basis == "own":
        head = (
            f"{'spends' if derived else 'computes'} {factor:.2f}x as long "
            f"{'outside collectives (computing) ' if derived else ''}as its own usual {since_text(steps, start)}, "
            f"through the window judged"
        )
    elif basis == "peers":
        head = (
            f"computes {factor:.2f}x as long as its data-parallel peers {steps_text(steps, start, stop)}, "
            f"beyond what its replica shares"
        )
    elif basis == "compute":
        head = f"computes {factor:.2f}x as long as its data-parallel peers {steps_text(steps, start, stop)}"
    else:
        head = f"spends {factor:.2f}x as long outside collectives (computing) as its peers {steps_text(steps, start, stop)}"
    text = (
        f"{head} (z={z:.1f}); its collectives look normal while its peers wait for it "
        f"(last to arrive in {last_share:.0%} of them)"
    )
    return text + event_note(shape, "GPUs", "device")


def recurrent_gpu_sentence(steps: np.ndarray, episodes: Sequence[tuple[int, int]], effect: float, z: float) -> str:
    """A GPU slow in episode after episode (``episodes``: index ranges into ``steps``, ``stop`` excluded)."""
    return (
        f"computes {math.exp(effect):.2f}x as long as usual {_episodes(steps, episodes)}; z={z:.1f}), "
        f"{_recurrent('GPU')}"
    )


def nic_sentence(effect: float, when: str, z: float, sizes: Sequence[tuple[Message, float]] = ()) -> str:
    """A NIC whose inter-host transfers are slow ``when`` (:func:`steps_text`); ``sizes``: the most common
    messages among them and each one's slowdown."""
    return (
        f"{_transfers_slow('through its NIC', effect, when, z, sizes)}; every member of those collectives is "
        f"slow, the last to arrive too"
    )


def recurrent_nic_sentence(
    steps: np.ndarray,
    episodes: Sequence[tuple[int, int]],
    effect: float,
    z: float,
    sizes: Sequence[tuple[Message, float]] = (),
) -> str:
    """A NIC slow in episode after episode (``episodes``: index ranges into ``steps``, ``stop`` excluded)."""
    return (
        f"inter-host transfers through its NIC take {math.exp(effect):.2f}x their usual time "
        f"{_episodes(steps, episodes)}; z={z:.1f}{_sizes(sizes)}), {_recurrent('NIC')}"
    )


def host_sentence(label: str, effect: float, when: str, z: float, sizes: Sequence[tuple[Message, float]] = ()) -> str:
    """A host whose every GPU's inter-host transfers are slow ``when``."""
    return (
        f"{_transfers_slow(f'of every GPU on {label}', effect, when, z, sizes)}: the host's network path, not one NIC"
    )


def switch_sentence(
    label: str, hosts: int, effect: float, when: str, z: float, sizes: Sequence[tuple[Message, float]] = ()
) -> str:
    """A leaf switch whose ``hosts`` hosts' inter-host transfers are all slow ``when``."""
    whose = f"of all {hosts} hosts under {label}"
    return f"{_transfers_slow(whose, effect, when, z, sizes)}: the switch, not one host or NIC"


def network_wide_note(effect: float, when: str) -> str:
    """Every NIC slow alike and no switch behind it: no component to name."""
    return (
        f"all inter-host transfers were {math.exp(effect):.2f}x slower {when}: "
        f"network-wide, no single NIC, host or known switch stands out"
    )


def straggler_sentence(straggler: Straggler, last_step: int) -> str:
    """A rank its peers waited for (the measured path); ``last_step``: the window's last (trace) step."""
    steps = straggler.steps
    ongoing, within = _since_step(steps[0]), _in_steps(steps[0], steps[-1])
    where = {
        "persistent": ongoing,
        "transient": within,
        "ordinary": ongoing if steps[-1] == last_step else within,
        "throughout": _since_step(None),
        "intermittent": f"in {len(steps)} separate steps ({_first_eight(steps)})",
    }[straggler.shape]
    text = (
        f"rank {straggler.rank} computes {math.exp(straggler.effect):.2f}x as long as its peers {where} "
        f"(z={straggler.z:.1f}); it was the slowest of its peers in {straggler.slowest_share:.0%} of those steps "
        f"and arrived last at their collectives, where they waited {1e3 * straggler.others_waited:.1f} ms per "
        f"step for it"
    )
    return text + event_note(straggler.shape, "ranks", "device")


def slow_path_sentence(path: SlowPath) -> str:
    """A slow communicator's transfers (the measured path): the one rank its slow groups share, else the
    communicator itself."""
    when = _since_step(path.since)
    factor = math.exp(path.effect)
    carried = messages_text(path.messages)
    if path.component.startswith("nic:"):
        rank = path.ranks[0]
        shown = ", ".join(path.groups[:4]) + (", ..." if len(path.groups) > 4 else "")
        return (
            f"transfers take {factor:.2f}x their usual time {when} in {shown}{f' ({carried})' if carried else ''}, "
            f"and rank {rank} is the one member they all share: even the last member to arrive waits in them, so "
            f"the path through rank {rank}'s link is slow"
        )
    return (
        f"transfers in {path.groups[0]} (ranks {', '.join(map(str, path.ranks[:8]))}{f'; {carried}' if carried else ''}) "
        f"take {factor:.2f}x their usual time {when}, the last member to arrive too: its network path is slow, and "
        f"every collective spans the same ranks, so timings cannot say which link; run `trainhealth probe` to name it"
    )


def explained_path_note(component: str, effect: float, ranks: Sequence[int]) -> str:
    """A slow path whose slowness a straggler in it explains (its communication threads run late too)."""
    culprit = ", ".join(f"rank {r}" for r in sorted(ranks))
    return (
        f"the transfers of {component} slowed {math.exp(effect):.2f}x too: explained by the straggler in it ({culprit})"
    )


def probe_sentence(finding: str) -> str:
    """The pairwise probe's finding, confirming a slow link."""
    return f"the pairwise probe confirms it: {finding}"


def _transfers_slow(whose: str, effect: float, when: str, z: float, sizes: Sequence[tuple[Message, float]]) -> str:
    return (
        f"inter-host transfers {whose} take {math.exp(effect):.2f}x their usual time {when} (z={z:.1f}{_sizes(sizes)})"
    )


def _sizes(sizes: Sequence[tuple[Message, float]]) -> str:
    """ "; 1.31x on 256 MiB all-reduces, 1.28x on 4 MiB sends and receives" where the trace records sizes.

    >>> _sizes([(Message("all_reduce", 1 << 28), 1.306), (Message("p2p", 1 << 22), 1.28)])
    '; 1.31x on 256 MiB all-reduces, 1.28x on 4 MiB sends and receives'
    """
    if not any(message.nbytes is not None for message, _ in sizes):
        return ""
    return "; " + ", ".join(f"{factor:.2f}x on {message_text(message)}" for message, factor in sizes)


def _since_step(step: int | None) -> str:
    """From a (trace) step on to the window's end; None: the whole window."""
    return "throughout the window" if step is None else f"since step {step}"


def _in_steps(first: int, last: int) -> str:
    return f"in steps {first}-{last}"


def _first_eight(values: Sequence[int]) -> str:
    return ", ".join(map(str, values[:8])) + (", ..." if len(values) > 8 else "")


def _episodes(steps: np.ndarray, episodes: Sequence[tuple[int, int]]) -> str:
    where = ", ".join(f"{steps[a]}-{steps[b - 1]}" for a, b in episodes[:6])
    return f"in {len(episodes)} separate episodes (steps {where}{', ...' if len(episodes) > 6 else ''}"


def _recurrent(member: str) -> str:
    return f"far more than episodes falling on random {member}s of this run would give one {member}: a recurrent fault"
