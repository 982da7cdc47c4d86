"""Evaluation harnesses: the Numenta Anomaly Benchmark and labelled training signals."""
