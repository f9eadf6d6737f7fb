"""The package as users get it: built, installed from its wheel, versioned, and honest about extras.

* ``python -m build`` makes an sdist and, from that sdist, a wheel (as it does for a release),
  with exactly the build requirements ``pyproject.toml`` declares, installed apart from this
  environment. The sdist holds every module; the wheel holds every module and data file of
  every package pyproject.toml lists, and metadata that states the project's dependencies,
  extras, licence and version.
* The wheel is installed into a fresh virtual environment (``pip install --no-deps``) and
  ``shuffledp simulate`` runs from it, with the checkout nowhere on ``sys.path``: what runs is
  what the wheel holds. Its dependencies are this environment's installed packages, reached
  through a path entry of the fresh environment (not ``--system-site-packages``, and not this
  environment's site directory, whose editable install of the checkout is never loaded): the
  wheel is what is under test here, while resolving and installing numpy, cbor2 and
  cryptography into a fresh environment is tests/client/test_device_install.py's job (and
  would cost this test tens of CPU-seconds for scipy and matplotlib).
* The version names the build: setuptools-scm's ``0.1.devN+gHASH`` from git, in the wheel's
  name and metadata, in ``shuffledp --version`` and in every JSON result.
* A missing extra is named, with every other extra the command needs, and the printed
  pip line works for that copy: the clone's editable install, or the extras' requirements
  from the installed wheel's metadata (shuffledp is on no package index).
"""

from __future__ import annotations

import contextlib
import email
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
#: Each package pyproject.toml lists -> its folder in the checkout.
PACKAGE_DIRS = {
    package: ROOT / PYPROJECT["tool"]["setuptools"]["package-dir"].get(package, package.replace(".", "/"))
    for package in PYPROJECT["tool"]["setuptools"]["packages"]
}


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(OPENBLAS_NUM_THREADS="1", **extra)
    return env


def _tracked_modules() -> dict[str, set[str]]:
    """Each package's module files (``*.py``) and data files as they sit in the checkout, by package."""
    return {package: {p.name for p in folder.iterdir() if p.is_file() and (p.suffix == ".py" or p.name == "py.typed")}
            for package, folder in PACKAGE_DIRS.items()}


def _pip(*args: str) -> list[str]:
    return [sys.executable, "-m", "pip", "--disable-pip-version-check", *args]


