"""trainhealth's implementation: private, free to change between releases.

The supported names are the ones docs/api.md lists, each importable from one public module
(``trainhealth``, ``trainhealth.comm``, ``trainhealth.catalog``, ``trainhealth.traces``,
``trainhealth.detectors``, ``trainhealth.localize`` and ``trainhealth.integrations.*``), which
re-export them from here.
"""
