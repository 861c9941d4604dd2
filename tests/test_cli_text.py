"""Every verb's ``--help`` lists its exit codes, from one table (``patcher.cli.exit_codes``); ``list`` keeps file names whole."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from patcher.cli import exit_codes, main

pytestmark = pytest.mark.fast


@pytest.mark.parametrize("verb", sorted(main.commands))
def test_every_verb_help_ends_with_its_exit_codes(verb):
    result = CliRunner().invoke(main, [verb, "--help"], terminal_width=200)
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    assert text.endswith(" ".join(exit_codes.epilog(verb).split()))
    assert "2 bad input" in text and "130 Ctrl-C" in text


def test_no_verb_without_its_codes():
    assert set(main.commands) == set(exit_codes.OWN)


def test_list_keeps_file_names_whole():
    """``list`` on the 120-column console of a pipe: each file name on one line (it was cut
    mid-word, ``vllm_hidden_states_generato`` / ``r.py``)."""
    from patcher.fixes.registry import shipped_patches

    result = CliRunner().invoke(main, ["list"])
    assert result.exit_code == 0
    for name in {p.file.rsplit("/", 1)[-1] for p in shipped_patches()}:
        assert name in result.output, name


def test_no_command_prints_the_help_not_one_error_line():
    """``speculators-patch`` alone: click's help, one line per command, on stdout (exit 2, as
    click gives a group called without a command)."""
    result = CliRunner().invoke(main, [])
    assert result.exit_code == 2
    assert result.output.startswith("Usage: ") and "error:" not in result.output
    for verb in ("apply", "verify", "status", "revert", "selftest"):
        assert any(line.strip().startswith(verb + " ") for line in result.output.splitlines()), verb
