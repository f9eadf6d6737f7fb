"""shuffledp: differentially private statistics in the local and shuffle models.

The top-level package holds only the version, the command-line entry point and the
simulation runner; the parties live in ``shuffledp.protocol``, ``shuffledp.client``,
``shuffledp.shuffler`` and ``shuffledp.analyzer``.

``__version__`` names the build this code came from: setuptools-scm derives it from git when
the package is built or installed (``pyproject.toml``, ``[tool.setuptools_scm]``:
``0.1.devN+gHASH`` N commits in while there is no tag, with ``.dYYYYMMDD`` for a tree with
uncommitted changes) and writes it into ``shuffledp/_version.py`` beside this file, so every
copy reports its own build. An editable install (``pip install -e``) keeps the version of the
moment it was installed; install again to renew it. A source tree that was never built or
installed reports setuptools-scm's answer for the tree when setuptools-scm is importable, and
:data:`UNKNOWN_VERSION` otherwise.
"""

#: The version of a copy whose build is unknown: built without git history, or never built
#: (``fallback_version`` in pyproject.toml; every build from git is 0.1.devN+gHASH or later).
UNKNOWN_VERSION = "0.0"


def _build_version() -> str:
    """The version written at build time; in an unbuilt source tree, the tree's as setuptools-scm sees it."""
    try:
        from shuffledp._version import version
    except ImportError:
        pass
    else:
        return str(version)
    from pathlib import Path

    try:
        from setuptools_scm import get_version
    except ImportError:
        return UNKNOWN_VERSION
    try:
        return str(get_version(root=str(Path(__file__).resolve().parents[1]), fallback_version=UNKNOWN_VERSION))
    except Exception:  # no git, or a tree setuptools-scm cannot read: the build is unknown
        return UNKNOWN_VERSION


__version__ = _build_version()
