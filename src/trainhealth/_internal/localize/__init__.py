"""Root-cause localization: which GPU, link or imbalance makes steps irregular.

``trainhealth._internal.localize.localizer.localize`` over trace records; the ``analyze``
service over Prometheus or trace files (``trainhealth._internal.localize.analyzer``).
"""
