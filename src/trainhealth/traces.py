"""Trace format v1 (docs/trace-format.md): read, write and validate per-operation records.

>>> import tempfile, pandas as pd
>>> from trainhealth.traces import read_trace, write_trace
>>> records = pd.DataFrame({"rank": [0, 1], "step": [3, 3], "op": ["forward", "forward"],
...                         "start": [10.0, 10.1], "duration": [0.020, 0.031]})
>>> folder = tempfile.mkdtemp()
>>> write_trace(records, f"{folder}/rank.jsonl")
>>> trace = read_trace([folder])
>>> trace.records[["rank", "duration"]].to_dict("list"), trace.topology
({'rank': [0, 1], 'duration': [0.02, 0.031]}, None)
>>> write_trace(records.assign(duration=[-1.0, 0.0]), f"{folder}/bad.jsonl")
Traceback (most recent call last):
...
trainhealth._internal.traces.ops.TraceError: .../bad.jsonl: row 1, column 'duration': negative value -1
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING

from trainhealth._internal._extras import lazy_attributes as _lazy_attributes

if _TYPE_CHECKING:
    from trainhealth._internal.traces.format import validate
    from trainhealth._internal.traces.io import Trace, read_trace, read_trace_file, write_trace
    from trainhealth._internal.traces.ops import TraceError
    from trainhealth._internal.traces.topology import Topology

__all__ = ["Topology", "Trace", "TraceError", "read_trace", "read_trace_file", "validate", "write_trace"]

#: Each name's home; they load on first use, so a missing 'analysis' extra is one line naming the pip install.
_HOME = {
    "Topology": "traces.topology",
    "Trace": "traces.io",
    "TraceError": "traces.ops",
    "read_trace": "traces.io",
    "read_trace_file": "traces.io",
    "validate": "traces.format",
    "write_trace": "traces.io",
}

__getattr__ = _lazy_attributes(
    __name__, {name: f"trainhealth._internal.{home}" for name, home in _HOME.items()}, "analysis"
)
