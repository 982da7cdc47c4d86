"""Evidence, never imported by production modules: real network faults and real-run fault labs."""

__all__: list[str] = []