@contextlib.contextmanager
def _once_per_session(tmp_path_factory, name: str):
    """A folder for ``name`` that one pytest process of this session fills, and the others reuse.

    Under pytest-xdist every worker has its own ``basetemp`` below one folder of the session: the
    first worker to take the lock makes ``name`` there (the body runs with ``ready`` False and
    fills the folder), the others wait on the lock and find it made (``ready`` True). Without
    xdist the folder is this process's own."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        yield tmp_path_factory.mktemp(name), False
        return
    shared = tmp_path_factory.getbasetemp().parent
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        folder, done = shared / name, shared / f"{name}.done"
        if done.exists():
            yield folder, True
            return
        if folder.exists():
            pytest.fail(f"{name}: another test process of this session failed to make it (its error says why)")
        folder.mkdir()
        yield folder, False
        done.touch()


def _copy_of_the_checkout(target: Path) -> Path:
    """The checkout's tracked files as they are in the working tree, and its git folder (setuptools-scm
    reads the version from it), copied to ``target``: building writes ``shuffledp/_version.py``,
    ``build/`` and ``*.egg-info`` into the tree it builds, which must not be the checkout."""
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, tracked.decode().split("\0")):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    shutil.copytree(ROOT / ".git", target / ".git", symlinks=True)
    return target


@pytest.fixture(scope="session")
def built(tmp_path_factory) -> dict[str, Path]:
    """The sdist and the wheel ``python -m build`` makes from a copy of the checkout (the wheel
    from the sdist), once per test session.

    The build runs as ``python -m build --no-isolation`` with the build requirements of
    pyproject.toml (and ``build`` itself) installed into a folder of their own on PYTHONPATH:
    the same backend and versions an isolated build would fetch."""
    with _once_per_session(tmp_path_factory, "package-build") as (work, ready):
        if not ready:
            tools = work / "build-requirements"
            requires = PYPROJECT["build-system"]["requires"]
            subprocess.run(_pip("install", "-q", "--no-compile", "--target", str(tools), "build", *requires),
                           check=True, capture_output=True, text=True, timeout=300)
            tree = _copy_of_the_checkout(work / "checkout")
            done = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(work / "dist"), str(tree)],
                                  capture_output=True, text=True, timeout=300, env=_clean_env(PYTHONPATH=str(tools)))
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    wheels, sdists = list((work / "dist").glob("*.whl")), list((work / "dist").glob("*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, list((work / "dist").iterdir())
    return {"wheel": wheels[0], "sdist": sdists[0], "work": work}


def _wheel_metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        return email.message_from_bytes(z.read(name))


def test_the_version_names_the_commit_it_was_built_from(built):
    version = _wheel_metadata(built["wheel"])["Version"]
    assert built["wheel"].name.startswith(f"shuffledp-{version}-") and built["sdist"].name == f"shuffledp-{version}.tar.gz"
    if (ROOT / ".git").exists():
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
        node = re.search(r"\+g([0-9a-f]{7,})", version)
        tagged = re.fullmatch(r"\d+(\.\d+)*", version)  # a build of a tagged, clean commit carries no hash
        assert tagged or (node and head.startswith(node.group(1))), f"{version} does not name commit {head}"
    else:  # an archive without git history builds as the fallback version, claiming none
        assert version == PYPROJECT["tool"]["setuptools_scm"]["fallback_version"]


def test_the_sdist_holds_every_module_and_the_project_files(built):
    with tarfile.open(built["sdist"]) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    for required in ("pyproject.toml", "README.md", "LICENSE", "PKG-INFO"):
        assert required in names, f"the sdist lacks {required}"
    for package, files in _tracked_modules().items():
        folder = PACKAGE_DIRS[package].relative_to(ROOT).as_posix()
        for name in files:
            assert f"{folder}/{name}" in names, f"the sdist lacks {folder}/{name}"


def test_the_wheel_holds_every_package_module_and_data_file(built):
    with zipfile.ZipFile(built["wheel"]) as z:
        names = set(z.namelist())
    for package, files in _tracked_modules().items():
        folder = package.replace(".", "/")
        for name in files:
            assert f"{folder}/{name}" in names, f"the wheel lacks {folder}/{name}"
    for package, patterns in PYPROJECT["tool"]["setuptools"]["package-data"].items():
        for pattern in patterns:
            sources = PACKAGE_DIRS.get(package, ROOT).glob(pattern) if package != "*" else ()
            for source in sources:
                inside = f"{package.replace('.', '/')}/{source.relative_to(PACKAGE_DIRS[package]).as_posix()}"
                assert inside in names, f"the wheel lacks the data file {inside}"
    assert "shuffledp/_version.py" in names
    assert not any(n.startswith(("tests/", "benchmarks/", "examples/", "js/")) for n in names)


def test_the_wheel_metadata_states_dependencies_extras_and_licence(built):
    from packaging.requirements import Requirement

    def key(requirement: Requirement, extra: str | None) -> tuple:
        return requirement.name, frozenset(requirement.extras), str(requirement.specifier), extra

    meta = _wheel_metadata(built["wheel"])
    project = PYPROJECT["project"]
    stated = set()
    for line in meta.get_all("Requires-Dist"):
        requirement = Requirement(line)
        extra = re.search(r'extra == "([^"]+)"', str(requirement.marker)) if requirement.marker else None
        stated.add(key(requirement, extra.group(1) if extra else None))
    declared = {key(Requirement(r), None) for r in project["dependencies"]}
    for extra, requirements in project["optional-dependencies"].items():
        assert extra in meta.get_all("Provides-Extra"), extra
        declared |= {key(Requirement(r), extra) for r in requirements}
    assert stated == declared
    assert meta["License-Expression"] == project["license"]
    assert meta["Requires-Python"] == project["requires-python"]
    assert meta["Author"] == project["authors"][0]["name"]
    assert set(meta.get_all("Classifier")) == set(project["classifiers"])


@pytest.fixture(scope="session")
def installed(built, tmp_path_factory) -> Path:
    """A fresh virtual environment with the wheel installed, once per test session (its
    dependencies: see the module docstring)."""
    with _once_per_session(tmp_path_factory, "wheel-install") as (folder, ready):
        env_dir = folder / "venv"
        if not ready:
            venv.create(env_dir, with_pip=False)
            subprocess.run(_pip("--python", str(env_dir / "bin" / "python"), "install", "-q", "--no-deps", "--no-index",
                                "--no-compile", str(built["wheel"])), check=True, capture_output=True, text=True, timeout=120)
            site = Path(subprocess.run([str(env_dir / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                       capture_output=True, text=True, check=True, env=_clean_env()).stdout.strip())
            # A plain path entry: its folder's own .pth files (this environment's editable install) are not run.
            (site / "_test_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return env_dir


def test_shuffledp_simulate_runs_from_the_installed_wheel(built, installed, tmp_path):
    version = _wheel_metadata(built["wheel"])["Version"]
    binary = installed / "bin" / "shuffledp"
    shown = subprocess.run([str(binary), "--version"], capture_output=True, text=True, cwd=tmp_path, env=_clean_env(), timeout=60)
    assert shown.returncode == 0 and shown.stdout.strip() == f"shuffledp {version}", shown.stdout + shown.stderr
    done = subprocess.run([str(binary), "simulate", "-n", "500", "--json", "--quiet"], capture_output=True, text=True,
                          cwd=tmp_path, env=_clean_env(), timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["shuffledp"]["version"] == version and result["shuffledp"]["command"] == "simulate"
    assert result["config"]["n"] == 500
    where = subprocess.run(
        [str(installed / "bin" / "python"), "-c",
         "import json, sys, shuffledp, shuffledp.protocol.wire.codec as c, shuffledp.install as e\n"
         "print(json.dumps([shuffledp.__file__, c.__file__, sys.path, str(e.source_tree())]))"],
        capture_output=True, text=True, cwd=tmp_path, env=_clean_env(), check=True)
    package, codec, path, tree = json.loads(where.stdout)
    site = str(installed)
    assert package.startswith(site) and codec.startswith(site), (package, codec)
    assert not any(p and Path(p).resolve() == ROOT for p in path), "the checkout is on sys.path"
    assert tree == "None"  # the installed copy knows it is not a clone


def test_a_missing_extra_from_the_wheel_prints_the_extras_requirements(installed, tmp_path):
    """From an installed wheel the install line lists the extras' requirements (shuffledp is on no index)."""
    program = ("import sys\n"
               "for name in ('scipy', 'aiomqtt'): sys.modules[name] = None  # as if not installed\n"
               "from shuffledp.cli import main\n"
               "sys.exit(main(['up']))\n")
    done = subprocess.run([str(installed / "bin" / "python"), "-c", program], capture_output=True, text=True,
                          cwd=tmp_path, env=_clean_env(), timeout=60)
    assert done.returncode == 2, done.stderr
    line = done.stderr.strip()
    assert "\n" not in line and "'analysis' and 'mqtt' extras" in line and "scipy, aiomqtt" in line, line
    command = line.split("install with: ", 1)[1]
    optional = PYPROJECT["project"]["optional-dependencies"]
    expected = [r.replace(" ", "") for r in optional["analysis"] + optional["mqtt"]]
    assert command == "pip install " + " ".join(f"'{r}'" for r in expected), command
    assert "shuffledp" not in command


