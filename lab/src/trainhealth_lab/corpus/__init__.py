"""A labelled corpus of real training signals (loss, gradient norm, learning rate, step time) from small
models trained on CPU, with instabilities caused in the runs, to judge the training-signal detectors."""

from trainhealth_lab.corpus.store import CorpusError, CorpusRun, load_corpus

__all__ = ["CorpusError", "CorpusRun", "load_corpus"]
