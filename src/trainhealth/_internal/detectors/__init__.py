"""Streaming detectors over exported signals, one per file, one API (:mod:`trainhealth._internal.detectors.base`)."""
