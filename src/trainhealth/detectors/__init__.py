"""Streaming detectors and analyses over exported signals."""

from trainhealth.detectors.hangs import HangSuspect, RankCommState, find_hangs, states_from_samples

__all__ = ["HangSuspect", "RankCommState", "find_hangs", "states_from_samples"]