def test_every_command_names_every_extra_it_needs(monkeypatch):
    """With no optional module installed, each command's message names all its extras and the clone's install line."""
    import importlib.util

    from shuffledp.cli import extras

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    for command, needed in extras.COMMAND_EXTRAS.items():
        if not needed:
            extras.require_extras(command)  # needs nothing: nothing to refuse
            continue
        with pytest.raises(extras.MissingExtraError) as refused:
            extras.require_extras(command)
        message = str(refused.value)
        assert refused.value.extras == needed
        for extra in needed:
            assert f"'{extra}'" in message, (command, message)
        assert message.endswith(f"install with: pip install -e '{ROOT}[{','.join(needed)}]'"), message


#: A sitecustomize that makes the modules named in SHUFFLEDP_TEST_HIDE unimportable (as if not installed).
HIDE_MODULES = ("import os, sys\n"
                "for name in filter(None, os.environ.get('SHUFFLEDP_TEST_HIDE', '').split(',')):\n"
                "    sys.modules[name] = None\n")


@pytest.mark.parametrize("script, hidden, extra", [
    ("api_docs.sh", "distributed", "docs"),   # the reference documents shuffledp.simulation.dask_engine
    ("fuzz.sh", "hypothesis", "test"),
])
def test_the_scripts_say_what_is_missing_and_how_to_install_it(tmp_path, script, hidden, extra):
    (tmp_path / "sitecustomize.py").write_text(HIDE_MODULES)
    done = subprocess.run(["bash", str(ROOT / "scripts" / script), *(["1"] if script == "fuzz.sh" else [str(tmp_path / "out")])],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env=_clean_env(PYTHON=sys.executable, PYTHONPATH=str(tmp_path), SHUFFLEDP_TEST_HIDE=hidden))
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert hidden in done.stderr and f"-m pip install -e '{ROOT}[{extra}]'" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


