"""``import trainhealth.comm``, the documented user API of the collective logger.

The code lives in :mod:`trainhealth.exporters.collectives.install`; this name is that very
module (not a copy), so ``trainhealth.comm.install()`` and everything a user patches on it
keep working.
"""

import sys

from trainhealth.exporters.collectives import install as _install

sys.modules[__name__] = _install
