"""The real-run fault lab: real gloo ranks, real injected slowness, ground truth, scored localization.

Evidence, never imported by production modules. One case: :func:`run_case`
(:mod:`trainhealth_lab.realrun.launcher`); suites: :mod:`trainhealth_lab.realrun.cases` and
:mod:`trainhealth_lab.realrun.suite`; the command: ``trainhealth-lab run``. The names below
load on first use, so the ``trainhealth`` command does not import pandas to list its commands.
"""

from __future__ import annotations

from trainhealth._internal._extras import lazy_attributes

__all__ = [
    "CaseOutcome",
    "CaseSpec",
    "Driver",
    "LabFault",
    "LivePoll",
    "Parallelism",
    "Pattern",
    "Truth",
    "lab_fault",
    "run_case",
    "suite_cases",
]

_HOMES = {
    "CaseOutcome": "outcome",
    "LivePoll": "live",
    "run_case": "launcher",
    "suite_cases": "cases",
    "CaseSpec": "spec",
    "Driver": "spec",
    "LabFault": "spec",
    "lab_fault": "spec",
    "Parallelism": "spec",
    "Pattern": "spec",
    "Truth": "spec",
}


__getattr__ = lazy_attributes(__name__, {name: f"{__name__}.{home}" for name, home in _HOMES.items()}, "demo")
