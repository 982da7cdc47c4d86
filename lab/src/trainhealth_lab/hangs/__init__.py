"""The hang lab: real jobs (gloo, or a CPU backend with NCCL's semantics) that hang, or pause and recover, judged
through Prometheus and Alertmanager.

Evidence, never imported by production modules. One case: :func:`~trainhealth_lab.hangs.harness.run_hang_case`;
the rank process and its behaviours: :mod:`trainhealth_lab.hangs.rank` (a Hugging Face Trainer job:
:mod:`~trainhealth_lab.hangs.hf`); the backends: :mod:`~trainhealth_lab.hangs.backends`; the faults the lab
installs from outside (a slow collective, a stalled disk): :mod:`~trainhealth_lab.hangs.faults`; the figures:
``benchmarks/hangs.py``.
"""
