"""Trace format v1 (reader, writer, validation), the topology sidecar, and importers."""

from trainhealth.traces.format import COMMUNICATION_OPS, COMPUTATION_OPS, OPS, TraceError, validate
from trainhealth.traces.io import Trace, read_trace, read_trace_file, write_trace
from trainhealth.traces.topology import Topology

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
