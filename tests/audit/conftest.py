"""Fixtures of the audit tests: ``js_package``, the compiled JavaScript client (``js/``), for the
external audit of its randomizers. The fixture is the one of ``tests/js/conftest.py`` (loaded from
that file, so both build the package the same way, once, under its file lock)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_JS_CONFTEST = Path(__file__).resolve().parents[1] / "js" / "conftest.py"


def _build_js_package():
    spec = importlib.util.spec_from_file_location("shuffledp_tests_js_conftest", _JS_CONFTEST)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build_js_package()


@pytest.fixture(scope="session")
def js_package() -> Path:
    """The compiled JavaScript package folder (``js/``)."""
    return _build_js_package()
