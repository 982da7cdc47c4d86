"""Silent data corruption: cross-replica fingerprints, peer gradient norms, NaN provenance, self-test."""
