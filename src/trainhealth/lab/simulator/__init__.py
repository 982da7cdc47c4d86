"""The trace-driven cluster simulator: evidence, never imported by production modules."""
