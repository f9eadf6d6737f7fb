"""``python -m shuffledp.cli``: the ``shuffledp`` command."""

import sys

from shuffledp.cli import main

sys.exit(main())
