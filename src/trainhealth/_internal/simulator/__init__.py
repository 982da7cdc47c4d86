"""The cluster simulator behind ``trainhealth sim``: collective traces of a cluster with injected faults and their ground truth."""
