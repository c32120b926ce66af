"""``python -m fedhier ARGS``: the ``fedhier`` command (e.g. under an interpreter without the console script)."""

import sys

from .cli import main

sys.exit(main())
