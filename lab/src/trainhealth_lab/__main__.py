"""``python -m trainhealth_lab``: the same as the ``trainhealth-lab`` command."""

import sys

from trainhealth_lab.cli import main

sys.exit(main())
