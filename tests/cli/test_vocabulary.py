"""One command-line vocabulary: an option string names one concept in every command.

Every sub-command's parser is walked (``keys init``, ``analyzer run``, ... included): each
option string maps to one ``dest`` across all of them, each concept (``dest``) is spelled the
same way everywhere, every command accepts ``--json``, and every deprecated alias warns in
one line and stores into its replacement's ``dest``. docs/cli.md tables the same vocabulary.
"""

from __future__ import annotations

import argparse
import re
from collections import defaultdict
from pathlib import Path

import pytest

from shuffledp.cli import build_parser, main
from shuffledp.cli.common import DeprecatedAlias, default_delta

ROOT = Path(__file__).resolve().parents[2]

#: Deprecated aliases whose old spelling is a current option of another command (removed next release).
ALIAS_COLLISIONS = {"-d"}  # `account -d` (delta) against `-d` = --dim in simulate and vector
#: Options local to a command whose dest legitimately repeats a shared word (none today).
SHARED_DEST_EXCEPTIONS: set[str] = set()


def leaf_parsers(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> dict[str, argparse.ArgumentParser]:
    """Every command that runs (``simulate``, ``keys init``, ...) with its parser; aliases skipped."""
    found: dict[str, argparse.ArgumentParser] = {}
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return {" ".join(prefix): parser}
    for action in subs:
        seen: set[int] = set()
        for name, child in action.choices.items():
            if id(child) in seen:  # an alias of a command already walked
                continue
            seen.add(id(child))
            found.update(leaf_parsers(child, (*prefix, name)))
    return found


COMMANDS = leaf_parsers(build_parser())


def options(parser: argparse.ArgumentParser, *, deprecated: bool) -> list[tuple[str, argparse.Action]]:
    return [(s, a) for a in parser._actions for s in a.option_strings
            if isinstance(a, DeprecatedAlias) == deprecated and s not in ("-h", "--help")]


def test_every_command_is_walked():
    assert {"simulate", "vector", "distribution", "account", "audit", "keys init", "keys enroll", "shuffler serve",
            "analyzer run", "clients run", "up"} <= set(COMMANDS)


def test_no_option_string_means_two_concepts():
    dests: dict[str, set[str]] = defaultdict(set)
    where: dict[tuple[str, str], list[str]] = defaultdict(list)
    for command, parser in COMMANDS.items():
        for option, action in options(parser, deprecated=False):
            dests[option].add(action.dest)
            where[option, action.dest].append(command)
    clashes = {o: {d: where[o, d] for d in ds} for o, ds in dests.items() if len(ds) > 1}
    assert not clashes, f"option strings with two meanings: {clashes}"


def test_each_concept_has_one_spelling():
    """The same dest is reached by the same option strings in every command (e.g. users: --users/-n)."""
    spellings: dict[str, set[tuple[str, ...]]] = defaultdict(set)
    for parser in COMMANDS.values():
        by_dest: dict[str, set[str]] = defaultdict(set)
        for option, action in options(parser, deprecated=False):
            by_dest[action.dest].add(option)
        for dest, strings in by_dest.items():
            spellings[dest].add(tuple(sorted(strings)))
    mixed = {d: s for d, s in spellings.items() if len(s) > 1 and d not in SHARED_DEST_EXCEPTIONS}
    assert not mixed, f"concepts spelled differently across commands: {mixed}"


@pytest.mark.parametrize("concept,spelling", [
    ("users", ("--users", "-n")), ("samples", ("--samples", "-m")), ("epsilon0", ("--epsilon0", "-e")),
    ("delta", ("--delta",)), ("dim", ("--dim", "-d")), ("seed", ("--seed",)), ("json", ("--json",)),
    ("central_epsilon", ("--central-epsilon",)),
])
def test_the_shared_concepts_are_spelled_as_docs_cli_md_says(concept, spelling):
    found = {tuple(a.option_strings) for p in COMMANDS.values() for a in p._actions
             if a.dest == concept and not isinstance(a, DeprecatedAlias)}
    assert found == {spelling}, found
    # and no deprecated or current option spells delta with -d
    if concept == "delta":
        current = {s for p in COMMANDS.values() for s, a in options(p, deprecated=False) if a.dest == "delta"}
        assert "-d" not in current


def test_no_two_option_strings_differ_by_case_only():
    """``-K`` beside ``-k`` is a typo away from the other concept: current options differ by more than case."""
    current: dict[str, set[str]] = defaultdict(set)
    for parser in COMMANDS.values():
        for option, _ in options(parser, deprecated=False):
            current[option.lower()].add(option)
    assert not {k: v for k, v in current.items() if len(v) > 1}


def test_the_data_distribution_is_one_option_in_every_command_simulating_data():
    for command in ("simulate", "vector", "up", "clients run"):
        action = COMMANDS[command]._option_string_actions["--distribution"]
        assert action.dest == "distribution" and action.default == "gaussian", command


#: Choice values renamed, by command and option: old value -> the value it now stands for.
RENAMED_VALUES = [("simulate", "--protocol", "mean", "scalar-mean")]


@pytest.mark.parametrize("command,option,old,new", RENAMED_VALUES)
def test_a_renamed_value_still_works_warns_once_and_is_documented(command, option, old, new, capsys):
    args = build_parser().parse_args([*command.split(), option, old])
    assert getattr(args, COMMANDS[command]._option_string_actions[option].dest) == new
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"shuffledp {command}: warning: {option} {old} is deprecated and will be removed; use {option} {new}"]
    build_parser().parse_args([*command.split(), option, new])
    assert capsys.readouterr().err == ""  # the new name is quiet
    action = COMMANDS[command]._option_string_actions[option]
    listed = action.metavar.strip("{}").split(",")
    assert old not in listed and new in listed and f"{old} (= {new})" in action.help
    assert f"`{option} {old}`" in (ROOT / "docs" / "cli.md").read_text()
    # the analyzer service names the protocol the same way
    assert new in COMMANDS["analyzer run"]._option_string_actions["--protocol"].choices


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_accepts_json(command):
    parser = COMMANDS[command]
    action = parser._option_string_actions.get("--json")
    assert action is not None and action.dest == "json" and action.nargs == 0, f"{command} has no --json flag"


