"""Root-cause localization: which GPU, link or imbalance makes steps irregular.

``trainhealth.localize.localizer.localize`` over trace records; the ``analyze``
service over Prometheus or trace files (``trainhealth.localize.analyzer``).
"""
