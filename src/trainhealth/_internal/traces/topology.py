"""The optional topology sidecar: group members, hosts, parallelism (``topology.json``).

>>> topology = Topology.from_dict({"groups": {"dp0": [0, 4]}, "hosts": {"0": "node-a"}, "parallelism": {"dp": 2}})
>>> topology.groups["dp0"], topology.hosts[0], topology.parallelism
((0, 4), 'node-a', {'dp': 2})
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from trainhealth._internal._files import write_json

__all__ = ["TOPOLOGY_FILE", "Topology"]

TOPOLOGY_FILE = "topology.json"


@dataclass(frozen=True)
class Topology:
    groups: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    hosts: Mapping[int, str] = field(default_factory=dict)
    parallelism: Mapping[str, int] = field(default_factory=dict)
    #: Optional extensions: rank -> leaf switch (``switches``), and ``simulated`` for simulator output.
    switches: Mapping[int, str] = field(default_factory=dict)
    simulated: bool = False

    @classmethod
    def from_dict(cls, data: Any, path: str = "topology") -> Topology:
        """The topology in ``data`` (parsed JSON); :class:`~trainhealth._internal.traces.ops.TraceError` naming ``path``
        and the key when a part has the wrong type or a rank is out of range. Other keys are extensions of
        later versions: ignored, as trace readers ignore extra columns."""
        from trainhealth._internal.traces.format import MAX_RANK, TraceError, shown

        def fail(problem: str, key: str) -> TraceError:
            return TraceError(path, f"{key}{' ' if problem.startswith('must') else ': '}{problem}")

        def rank(value: Any, key: str) -> int:
            if isinstance(value, str) and value.isascii() and value.isdecimal():
                value = int(value)
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_RANK:
                raise fail(f"expected a rank from 0 to {MAX_RANK}, got {shown(value)}", key)
            return value

        def mapping(key: str) -> dict[Any, Any]:
            value = data.get(key, {})
            if not isinstance(value, dict):
                raise fail(f"expected a JSON object, got {shown(value)}", key)
            return value

        def names(key: str, what: str) -> dict[int, str]:
            found = {}
            for number, name in mapping(key).items():
                if not isinstance(name, str) or not name.strip():
                    raise fail(f"expected ranks mapped to {what} names, got {shown(number)}: {shown(name)}", key)
                found[rank(number, key)] = name
            return found

        if not isinstance(data, dict):
            raise TraceError(path, f"the topology must be a JSON object, got {shown(data)}")
        groups: dict[str, tuple[int, ...]] = {}
        for name, members in mapping("groups").items():
            if not isinstance(members, list):
                raise fail(f"expected a list of ranks, got {shown(members)}", f"groups.{name}")
            try:
                groups[str(name)] = tuple(rank(member, "") for member in members)
            except TraceError as exc:
                raise fail(
                    f"must be a list of non-negative ranks{exc.problem.removeprefix(': expected a rank')}",
                    f"groups.{name}",
                ) from None
        hosts = names("hosts", "host")
        parallelism: dict[str, int] = {}
        for name, size in mapping("parallelism").items():
            if not isinstance(size, int) or isinstance(size, bool) or not 1 <= size <= MAX_RANK + 1:
                raise fail(f"expected a positive integer, got {shown(size)}", f"parallelism.{name}")
            parallelism[str(name)] = size
        switches = names("switches", "switch")
        simulated = data.get("simulated", False)
        if not isinstance(simulated, bool):
            raise fail(f"expected true or false, got {shown(simulated)}", "simulated")
        return cls(groups, hosts, parallelism, switches, simulated)

    #: The largest topology file read (a 65,536-rank job's is a few MiB).
    MAX_BYTES: ClassVar[int] = 256 << 20

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Topology:
        from trainhealth._internal.traces.files import read_bytes
        from trainhealth._internal.traces.format import TraceError

        data = read_bytes(Path(path), max_bytes=cls.MAX_BYTES)
        try:
            parsed = json.loads(data.decode("utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise TraceError(str(path), f"not valid JSON: {exc}") from None
        except RecursionError:
            raise TraceError(str(path), "not a topology: JSON nested too deeply") from None
        return cls.from_dict(parsed, str(path))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "groups": {name: list(members) for name, members in sorted(self.groups.items())},
            "hosts": {str(rank): host for rank, host in sorted(self.hosts.items())},
            "parallelism": dict(sorted(self.parallelism.items())),
        }
        if self.switches:
            out["switches"] = {str(rank): switch for rank, switch in sorted(self.switches.items())}
        if self.simulated:
            out["simulated"] = True
        return out

    def save(self, path: str | os.PathLike[str]) -> None:
        write_json(Path(path), self.to_dict())
