"""The hang lab: real gloo jobs that hang (or pause and recover), judged through Prometheus and Alertmanager.

Evidence, never imported by production modules. One case: :func:`~trainhealth_lab.hangs.harness.run_hang_case`;
the rank process: :mod:`trainhealth_lab.hangs.rank`; the figures: ``benchmarks/hangs.py``.
"""
