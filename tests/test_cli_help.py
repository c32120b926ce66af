"""``--help`` of every command: each option has a line of help; ``fedhier fit --help`` points to ``fit linear``."""

from __future__ import annotations

import argparse

import pytest

from fedhier.cli import main


def _parser_of(monkeypatch, call) -> argparse.ArgumentParser:
    """The parser a command builds (caught at its ``parse_args``)."""
    seen = []

    def catch(self, *args, **kw):
        seen.append(self)
        raise SystemExit(0)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", catch)
    with pytest.raises(SystemExit):
        call()
    return seen[0]


def _commands(parser: argparse.ArgumentParser, name: str):
    """(command name, parser) of ``parser`` and its subcommands, recursively."""
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, subparser in action.choices.items():
                yield from _commands(subparser, f"{name} {sub}")


def _undocumented(parser: argparse.ArgumentParser, name: str) -> list[str]:
    missing = []
    for command, p in _commands(parser, name):
        if not p.add_help:  # collab, flower: listed by `fedhier -h`, parsed by their own parsers
            continue
        for action in p._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            if not (action.help or "").strip():
                missing.append(f"{command} {'/'.join(action.option_strings) or action.dest}")
    return missing


def test_every_option_of_every_command_has_help(monkeypatch):
    from fedhier.cli import _build_parser
    from fedhier.cli.collab import cli_collab
    from fedhier.cli.flower import _parser as flower_parser
    from fedhier.cli.linear import cli_fit_linear

    parsers = {
        "fedhier": _build_parser(),
        "fedhier flower": flower_parser(),
        "fedhier fit linear": _parser_of(monkeypatch, lambda: cli_fit_linear(["x.csv"])),
        "fedhier collab": _parser_of(monkeypatch, lambda: cli_collab(["fit"])),
    }
    missing = [m for name, parser in parsers.items() for m in _undocumented(parser, name)]
    assert missing == []


def test_fit_help_names_fit_linear(capsys):
    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    assert "fedhier fit linear" in capsys.readouterr().out


def test_every_option_of_the_data_commands_is_in_docs_cli(monkeypatch):
    """What `--help` offers for the demo and the fits on a user's files, docs/cli.md describes (and vice versa a
    user reading the page finds every flag): each long option appears there, in its text or its examples."""
    import re
    from pathlib import Path

    from fedhier.cli import _build_parser
    from fedhier.cli.collab import cli_collab
    from fedhier.cli.linear import cli_fit_linear

    page = (Path(__file__).resolve().parents[1] / "docs" / "cli.md").read_text()
    parsers = {
        "fedhier": _build_parser(),
        "fedhier fit linear": _parser_of(monkeypatch, lambda: cli_fit_linear(["x.csv"])),
        "fedhier collab": _parser_of(monkeypatch, lambda: cli_collab(["fit"])),
    }
    absent = [f"{command} {option}"
              for name, parser in parsers.items() for command, p in _commands(parser, name)
              if command not in ("fedhier", "fedhier experiment") and p.add_help
              for action in p._actions for option in action.option_strings
              if option.startswith("--") and option not in ("--help", "--version")
              and not re.search(re.escape(option) + r"(?![\w-])", page)]
    assert absent == []
