"""shuffledp: differentially private statistics in the local and shuffle models.

The top-level package holds only the version, the command-line entry point and the
simulation runner; the parties live in ``shuffledp.protocol``, ``shuffledp.client``,
``shuffledp.shuffler`` and ``shuffledp.analyzer``.
"""

__version__ = "0.1.0"
