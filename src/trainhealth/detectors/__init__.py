"""Streaming detectors over exported signals, one per file, one API (:mod:`trainhealth.detectors.base`)."""
