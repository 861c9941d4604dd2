"""Issue 30 item 7: a state directory written by another version of the tool.

A manifest written by a newer speculators-patch, or recording a shipped patch at a version
this tool does not have (or one it does not have at all), is refused by every command in one
line naming both versions, and nothing changes; a record no release wrote (a patch id or
version that neither this tool nor the one that wrote it has) is rebuilt by ``repair`` from
the files and the kept pristine copies, the way out the refusal names; one written by an
older version is read, with a note naming both."""

from __future__ import annotations

import json

import pytest
from support import GENERATOR, run_cli, tree_digest

COMMANDS = ("status", "verify", "diff", "apply", "revert", "repair")


def _edit_manifest(site, change) -> None:
    path = site / ".speculators-patch" / "manifest.json"
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest, indent=1, sort_keys=True))


def _newer_tool(m):
    m["tool"] = "speculators-patch 9.0.0"


def _newer_patch(m):
    m["files"][GENERATOR]["patches"]["SP004"] = 7


def _unknown_patch(m):
    m["files"][GENERATOR]["patches"]["SP999"] = 1


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (_newer_tool, "was written by speculators-patch 9.0.0, newer than this speculators-patch 0.1.0"),
        (
            _newer_patch,
            f"records SP004 v7 on {GENERATOR}, applied by speculators-patch 0.1.0; this speculators-patch "
            "0.1.0 has SP004 v1",
        ),
        (_unknown_patch, "records SP999 v1 on"),
    ],
    ids=["newer tool", "newer patch version", "patch this tool does not have"],
)
def test_a_state_from_a_newer_tool_is_refused_naming_both_versions(sandbox, site, change, says):
    assert run_cli("apply", "--target", str(sandbox)).returncode == 0
    _edit_manifest(site, change)
    before = tree_digest(site)
    edited = change is not _newer_tool  # no release wrote it: repair is the way out
    for command in COMMANDS:
        result = run_cli(command, "--target", str(sandbox))
        if command == "repair" and edited:
            assert result.returncode == 0 and "repaired: rewrote the record of" in result.stdout, result.stdout
            code = {k: v for k, v in tree_digest(site).items() if k.startswith("speculators/")}
            assert code == {k: v for k, v in before.items() if k.startswith("speculators/")}  # only the record
            assert run_cli("status", "--target", str(sandbox)).returncode == 0  # read again, as patched
            continue
        assert (result.returncode, result.stdout) == (2, ""), (command, result.stdout)
        assert len(result.stderr.splitlines()) == 1 and says in result.stderr, (command, result.stderr)
        assert "nothing was changed" in result.stderr
        said = f"`speculators-patch repair --target {sandbox}` rebuilds the record"  # the way out, for this target
        assert (said in result.stderr) == edited, result.stderr
        assert tree_digest(site) == before, command


def test_a_state_from_an_older_tool_is_read_with_a_note(sandbox, site):
    assert run_cli("apply", "--target", str(sandbox)).returncode == 0
    _edit_manifest(site, lambda m: m.__setitem__("tool", "speculators-patch 0.0.9"))
    result = run_cli("status", "--target", str(sandbox))
    assert (
        result.returncode == 0
        and "written by speculators-patch 0.0.9; read by this speculators-patch 0.1.0" in result.stderr
    )
    assert run_cli("revert", "--target", str(sandbox)).returncode == 0