def test_deprecated_aliases_collide_only_where_listed():
    current = {s: a.dest for p in COMMANDS.values() for s, a in options(p, deprecated=False)}
    for command, parser in COMMANDS.items():
        for option, action in options(parser, deprecated=True):
            if option in current and current[option] != action.dest:
                assert option in ALIAS_COLLISIONS, f"{command}: deprecated {option} means {action.dest}, elsewhere {current[option]}"


ALIASES = [(c, o, a) for c, p in COMMANDS.items() for o, a in options(p, deprecated=True)]


def test_the_deprecated_aliases_are_the_documented_ones():
    table = (ROOT / "docs" / "cli.md").read_text()
    assert {(c, o) for c, o, _ in ALIASES} >= {("account", "--n"), ("account", "-d"), ("simulate", "--epsilon"),
                                              ("keys init", "--clients"), ("keys enroll", "--count"),
                                              ("vector", "--kind"), ("account", "-K")}
    for command, option, action in ALIASES:
        assert f"`{option}`" in table, f"docs/cli.md does not name the deprecated {option} ({command})"


#: A value each alias accepts, by its replacement's dest.
VALUES = {"users": "300", "delta": "1e-7", "epsilon0": "2", "symbols": "8", "distribution": "categorical", "num_bins": "32"}


@pytest.mark.parametrize("command,option,action", ALIASES, ids=[f"{c}:{o}" for c, o, _ in ALIASES])
def test_every_deprecated_alias_warns_and_maps_to_the_new_dest(command, option, action, capsys):
    parser = COMMANDS[command]
    replacement = action.replacement.split()[0]
    assert replacement in parser._option_string_actions, f"{option} names {replacement}, not an option of {command}"
    new = parser._option_string_actions[replacement]
    assert action.dest == new.dest and not isinstance(new, DeprecatedAlias)
    # parse a full command line with the alias and nothing else odd: the value lands in the new dest
    argv = [*command.split(), *REQUIRED.get(command, []), option, VALUES[action.dest]]
    args = build_parser().parse_args(argv)
    expected = new.type(VALUES[action.dest]) if new.type else VALUES[action.dest]
    assert getattr(args, new.dest) == expected
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and re.fullmatch(rf"shuffledp {command}: warning: {re.escape(option)} is deprecated.* use "
                                          rf"{re.escape(replacement)}.*", err[0]), err
    assert option in (new.help or ""), f"{command} --help does not name {option} beside {replacement}"


#: What each command needs besides the alias under test to parse.
REQUIRED = {
    "account": ["-e", "1", "-n", "100"],
    "keys init": ["DIR"],
    "keys enroll": ["DIR"],
    "analyzer run": ["--keys", "K", "--broker", "h", "-n", "10"],
    "clients run": ["--keys", "K", "--broker", "h", "-n", "10"],
}


def test_a_required_option_is_satisfied_by_its_alias_and_still_required(capsys):
    assert build_parser().parse_args(["keys", "enroll", "DIR", "--count", "3"]).users == 3
    assert build_parser().parse_args(["account", "-e", "1", "--n", "30"]).users == 30
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:  # required unless --plan FILE is given: checked before any work
        main(["account", "-e", "1"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip() == "shuffledp account: the following arguments are required: --users/-n"


@pytest.mark.parametrize("argv", [["simulate", "--users", "x"], ["account", "-e", "1"], ["keys"], ["up", "--nope"]])
def test_usage_errors_are_one_line_with_status_2(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"shuffledp {argv[0]}: "), lines


def test_a_central_protocol_refuses_a_local_epsilon0_and_the_old_epsilon_still_means_central(capsys):
    assert main(["simulate", "--protocol", "sum", "-e", "1", "-n", "300", "-q"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--central-epsilon" in err[0]
    assert main(["simulate", "--protocol", "sum", "--fast", "--epsilon", "2", "-n", "300", "-q", "--json"]) == 0
    captured = capsys.readouterr()
    import json

    parameters = json.loads(captured.out)["shuffledp"]["parameters"]
    assert parameters["central_epsilon"] == 2.0 and parameters["epsilon0"] is None
    assert parameters["delta"] == default_delta(300)
    assert "--epsilon is deprecated" in captured.err


def test_the_default_delta_rule():
    assert default_delta(1000) == 1e-6 and default_delta(284_000) == 1e-6
    assert default_delta(10**6) == pytest.approx(10 ** -6.6) and default_delta(10**6) < 1e-6
    for n in (2, 10, 10**4, 10**7, 10**12):
        assert default_delta(n) < 1 / n and default_delta(n) <= 1e-6


@pytest.mark.parametrize("command", ["simulate", "account", "analyzer run", "up"])
def test_every_command_reporting_a_central_guarantee_states_the_default_delta_rule(command):
    help_text = COMMANDS[command]._option_string_actions["--delta"].help
    assert "min(1e-6, n^-1.1)" in help_text, help_text
