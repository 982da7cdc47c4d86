"""trainhealth's evaluation harness, kept beside the product and never shipped in it.

``realrun``: real gloo ranks with injected faults and real network faults, scored; ``corpus``:
small models trained into real instabilities, labelled; ``bench``: the scorers behind
``benchmarks/``; ``hangs``: hung-collective runs; ``netns``: links between network namespaces.
The command is ``trainhealth-lab``. It imports trainhealth; trainhealth never imports it (an
import-linter contract holds this in CI).
"""

__all__: list[str] = []
