"""Trace format v1: the reader and writer (``io``), validation (``format``), the op vocabulary (``ops``,
without pandas or pyarrow: what the collective logger in a training pod imports), the topology sidecar,
file segments, and the importers. The public names are re-exported by :mod:`trainhealth.traces`.
"""
