"""``python -m trainhealth``."""

import sys

from trainhealth._internal.cli.main import main

sys.exit(main())
