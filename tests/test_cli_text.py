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


@pytest.mark.parametrize("width", [80, 100, 124])
def test_list_on_a_narrow_terminal_loses_nothing(width):
    """``list`` on a terminal narrower than its table: every patch's id, file name, what it
    depends on and what it requires are shown whole, within the terminal's width (the table
    was cut: on 80 columns "SP00", no "depends on" or "requires" column at all)."""
    import io

    from rich.console import Console

    from patcher.cli.reports import list_report
    from patcher.commands.listing import depends_on, listing
    from patcher.fixes.registry import loaded

    done = listing(loaded())
    out = io.StringIO()
    console = Console(file=out, width=width, force_terminal=True, color_system=None, highlight=False)
    list_report(done).render(console)
    text = out.getvalue()
    rows = text.split("\nsupported: ")[0]  # the support statement is one line, as everywhere
    assert all(len(line.rstrip()) <= width for line in rows.splitlines()), text
    words = " ".join(text.split())
    for r in done.rows:
        requires = ", ".join(r["requires"]) or "nothing"
        line = f"{r['id']} {r['name']} v{r['version']} ({r['file'].rsplit('/', 1)[-1]}): depends on"
        assert f"{line} {' '.join(depends_on(r).split())}; requires {requires}" in words, r["id"]
