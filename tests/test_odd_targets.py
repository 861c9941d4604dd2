"""Issue 37, item 2: one odd target never spoils another. An interpreter older than 3.8 is
refused the same way on every transport before anything is written; verify's cached call
findings answer only a target whose interpreter read the same files alike, and are never
kept from a partial read; ``--no-cache`` reads and writes no cache.

No Python 3.7 can be installed on this machine (no Debian package; uv has no build of it for
it), so the old interpreter is a stand-in: the sandbox's ``bin/python`` replaced by a script
that runs its real Python with ``sys.version_info`` set to 3.7 (or 3.9) and, where asked, a
parser that refuses the files an older parser would (here any file with ``:=``)."""

from __future__ import annotations

import sys
from pathlib import Path

from support import pretend_python, run_cli


def _install(site: Path) -> dict[str, bytes]:
    top = [site / "speculators", site / ".speculators-patch"]
    return {str(p): p.read_bytes() for t in top for p in sorted(t.rglob("*")) if p.is_file()}


def test_a_python_37_target_is_refused_on_every_transport_with_nothing_written(sandbox, site):
    python = pretend_python(sandbox, "3.7")
    before = _install(site)
    real = sandbox / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    refusal = f"error: the agent needs Python 3.8+: {real} is Python 3.7; nothing was read or changed"
    for where in (
        ("--target", str(sandbox)),  # local: the agent under the target's interpreter
        ("--target", str(python)),
        ("--exec", str(python)),  # the bootstrap itself under 3.7
        ("--exec", sys.executable, "--target", str(sandbox)),  # a new bootstrap choosing a 3.7 target
    ):
        for verb in ("apply", "revert", "status"):
            result = run_cli(verb, *where)
            assert result.returncode == 2, (where, verb, result.stderr)
            assert result.stderr.strip() == refusal, (where, verb, result.stderr)
            assert _install(site) == before, (where, verb)
    assert not (site / ".speculators-patch").exists()


def test_a_target_that_parses_less_never_spoils_a_healthy_targets_verify(tmp_path):
    """A target whose interpreter cannot parse some of vLLM's files (a stand-in for an old
    one) finds calls that do not fit; a healthy target with the very same files, checked
    after it, is not answered from that run's findings."""
    from sandbox import make_sandbox

    odd, healthy = make_sandbox(tmp_path / "odd"), make_sandbox(tmp_path / "healthy")
    pretend_python(odd, "3.9", refuse=b":=")
    cache = {"SPECULATORS_PATCH_CACHE": str(tmp_path / "cache")}
    # the calls into vLLM and the import chain: files its parser refuses do not fit either
    assert "verify: FAILED (the calls, the imports)" in run_cli("apply", "--target", str(odd), env=cache).stdout
    result = run_cli("apply", "--target", str(healthy), env=cache)
    assert result.returncode == 0 and "FAILED" not in result.stdout, result.stdout[-2000:]
    result = run_cli("verify", "--target", str(healthy), env=cache)
    assert result.returncode == 0 and "verify: OK" in result.stdout, result.stdout[-2000:]


def test_no_cache_reads_and_writes_no_cache(tmp_path, sandbox):
    cache = tmp_path / "cache"
    env = {"SPECULATORS_PATCH_CACHE": str(cache)}
    for verb in ("apply", "verify", "status"):
        result = run_cli(verb, "--no-cache", "--target", str(sandbox), env=env)
        assert result.returncode == 0, (verb, result.stderr)
    assert not (cache / "fast").exists(), sorted(p.name for p in (cache / "fast").iterdir())
    assert run_cli("verify", "--target", str(sandbox), env=env).returncode == 0
    assert (cache / "fast" / "verify-calls").is_dir()  # without it, the same run keeps its findings


def _cached_entries(verb: str, kind: str, sandbox: Path, tmp_path: Path):
    """``verb`` run without a cache, then with one (the same answer); returns the uncached
    answer, the cache's environment and the entries of ``kind`` that run stored."""
    env = {"SPECULATORS_PATCH_CACHE": str(tmp_path / "cache")}
    clean = run_cli(verb, "--target", str(sandbox), "--no-cache")
    assert run_cli(verb, "--target", str(sandbox), env=env).stdout == clean.stdout
    entries = sorted((tmp_path / "cache" / "fast" / kind).glob("*.json"))
    assert entries, f"{verb} stored no {kind} entry"
    return clean, env, entries


def test_a_hand_edited_evidence_cache_is_computed_afresh(sandbox: Path, tmp_path: Path) -> None:
    """Found by a fresh-eyes run: one fact deleted from a cached ``vllm-evidence`` entry made
    ``apply`` end in a ``KeyError`` traceback. An entry that lacks a fact, or holds a malformed
    one, is read again from vLLM's files: the same answers as with no cache at all."""
    import json

    clean, env, entries = _cached_entries("diff", "vllm-evidence", sandbox, tmp_path)
    for damage in (lambda facts: facts[1:], lambda facts: [facts[0][:2]] + facts[1:]):
        for entry in entries:
            entry.write_text(json.dumps(damage(json.loads(entry.read_text()))))
        again = run_cli("diff", "--target", str(sandbox), env=env)
        assert (again.returncode, again.stdout) == (clean.returncode, clean.stdout), again.stderr[-500:]
        assert "Traceback" not in again.stderr


def test_a_hand_edited_patch_index_entry_is_not_trusted(sandbox: Path, tmp_path: Path) -> None:
    """Found by a fresh-eyes run: a cached ``patch-index`` entry edited by hand into another
    well-formed one (a patch's title changed) was read as the truth. Every cache entry is
    sealed with the sha256 of its bytes; an entry that no longer matches is computed afresh."""
    import json

    clean, env, entries = _cached_entries("status", "patch-index", sandbox, tmp_path)
    for entry in entries:
        rows = json.loads(entry.read_text())
        rows[0]["title"] = "a title nobody wrote"
        entry.write_text(json.dumps(rows))
    again = run_cli("status", "--target", str(sandbox), env=env)
    assert (again.returncode, again.stdout) == (clean.returncode, clean.stdout), again.stderr[-500:]
    assert "a title nobody wrote" not in again.stdout
