"""``python -m fedhier.cli ARGS``: the ``fedhier`` command (e.g. under an interpreter without the console script)."""

import sys

from . import main

sys.exit(main())
