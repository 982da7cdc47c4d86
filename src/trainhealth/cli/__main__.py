"""``python -m trainhealth.cli``."""

import sys

from trainhealth.cli.main import main

sys.exit(main())
