"""What collects telemetry, one wing per source: ``training`` (what the loop reports), ``gpu`` (NVML, DCGM,
the simulated backend, XIDs), ``collectives`` (the collective logger); the Monitor (``exporters.monitor``)
ties the three to the sinks, with its per-step path in ``exporters.steps``, the collective-trace markers in
``exporters.markers`` and its assembly helpers in ``exporters.wiring``.
"""
