"""Suite-wide settings.

The accountant's on-disk cache (``protocol/accounting/cache.py``) goes to a temporary
file for the test session, never to the user's ``~/.cache``: every run computes its
bounds afresh once, then shares them across the tests and the processes they start
(which inherit the environment), so no test can pass on an answer a previous run stored.
"""

from __future__ import annotations

import os
import tempfile

_CACHE_DIR = tempfile.mkdtemp(prefix="shuffledp-test-accounting-")
os.environ["SHUFFLEDP_ACCOUNTING_CACHE"] = os.path.join(_CACHE_DIR, "accounting.sqlite")
