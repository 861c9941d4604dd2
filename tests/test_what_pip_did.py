"""Issue 46: what pip did is pip's doing, with ``repair`` as the way out.

A user patches speculators 0.3.0, then pip acts on the same environment: it upgrades
speculators to 0.4.0.1, reinstalls 0.3.0 (``--force-reinstall``) or uninstalls it. Every verb
then names pip's doing (read from speculators' dist-info: version, INSTALLER, RECORD), never
"changed by hand"; a refusal changes nothing and names ``repair``; ``revert`` and ``repair``
clean up the state nothing needs any more, and ``repair`` says what it rewrote. Real wheels,
real pip, the real CLI."""

from __future__ import annotations

import hashlib
import json

import pytest
from sandbox import pip_install, pip_uninstall
from support import PATCHED_FILES, run_cli, run_json, tree_digest

STATE = ".speculators-patch"


def _one_error(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def test_a_pip_upgrade_is_named_as_pips_doing_by_every_verb(sandbox, site):
    assert run_cli("apply", "--target", str(sandbox)).returncode == 0
    pip_install(sandbox, "speculators", "0.4.0.1")
    replaced = "pip replaced speculators 0.3.0 by 0.4.0.1 after speculators-patch patched it"

    code, report = run_json("status", "--target", str(sandbox))
    assert code == 1 and report["install"]["state"] == "reinstalled", report["install"]
    assert replaced in report["install"]["reason"] and "repair" in report["install"]["reason"]
    assert set(PATCHED_FILES) <= set(report["files"])  # every recorded file is listed
    assert not {"modified", "edited"} & set(report["files"].values()), report["files"]
    assert "by hand" not in run_cli("status", "--target", str(sandbox)).stdout

    before = tree_digest(site)
    for verb in (("diff",), ("apply",), ("apply", "--adopt"), ("revert",), ("revert", "--force")):
        line = _one_error(run_cli(*verb, "--target", str(sandbox)))
        assert replaced in line and f"`speculators-patch repair --target {sandbox}` drops" in line, (verb, line)
        assert "nothing was changed" in line and "--adopt" not in line.split("error: ", 1)[1]
    assert tree_digest(site) == before  # each refusal changed nothing

    verified = run_cli("verify", "--target", str(sandbox))
    assert replaced in verified.stderr, verified.stderr  # a note, whatever verify's verdict

    repaired = run_cli("repair", "--target", str(sandbox))
    assert repaired.returncode == 0, repaired.stderr
    assert "pip replaced speculators 0.3.0 by 0.4.0.1" in repaired.stdout
    assert repaired.stdout.strip().splitlines()[-1].startswith("repaired: removed manifest.json")
    assert not (site / STATE).exists()
    code, report = run_json("status", "--target", str(sandbox))
    assert report["install"]["state"] != "reinstalled" and replaced not in json.dumps(report)


def test_a_force_reinstall_of_the_same_release_is_said_and_revert_cleans_up(sandbox, site):
    assert run_cli("apply", "--target", str(sandbox)).returncode == 0
    pip_install(sandbox, "speculators", "0.3.0", force=True)
    speculators = tree_digest(site / "speculators")
    status = run_cli("status", "--target", str(sandbox))
    n = len(PATCHED_FILES)
    said = f"pip reinstalled speculators 0.3.0 over {n} of the {n} file(s) speculators-patch patched"
    assert said in status.stderr, status.stderr
    code, report = run_json("status", "--target", str(sandbox))  # the install's word is pip's doing too
    assert (code, report["install"]["state"]) == (1, "reinstalled") and said in report["install"]["reason"]

    reverted = run_cli("revert", "--target", str(sandbox))
    assert reverted.returncode == 0, reverted.stderr
    last = reverted.stdout.strip().splitlines()[-1]
    assert last.startswith(f"nothing to restore: {said}") and f"removed {site / STATE}" in last, last
    assert not (site / STATE).exists()  # no 104 KB of copies nothing needs
    assert tree_digest(site / "speculators") == speculators  # pip's files, untouched
    again = run_cli("revert", "--target", str(sandbox))
    assert again.returncode == 0 and again.stdout.strip() == "nothing to revert: no file needed restoring"


def test_a_force_reinstall_is_repaired_in_words_that_say_what_changed(sandbox, site):
    assert run_cli("apply", "--target", str(sandbox)).returncode == 0
    pip_install(sandbox, "speculators", "0.3.0", force=True)
    repaired = run_cli("repair", "--target", str(sandbox))
    last = repaired.stdout.strip().splitlines()[-1]
    assert repaired.returncode == 0 and last.startswith("repaired: removed manifest.json"), repaired.stdout
    assert not (site / STATE).exists()


def test_the_state_left_by_a_pip_uninstall_is_named_and_repair_removes_it(sandbox, site):
    assert run_cli("apply", "--target", str(sandbox)).returncode == 0
    pip_uninstall(sandbox, "speculators")
    before = tree_digest(site)
    for verb in ("status", "diff", "apply", "verify", "revert"):
        line = _one_error(run_cli(verb, "--target", str(sandbox)))
        assert "no speculators installed" in line and f"{site / STATE} is left over" in line, (verb, line)
        assert (
            f"{len(PATCHED_FILES)} patched file(s) of speculators 0.3.0" in line
            and f"`speculators-patch repair --target {sandbox}` removes it" in line
        )
    assert tree_digest(site) == before

    repaired = run_cli("repair", "--target", str(sandbox))
    assert repaired.returncode == 0, repaired.stderr
    assert f"repaired: removed {site / STATE}" in " ".join(repaired.stdout.split())
    assert not (site / STATE).exists() and {p for p in tree_digest(site) if STATE in p} == set()
    gone = _one_error(run_cli("status", "--target", str(sandbox)))
    assert "left over" not in gone


# Each field of a patched install's manifest, damaged in turn: repair must never say
# "nothing to repair" / "already matched" when it rewrote manifest.json (issue 46).
DAMAGE = {
    "pristine_sha256": lambda e: e.update(pristine_sha256="0" * 64),
    "patched_sha256": lambda e: e.update(patched_sha256="0" * 64),
    "patches": lambda e: e.update(patches={}),
    "patches-version": lambda e: e["patches"].update({k: v + 1 for k, v in e["patches"].items()}),
    "checked": lambda e: e.pop("checked", None),
    "extra-key": lambda e: e.update(note="hand-written"),
}


@pytest.mark.parametrize("field", sorted(DAMAGE))
def test_repair_says_it_rewrote_a_damaged_record(sandbox, site, field):
    assert run_cli("apply", "--target", str(sandbox)).returncode == 0
    path = site / STATE / "manifest.json"
    manifest = json.loads(path.read_text())
    DAMAGE[field](manifest["files"][PATCHED_FILES[0]])
    path.write_text(json.dumps(manifest, indent=1, sort_keys=True))
    damaged = path.read_bytes()
    repaired = run_cli("repair", "--target", str(sandbox))
    rewritten = not path.exists() or path.read_bytes() != damaged
    last = repaired.stdout.strip().splitlines()[-1] if repaired.stdout.strip() else repaired.stderr
    if rewritten:
        assert "nothing to repair" not in last and "already matched" not in last, (field, last)
        assert last.startswith("repaired:"), (field, last)


def test_repair_that_removes_a_stray_kept_copy_says_so(sandbox, site):
    """A kept copy no record names (named by its own digest, so it is read as a copy): repair
    removes it and says so, never "nothing to repair"; run again, there is nothing to repair."""
    assert run_cli("apply", "--target", str(sandbox)).returncode == 0
    kept = next((site / STATE / "pristine" / "speculators" / "train").glob("trainer.py.sha256-*"))
    content = b"# a stray copy\n"
    stray = kept.with_name("trainer.py.sha256-" + hashlib.sha256(content).hexdigest())
    stray.write_bytes(content)
    repaired = run_cli("repair", "--target", str(sandbox))
    last = repaired.stdout.strip().splitlines()[-1]
    assert repaired.returncode == 0 and not stray.exists() and kept.exists(), repaired.stdout
    assert last.startswith("repaired: ") and "nothing to repair" not in last, last
    assert "removed 1 kept copy no record names (speculators/train/trainer.py)" in last, last
    again = run_cli("repair", "--target", str(sandbox))
    assert again.stdout.strip().splitlines()[-1].startswith("nothing to repair: "), again.stdout


def test_repair_removes_a_file_whose_bytes_are_not_its_names_digest_and_says_so(sandbox, site):
    """Junk under pristine/ named like a kept copy but whose bytes do not have the digest in its
    name (beside a recorded file, and for a file not installed): no copy, nothing restores from
    it. repair removes it and names it, never "nothing to repair"; run again, nothing is left."""
    assert run_cli("apply", "--target", str(sandbox)).returncode == 0
    pristine = site / STATE / "pristine" / "speculators"
    kept = next((pristine / "train").glob("trainer.py.sha256-*"))
    junk = [pristine / "train" / f"trainer.py.sha256-{'a' * 64}", pristine / f"nothere.py.sha256-{'b' * 64}"]
    for path in junk:
        path.write_bytes(b"# junk\n")
    repaired = run_cli("repair", "--target", str(sandbox))
    last = " ".join(repaired.stdout.strip().splitlines()[-1].split())
    assert repaired.returncode == 0 and not any(p.exists() for p in junk) and kept.exists(), repaired.stdout
    assert last.startswith(
        "repaired: removed 2 file(s) under pristine/ whose bytes do not match the digest in "
        "their name, so nothing could restore from them (speculators/nothere.py.sha256-"
    ), last
    assert "nothing to repair" not in last and "speculators/train/trainer.py.sha256-aaaa" in last, last
    again = run_cli("repair", "--target", str(sandbox))
    assert again.stdout.strip().splitlines()[-1].startswith("nothing to repair: "), again.stdout
    code, data = run_json("status", "--target", str(sandbox))
    assert (code, data["install"]["state"]) == (0, "patched")


def test_an_edited_release_in_the_record_is_damage_not_pips_doing(sandbox, site):
    """Nothing replaced the package, only the manifest's speculators_version was edited: the
    kept copies are still the installed release's own files (pip's RECORD says so). Every verb
    calls the record damaged, never pip's doing; ``repair`` rewrites the version and keeps
    every copy, and ``revert`` then restores the files pip installed."""
    assert run_cli("apply", "--target", str(sandbox)).returncode == 0
    manifest = site / STATE / "manifest.json"
    data = json.loads(manifest.read_text())
    data["speculators_version"] = "0.4.0"
    manifest.write_text(json.dumps(data, indent=1, sort_keys=True))
    before = tree_digest(site)
    for verb in ("status", "verify", "diff", "apply", "revert"):
        line = _one_error(run_cli(verb, "--target", str(sandbox)))
        assert "manifest.json is damaged (it names speculators 0.4.0" in line and "pip replaced" not in line, line
        assert f"`speculators-patch repair --target {sandbox}`" in line, line
    assert tree_digest(site) == before
    repaired = run_cli("repair", "--target", str(sandbox))
    assert repaired.returncode == 0 and "rewrote speculators_version" in repaired.stdout, repaired.stdout
    assert "dropped" not in repaired.stdout, repaired.stdout
    code, report = run_json("status", "--target", str(sandbox))
    assert code == 0 and report["install"]["state"] == "patched", report["install"]
    assert run_cli("revert", "--target", str(sandbox)).returncode == 0