#: CFF 1.2.0's top-level keys (https://github.com/citation-file-format/citation-file-format, schema.json).
CFF_KEYS = {"abstract", "authors", "cff-version", "commit", "contact", "date-released", "doi", "identifiers", "keywords",
            "license", "license-url", "message", "preferred-citation", "references", "repository", "repository-artifact",
            "repository-code", "title", "type", "url", "version"}


def test_citation_cff_follows_cff_1_2():
    """The keys and shapes the CFF 1.2.0 schema requires (the schema itself is not installed here)."""
    import yaml

    citation = yaml.safe_load((ROOT / "CITATION.cff").read_text(encoding="utf-8"))
    assert citation["cff-version"] == "1.2.0"
    assert set(citation) <= CFF_KEYS, set(citation) - CFF_KEYS
    assert {"authors", "cff-version", "message", "title"} <= set(citation)
    assert citation.get("type", "software") in ("software", "dataset")
    assert all(isinstance(citation[k], str) and citation[k].strip() for k in ("message", "title"))
    assert citation["authors"] and all(isinstance(a, dict) and (a.get("name") or a.get("family-names"))
                                       for a in citation["authors"])
    assert citation["license"] == PYPROJECT["project"]["license"]
    assert [a["name"] for a in citation["authors"]] == [a["name"] for a in PYPROJECT["project"]["authors"]]


@pytest.mark.parametrize("doc", ["README.md", "docs/glossary.md", "CONTRIBUTING.md", "SECURITY.md", "docs/api/embed.md"])
def test_the_project_documents_link_to_files_that_exist(doc):
    text = (ROOT / doc).read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if not re.match(r"[a-z]+:", link)]
    assert local or doc != "README.md"
    for link in local:
        assert ((ROOT / doc).parent / link).exists(), f"{doc} links to {link}, which does not exist"
    if doc == "README.md":
        for linked in ("docs/glossary.md", "CONTRIBUTING.md", "SECURITY.md", "CITATION.cff"):
            assert linked in local, f"README.md does not link {linked}"
