#!/usr/bin/env bash
# Build the HTML API reference with pdoc (the `docs` extra, which brings pdoc and every extra
# the documented modules import: pip install -e ".[docs]").
#
#   scripts/api_docs.sh [--no-source] [OUTDIR]   # default OUTDIR: api-docs/ at the repository root
#
# --no-source leaves out each function's highlighted source listing, half the build's time.
#
# What it documents:
#   * the guide pages of docs/api/ (simulate, embed, audit, account), as the pages of
#     the documentation-only package docs/api/guides/, whose modules include the
#     markdown files with pdoc's `.. include::` directive;
#   * every public module (no leading underscore) of every package that pyproject.toml
#     lists under [tool.setuptools] packages, including the submodules a package's
#     `__all__` leaves off its own page (pdoc's recursion alone would skip those).
#
# The module list is given to pdoc explicitly: pdoc's own recursion would both skip
# the submodules hidden by `__all__` and, depending on what was imported first, list
# some modules twice. Nothing is excluded: every module imports with the `docs` extra
# (shuffledp.protocol.transport.mqtt_channel needs aiomqtt, shuffledp.simulation.dask_engine
# dask.distributed); without it the script names what is missing and stops (exit status 2).
#
# It fails (exit status 1) on any error and on any warning raised while the modules
# are imported and rendered: a module that cannot be imported, an include that cannot
# be read, a docstring pdoc cannot process. Exit status 2: bad usage or no pdoc.
#
# Python: $PYTHON if set, else the active virtual environment's, else the repository's
# .venv/ or .venv-test/, else python3 on the PATH.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"

show_source=True
if [ "${1:-}" = "--no-source" ]; then
  show_source=False
  shift
fi
out="${1:-$root/api-docs}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
marker=".shuffledp-api-docs"
# The output directory is emptied before each build: refuse one this script did not make.
if [ -n "$(ls -A "$out")" ] && [ ! -e "$out/$marker" ]; then
  echo "api_docs: $out is not empty and was not made by this script; choose another OUTDIR" >&2
  exit 2
fi

if [ -n "${PYTHON:-}" ]; then
  python="$PYTHON"
elif [ -n "${VIRTUAL_ENV:-}" ] && [ -x "$VIRTUAL_ENV/bin/python" ]; then
  python="$VIRTUAL_ENV/bin/python"
elif [ -x "$root/.venv/bin/python" ]; then
  python="$root/.venv/bin/python"
elif [ -x "$root/.venv-test/bin/python" ]; then
  python="$root/.venv-test/bin/python"
else
  python="python3"
fi
# The installed project (shuffledp.protocol is found only through an install) and the modules of
# the `docs` extra and of the extras it brings (shuffledp/cli/extras.py).
missing="$(cd "$root" && "$python" -c '
import importlib.util
try:
    from shuffledp.cli.extras import missing_modules
    project = importlib.util.find_spec("shuffledp.protocol") is not None
except ImportError:
    project = False
print(" ".join(([] if project else ["shuffledp"]) + (list(missing_modules(("docs", "analysis", "mqtt", "dask"))) if project else [])))')" \
  || { echo "api_docs: cannot run $python" >&2; exit 2; }
if [ -n "$missing" ]; then
  echo "api_docs: $python lacks ${missing// /, } (the reference needs the project with its 'docs' extra); install it with:" >&2
  echo "  $python -m pip install -e '$root[docs]'" >&2
  exit 2
fi

find "$out" -mindepth 1 -delete
touch "$out/$marker"
cd "$root"
exec "$python" - "$out" "$show_source" <<'PYTHON'
import ast
import importlib
import inspect
import pkgutil
import sys
import time
import tomllib
import types
import warnings
from pathlib import Path

import pdoc.doc
import pdoc.render

started = time.perf_counter()


# pdoc asks inspect for the source lines of each documented object several times, and
# inspect (before Python 3.13) finds a class by parsing its whole module, once per class
# and per call: about a sixth of the build. Within this one process the sources do not
# change, so each object's lines are found once, and inspect parses each source text once
# (its class finder only reads the tree). The pages are the same, byte for byte.
class _ParseEachSourceOnce(types.ModuleType):
    """The ast module as inspect sees it, with ``parse`` remembering its trees."""

    def __init__(self) -> None:
        super().__init__("ast")
        self._trees: dict = {}

    def __getattr__(self, name: str):
        return getattr(ast, name)

    def parse(self, source, *args, **kwargs):
        key = (source, args, tuple(sorted(kwargs.items())))
        if key not in self._trees:
            self._trees[key] = ast.parse(source, *args, **kwargs)
        return self._trees[key]


_source_lines: dict = {}
_getsourcelines = inspect.getsourcelines


def _getsourcelines_once(obj):
    """``inspect.getsourcelines(obj)``, found once per object (kept alive, so its id stays its own)."""
    if id(obj) not in _source_lines:
        _source_lines[id(obj)] = (obj, _getsourcelines(obj))
    return _source_lines[id(obj)][1]


inspect.ast = _ParseEachSourceOnce()
inspect.getsourcelines = _getsourcelines_once

out = Path(sys.argv[1])
root = Path.cwd()
guides = root / "docs" / "api"
sys.path.insert(0, str(guides))  # the documentation-only package `guides`

with open(root / "pyproject.toml", "rb") as fh:
    packages = tomllib.load(fh)["tool"]["setuptools"]["packages"]

with warnings.catch_warnings(record=True) as caught:
    names = ["guides"] + [f"guides.{m.name}" for m in pkgutil.iter_modules([str(guides / "guides")])]
    for package in packages:
        names.append(package)
        for info in pkgutil.iter_modules(importlib.import_module(package).__path__, package + "."):
            if not info.ispkg and not info.name.rpartition(".")[2].startswith("_"):
                names.append(info.name)

    # A package whose names load on first use (PEP 562 ``__getattr__``: shuffledp.protocol.accounting)
    # has each of its ``__all__`` resolved first, so pdoc finds them on the package's page.
    for package in packages:
        module = importlib.import_module(package)
        for name in getattr(module, "__all__", ()):
            getattr(module, name)

    import shuffledp

    pdoc.render.configure(
        docformat="restructuredtext",
        footer_text=f"shuffledp {shuffledp.__version__}",
        search=True,
        show_source=sys.argv[2] == "True",
    )
    modules = {name: pdoc.doc.Module.from_name(name) for name in names}
    for module in modules.values():
        page = out / f"{module.fullname.replace('.', '/')}.html"
        page.parent.mkdir(parents=True, exist_ok=True)
        page.write_text(pdoc.render.html_module(module, modules), encoding="utf-8")
    (out / "index.html").write_text(pdoc.render.html_index(modules), encoding="utf-8")
    (out / "search.js").write_text(pdoc.render.search_index(modules), encoding="utf-8")

if caught:
    for w in caught:
        print(f"api_docs: {w.category.__name__}: {w.message} ({w.filename}:{w.lineno})", file=sys.stderr)
    sys.exit(f"api_docs: FAILED with {len(caught)} warning(s)")
print(f"api_docs: {len(modules)} pages in {time.perf_counter() - started:.1f} s; open {out / 'index.html'}")
PYTHON
