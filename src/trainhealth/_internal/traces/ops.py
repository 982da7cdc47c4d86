"""The operations a trace row may name, and the error a bad trace raises: no pandas, so the collective
logger in a training pod and the command line import them without the analysis extra."""

from __future__ import annotations

__all__ = ["COMMUNICATION_OPS", "COMPUTATION_OPS", "MARKER_OPS", "OPS", "TraceError"]

COMMUNICATION_OPS = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "broadcast",
    "reduce",
    "barrier",
    "send",
    "recv",
)
COMPUTATION_OPS = ("forward", "backward", "optimizer", "compute")
#: Rows that mark time rather than do work: ``step`` spans one training step of the rank (optional; traces
#: without markers stay valid).
MARKER_OPS = ("step",)
OPS = COMMUNICATION_OPS + COMPUTATION_OPS + MARKER_OPS


class TraceError(ValueError):
    """Invalid trace input; the message names the file, and the row and column where there is one."""

    def __init__(
        self, path: str, problem: str, *, row: int | None = None, column: str | None = None, line: int | None = None
    ) -> None:
        self.path, self.row, self.column, self.problem = path, row, column, problem
        where = [str(path)]
        if row is not None:
            where.append(f"row {row}" + (f" (line {line})" if line is not None else ""))
        if column is not None:
            where.append(f"column '{column}'")
        super().__init__(f"{where[0]}: {', '.join(where[1:])}{': ' if len(where) > 1 else ''}{problem}")
