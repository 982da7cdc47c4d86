"""Faults injected into real runs: the demo's schedule, the simulated GPU's faults and bit flips (used by ``trainhealth demo`` and ``selftest``)."""
