"""Trace format v1 (reader, writer, validation), the topology sidecar, and importers.

The names load on first use (PEP 562): the collective logger in a training pod imports
:mod:`trainhealth.traces.ops` alone, without pandas or pyarrow.
"""

from __future__ import annotations

from trainhealth._extras import lazy_attributes

__all__ = [
    "COMMUNICATION_OPS",
    "COMPUTATION_OPS",
    "OPS",
    "Topology",
    "Trace",
    "TraceError",
    "read_trace",
    "read_trace_file",
    "validate",
    "write_trace",
]

_HOME = {
    "COMMUNICATION_OPS": "ops",
    "COMPUTATION_OPS": "ops",
    "OPS": "ops",
    "TraceError": "ops",
    "validate": "format",
    "Trace": "io",
    "read_trace": "io",
    "read_trace_file": "io",
    "write_trace": "io",
    "Topology": "topology",
}

__getattr__ = lazy_attributes(__name__, {name: f"{__name__}.{home}" for name, home in _HOME.items()}, "analysis")
