"""torchtitan's metric logger, feeding the Monitor (docs/integrations.md).

>>> from trainhealth.integrations.torchtitan import TORCHTITAN_KEYS
>>> TORCHTITAN_KEYS["loss"]
('loss_metrics/global_avg_loss', 'loss')
"""

from trainhealth._internal.integrations.torchtitan import TORCHTITAN_KEYS, TrainhealthLogger

__all__ = ["TORCHTITAN_KEYS", "TrainhealthLogger"]
