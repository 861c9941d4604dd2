"""Issue 30 item 3: ``apply --adopt`` never makes patched bytes a pristine copy.

Following ``revert``'s own advice on a hand-edited patched file (``apply --adopt``) keeps the
edit: it joins the pristine copy, so a later ``revert`` gives back stock speculators plus the
edit, never the patches. An edit that changes lines the patches rewrote cannot be put on the
stock file: ``--adopt`` refuses in one line and says how to keep it."""

from __future__ import annotations

from support import GENERATOR, PATCHED_FILES, run_cli, run_json, tree_digest

EDIT = b"# a line the user added after patching\n"


def test_adopting_a_hand_edit_keeps_it_on_the_stock_file(sandbox, site):
    stock = (site / GENERATOR).read_bytes()
    assert run_cli("apply", "--target", str(sandbox)).returncode == 0
    with (site / GENERATOR).open("ab") as f:
        f.write(EDIT)
    edited = (site / GENERATOR).read_bytes()
    refused = run_cli("revert", "--target", str(sandbox))
    said = " ".join(refused.stderr.split())  # both ways out, as commands for this very target
    assert refused.returncode == 2, said
    assert f"`speculators-patch revert --target {sandbox} --force` restores the copy kept before patching" in said
    assert f"`speculators-patch apply --target {sandbox} --adopt` keeps the edit instead" in said
    adopted = run_cli("apply", "--adopt", "--target", str(sandbox))
    assert adopted.returncode == 0, adopted.stdout + adopted.stderr
    assert "adopted 1 file(s)" in adopted.stdout and (site / GENERATOR).read_bytes() == edited
    code, status = run_json("status", "--target", str(sandbox))
    assert status["files"][GENERATOR] == "patched" and status["install"]["state"] == "patched"
    assert run_cli("verify", "--target", str(sandbox)).returncode == 0
    reverted = run_cli("revert", "--target", str(sandbox))
    assert reverted.returncode == 0 and f"restored {len(PATCHED_FILES)} file(s)" in reverted.stdout, reverted.stdout
    assert (site / GENERATOR).read_bytes() == stock + EDIT  # stock speculators plus the edit, no patch
    _, status = run_json("status", "--target", str(sandbox))
    assert status["files"][GENERATOR] == "edited"  # not what pip installed: never called pristine


def test_an_edit_inside_the_patched_lines_is_refused_with_the_way_out(sandbox, site):
    assert run_cli("apply", "--target", str(sandbox)).returncode == 0
    text = (site / GENERATOR).read_text()
    line = "model_output = self.executor.execute_model(scheduler_output)"  # written by SP005
    assert text.count(line) == 1
    (site / GENERATOR).write_text(text.replace(line, line + "  # mine"))
    before = tree_digest(site)
    result = run_cli("apply", "--adopt", "--target", str(sandbox))
    assert (result.returncode, result.stdout) == (2, "") and len(result.stderr.splitlines()) == 1
    assert result.stderr.startswith(f"error: cannot adopt {GENERATOR}: it holds this tool's patches")
    assert f"`speculators-patch revert --target {sandbox} --force`" in result.stderr
    assert tree_digest(site) == before
