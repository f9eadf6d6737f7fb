"""``python -m shuffledp.cli``: the ``shuffledp`` command."""

import sys

from shuffledp.cli import console_main

sys.exit(console_main())
