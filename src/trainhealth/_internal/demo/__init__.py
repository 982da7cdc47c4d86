"""``trainhealth demo``: a real multi-rank training job on CPU that goes wrong on schedule, and the report."""
