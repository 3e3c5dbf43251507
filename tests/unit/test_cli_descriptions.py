"""Every ``llm-bench-exporter`` subcommand's ``--help`` opens with a description of what it does
(``serve`` had only its one-line help), and ``serve --help`` says what it writes and how it fails."""

from __future__ import annotations

import argparse

import pytest

from exporter.cli import COMMANDS, build_parser, main


def _sub(name: str) -> argparse.ArgumentParser:
    parser = build_parser([name])
    action = next(a for a in parser._actions if a.dest == "command")
    return action.choices[name]  # type: ignore[attr-defined,no-any-return]


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_subcommand_has_a_description(name: str) -> None:
    description = _sub(name).description
    assert description and len(description) > 60, (name, description)


def test_serve_help_says_what_it_does(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["serve", "--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for words in ("measuring proxy", "/metrics", "requests.jsonl", "POST /-/scenario", "Exit status 2"):
        assert words in text, words
