"""A kill at every step of commit, revert and recovery; disk full at several fill levels;
EACCES/EPERM at every step and a real immutable file. After the next command, every trial
is fully pristine or fully patched with its backups intact, and no temporary file is left.

Steps are the protocol's own writes, renames, unlinks and fsyncs, counted by the agent
(``SPECULATORS_PATCH_FAULT=kill@N`` makes it SIGKILL itself at the N-th). By default the
tier tries a deterministic subset that keeps every distinct on-disk state (see
``faultkit.kill_points``); ``SPECULATORS_PATCH_FULL_SWEEP=1`` tries every step. The figures
(tried, of how many, and the outcomes) are printed at the end of the run.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from faultkit import FULL_SWEEP, Tree, error_points, kill_points, recovery_starts


def _kill_sweep(tree: Tree, which: str, start_patched: bool) -> tuple[list[str], list[int], dict[str, int], list[str]]:
    tree.reset(patched=start_patched)
    steps = tree.steps(tree.request(which))
    points = kill_points(steps)
    outcomes: dict[str, int] = {"pristine": 0, "patched": 0, "corrupt": 0, "litter": 0, "needs repair": 0}
    bad = []
    for k in points:
        tree.reset(patched=start_patched)
        assert tree.run(tree.request(which), fault=f"kill@{k}") is None, f"step {k} did not kill"
        answer = tree.next_command()
        verdict = (
            tree.verdict()
            if answer and answer.get("ok") and not answer["ok"]["state_problem"]
            else f"needs repair: {answer}"
        )
        outcomes[verdict.split(":")[0]] += 1
        if verdict not in ("pristine", "patched"):
            bad.append(f"kill at step {k} ({steps[k - 1]}): {verdict}")
    return steps, points, outcomes, bad


def _tried(points: list, of: int) -> str:
    return f"{len(points)} of {of} steps" + ("" if len(points) == of else " (sampled)")


@pytest.mark.parametrize("which,start_patched", [("apply", False), ("revert", True)], ids=["commit", "revert"])
@pytest.mark.parametrize("carrying", ["shipped", "user"], ids=["shipped-patches", "with-a-user-patch-on-another-file"])
def test_kill_at_every_step(request, tmp_path, figures, which, start_patched, carrying):
    """``user``: the commit also carries FIX002 on logging_utils.py, a file no shipped
    patch touches (its pristine copy, its manifest entry and its record go through the
    same journal)."""
    reqs = request.getfixturevalue("reqs" if carrying == "shipped" else "user_reqs")
    if carrying == "user":
        assert "speculators/data_generation/logging_utils.py" in reqs.apply["writes"]
    steps, points, outcomes, bad = _kill_sweep(Tree(tmp_path, reqs), which, start_patched)
    what = "commit" if which == "apply" else "revert"
    figures[f"kill points tried ({what}{', with FIX002 on logging_utils.py' if carrying == 'user' else ''})"] = (
        f"{_tried(points, len(steps))}: {outcomes['pristine']} pristine, {outcomes['patched']} patched, "
        f"{outcomes['corrupt'] + outcomes['litter']} corrupt, {outcomes['needs repair']} needing repair"
    )
    assert not bad, "\n".join(bad)
    # both ends are reached: the sweep really crosses the commit point
    assert outcomes["pristine"] and outcomes["patched"]


@pytest.mark.parametrize("carrying", ["shipped", "user"], ids=["shipped-patches", "with-a-user-patch-on-another-file"])
def test_kill_at_every_step_of_recovery(request, tmp_path, figures, carrying):
    """A commit killed at each step that leaves a journal, then the recovery killed at each
    of its steps: the command after that ends whole."""
    reqs = request.getfixturevalue("reqs" if carrying == "shipped" else "user_reqs")
    tree = Tree(tmp_path / "t", reqs)
    tree.reset()
    commit_steps = tree.steps(tree.request("apply"))
    tried, states, bad = 0, 0, []
    # Recovery is killed at each of its own steps, from commits killed at the points
    # ``recovery_starts`` gives (every one in the full sweep) that leave a record.
    starts = recovery_starts(commit_steps)
    for k in starts:
        tree.reset()
        tree.run(tree.request("apply"), fault=f"kill@{k}")
        if not (tree.state / "journal.json").exists() and not (tree.state / "cleanup.json").exists():
            continue
        snapshot = _save(tree, tmp_path / "saved")
        states += 1
        log = tmp_path / "recovery.log"
        log.unlink(missing_ok=True)
        tree.next_command(fault="log", log=log)
        recovery_steps = log.read_text().splitlines()
        for r in range(1, len(recovery_steps) + 1):
            _restore(tree, snapshot)
            tree.run(
                {"op": "inspect", "site_packages": str(tree.site), "speculators_files": sorted(reqs.pristine)},
                fault=f"kill@{r}",
            )
            answer = tree.next_command()
            tried += 1
            verdict = tree.verdict() if answer["ok"]["state_problem"] is None else f"needs repair: {answer}"
            if verdict not in ("pristine", "patched"):
                bad.append(f"commit killed at {k}, recovery killed at {r} ({recovery_steps[r - 1]}): {verdict}")
    figures[f"kill points tried (recovery{', with FIX002 on logging_utils.py' if carrying == 'user' else ''})"] = (
        f"{tried} (every recovery step, from {states} interrupted commits: commit killed at {len(starts)} of "
        f"{len(commit_steps)} steps{'' if FULL_SWEEP else ', sampled'}), {len(bad)} corrupt or needing repair"
    )
    assert tried > 0 and not bad, "\n".join(bad)


def _save(tree: Tree, dest: Path) -> Path:
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(tree.site, dest, symlinks=True)
    return dest


def _restore(tree: Tree, saved: Path) -> None:
    shutil.rmtree(tree.site)
    shutil.copytree(saved, tree.site, symlinks=True)  # hard links become copies: same bytes


@pytest.mark.parametrize("kind", ["enospc", "eacces", "eperm"])
@pytest.mark.parametrize("carrying", ["shipped", "user"], ids=["shipped-patches", "with-a-user-patch-on-another-file"])
def test_error_at_every_step_is_rolled_back_at_once(request, tmp_path, figures, kind, carrying):
    """An OSError at any step before the commit point: the agent answers one error and the
    tree is as it was; after it: the commit stands, its answer says the clean-up stopped
    (``unfinished``, with the command that recovers), and the next command finishes it."""
    reqs = request.getfixturevalue("reqs" if carrying == "shipped" else "user_reqs")
    tree = Tree(tmp_path, reqs)
    counts = {}
    for which, start in (("apply", False), ("revert", True)):
        tree.reset(patched=start)
        steps = tree.steps(tree.request(which))
        points = error_points(steps, kind)
        committed_at = next(
            i
            for i, step in enumerate(steps, 1)
            if step.split(" ", 2)[1:] == ["rename", str(tree.state / "cleanup.json")]
        )
        bad = []
        for k in points:
            tree.reset(patched=start)
            answer = tree.run(tree.request(which), fault=f"{kind}@{k}")
            assert answer is not None
            if k > committed_at and not (answer.get("ok") or {}).get("unfinished"):  # issue 30 item 4
                bad.append(f"{which} {kind} at step {k} ({steps[k - 1]}): done, but its cleanup stopped silently")
            tree.next_command()
            verdict = tree.verdict()
            expected = (
                ("pristine" if start is False else "patched")
                if "error" in answer
                else ("patched" if start is False else "pristine")
            )
            if verdict != expected:
                bad.append(f"{which} {kind} at step {k} ({steps[k - 1]}): {verdict}; answer {answer}")
        counts[which] = _tried(points, len(steps))
        assert not bad, "\n".join(bad)
    figures[f"{kind} injected{' (with FIX002 on logging_utils.py)' if carrying == 'user' else ''}"] = (
        f"apply {counts['apply']}, revert {counts['revert']}; 0 half-done (each rolled back "
        "at once before the commit point, standing after it)"
    )


def _mount_tmpfs(where: Path, size: str) -> bool:
    where.mkdir(parents=True, exist_ok=True)
    return (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True
        ).returncode
        == 0
    )


def _fill(where: Path, leave: int) -> None:
    """Fill the file system of ``where`` until ``leave`` bytes are free."""
    import os

    filler = where / "filler"
    with open(filler, "wb") as f:
        chunk = b"\0" * 4096
        while True:
            st = os.statvfs(where)
            free = st.f_bavail * st.f_frsize
            if free <= leave:
                break
            try:
                f.write(chunk[: max(1, min(4096, free - leave))])
                f.flush()
            except OSError:
                break


LEVELS_KIB = [0, 4, 16, 32, 48, 64, 96, 128, 160, 192, 256]


@pytest.mark.parametrize("space_check", [True, False], ids=["preflight", "real-enospc"])
def test_disk_full_at_several_levels(reqs, tmp_path, figures, space_check):
    """A small tmpfs filled to each level. With the preflight the commit is refused before
    the first write; without it (``SPECULATORS_PATCH_SKIP_SPACE_CHECK``) the real ENOSPC
    mid-commit is rolled back with renames only. Then space is freed and the next command
    and a new attempt succeed."""
    mnt = tmp_path / "mnt"
    if not _mount_tmpfs(mnt, "2m"):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    env = {} if space_check else {"SPECULATORS_PATCH_SKIP_SPACE_CHECK": "1"}
    tried, results = 0, {}
    try:
        tree = Tree(mnt, reqs)
        for which, start in (("apply", False), ("revert", True)):
            for kib in LEVELS_KIB:
                tree.reset(patched=start)
                (mnt / "filler").unlink(missing_ok=True)
                _fill(mnt, kib * 1024)
                answer = tree.run(tree.request(which), env=env)
                tried += 1
                verdict = tree.verdict()
                ok = "ok" in answer
                expected = ("patched" if not start else "pristine") if ok else ("pristine" if not start else "patched")
                assert verdict == expected, (which, kib, answer, verdict)
                if not ok:
                    assert "space" in answer["error"].lower(), answer
                    assert start or not tree.state.exists(), "a refused first apply leaves no state (issue 30 item 6)"
                results[f"{which}@{kib}KiB"] = "done" if ok else "refused"
                (mnt / "filler").unlink()
                assert tree.next_command()["ok"]["state_problem"] is None
                if not ok:  # with room again it goes through
                    assert "ok" in tree.run(tree.request(which)), which
                    assert tree.verdict() == ("patched" if not start else "pristine")
    finally:
        subprocess.run(["umount", "-l", str(mnt)])
    figures[f"disk-full trials ({'preflight' if space_check else 'real ENOSPC'})"] = (
        f"{tried} ({len(LEVELS_KIB)} levels x apply, revert), 0 half-patched; "
        + "; ".join(
            f"{op} refused at {[k for k in LEVELS_KIB if results[f'{op}@{k}KiB'] == 'refused']} KiB free, done above"
            for op in ("apply", "revert")
        )
    )
    assert "refused" in results.values() and "done" in results.values()


def test_immutable_file_is_refused_before_the_first_write(reqs, tmp_path, figures):
    """chattr +i on one target (a loop-mounted ext4, where it works): refused, nothing written;
    and +i set while the commit is paused between two files: rolled back at once."""
    image, mnt = tmp_path / "fs.img", tmp_path / "ext4"
    mnt.mkdir()
    subprocess.run(["truncate", "-s", "8M", str(image)], check=True)
    if (
        subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], capture_output=True).returncode != 0
        or subprocess.run(["mount", "-o", "loop", str(image), str(mnt)], capture_output=True).returncode != 0
    ):
        pytest.skip("no loop-mounted ext4 here (needs root and mkfs.ext4)")
    try:
        tree = Tree(mnt, reqs).reset()
        last = sorted(reqs.pristine)[-1]
        subprocess.run(["chattr", "+i", str(tree.site / last)], check=True)
        answer = tree.run(tree.request("apply"))
        assert "immutable" in answer["error"] and tree.verdict() == "pristine", answer
        assert not tree.state.exists(), "a refused first apply leaves no state (issue 30 item 6)"
        subprocess.run(["chattr", "-i", str(tree.site / last)], check=True)

        tree.reset()
        proc = subprocess.Popen(
            [*_agent(tree)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=_env("pause-mid-write")
        )
        import json
        import time

        proc.stdin.write(json.dumps(tree.request("apply")).encode() + b"\n")
        proc.stdin.flush()
        time.sleep(1.0)  # the agent is paused after the first file
        subprocess.run(["chattr", "+i", str(tree.site / last)], check=True)
        out, _ = proc.communicate(timeout=30)
        answer = json.loads(out)
        subprocess.run(["chattr", "-i", str(tree.site / last)], check=True)
        assert "error" in answer and "nothing changed" in answer["error"], answer
        assert tree.verdict() == "pristine" and not tree.state.exists()
        figures["immutable (chattr +i on ext4)"] = (
            "refused before writing; flipped mid-commit: rolled back; no state left"
        )
    finally:
        subprocess.run(["chattr", "-R", "-i", str(mnt)], capture_output=True)
        subprocess.run(["umount", "-l", str(mnt)])


def _agent(tree: Tree) -> list[str]:
    from faultkit import AGENT, PYTHON

    return [PYTHON, "-I", "-S", "-c", AGENT]


def _env(fault: str) -> dict:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECULATORS_PATCH_")}
    env.update({"SPECULATORS_PATCH_FAULT": fault, "SPECULATORS_PATCH_FAULT_SECONDS": "4"})
    return env


def test_an_immutable_pristine_copy_stops_revert_before_it_writes(sandbox, site, figures):
    """Issue 30 item 4: a full revert must drop the kept copies. One made immutable (chattr
    +i): refused before the first write, naming ``chattr -i``; every later command still reads
    the install; once cleared, revert finishes and leaves no state."""
    from support import PATCHED_FILES, run_cli, tree_digest

    assert run_cli("apply", "--target", str(sandbox)).returncode == 0
    [copy] = (site / ".speculators-patch" / "pristine").rglob("vllm_hidden_states_generator.py.sha256-*")
    if subprocess.run(["chattr", "+i", str(copy)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not supported here (needs root and a file system with the flag)")
    try:
        before = tree_digest(site)
        result = run_cli("revert", "--target", str(sandbox))
        assert (result.returncode, result.stdout) == (2, "") and len(result.stderr.splitlines()) == 1, result.stderr
        assert "immutable" in result.stderr and f"`chattr -i {copy}`" in result.stderr
        assert tree_digest(site) == before
        for command in ("status", "verify", "apply"):
            assert run_cli(command, "--target", str(sandbox)).returncode == 0, command
    finally:
        subprocess.run(["chattr", "-i", str(copy)], check=True)
    result = run_cli("revert", "--target", str(sandbox))
    assert result.returncode == 0 and f"restored {len(PATCHED_FILES)} file(s)" in result.stdout
    assert not (site / ".speculators-patch").exists()
    figures["immutable pristine copy at revert"] = "refused before writing, naming chattr -i; readable throughout"
