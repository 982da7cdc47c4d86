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
from typing import Any

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
        from trainhealth.traces.format import TraceError

        if not isinstance(data, dict):
            raise TraceError(path, "the topology must be a JSON object")
        # keys other than these are extensions of later versions: ignored, as trace readers ignore extra columns
        groups: dict[str, tuple[int, ...]] = {}
        for name, members in dict(data.get("groups", {})).items():
            if not isinstance(members, list) or not all(isinstance(r, int) and r >= 0 for r in members):
                raise TraceError(path, f"groups.{name} must be a list of non-negative ranks", column="groups")
            groups[str(name)] = tuple(members)
        hosts: dict[int, str] = {}
        for rank, host in dict(data.get("hosts", {})).items():
            if not str(rank).isdigit() or not isinstance(host, str):
                raise TraceError(path, f"hosts must map ranks to host names, got {rank!r}: {host!r}", column="hosts")
            hosts[int(rank)] = host
        parallelism: dict[str, int] = {}
        for name, size in dict(data.get("parallelism", {})).items():
            if not isinstance(size, int) or size < 1:
                raise TraceError(path, f"parallelism.{name} must be a positive integer", column="parallelism")
            parallelism[str(name)] = size
        switches: dict[int, str] = {}
        for rank, switch in dict(data.get("switches", {})).items():
            if not str(rank).isdigit() or not isinstance(switch, str):
                raise TraceError(path, f"switches must map ranks to switch names, got {rank!r}: {switch!r}", column="switches")
            switches[int(rank)] = switch
        return cls(groups, hosts, parallelism, switches, bool(data.get("simulated", False)))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Topology:
        from trainhealth.traces.format import TraceError

        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise TraceError(str(path), "no such file") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise TraceError(str(path), f"not valid JSON: {exc}") from None
        return cls.from_dict(data, str(path))

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
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n", encoding="utf-8")
