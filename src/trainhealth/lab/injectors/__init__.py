"""Fault injection: the trace-driven cluster simulator (and, later, injectors for real runs)."""
