"""The break test of issue 23, tried as a new user would: every state a user fix can leave
an install in, times every command, with and without the fix's file at hand; each writing
command killed at each step of its commit; and every transport against peers that stay
silent, echo their input, or stop answering. After each trial:

- nothing lost: a speculators file that was restorable before (pip's bytes, or a record
  with a verified pristine copy) still is, and a hand edit is never overwritten without
  ``--force``;
- whole: no journal, temporary file or half-written file; every recorded file is its
  pristine or its recorded patched bytes (or recorded ``modified``);
- true: ``status`` names each file's real state; ``revert`` and ``apply`` count the files
  they really changed, and say "nothing to ..." only when nothing changed; ``apply`` exits
  0 only where ``verify`` does; a refusal is one ``error:`` line naming the way out.

Each (state, command, file at hand or not) is one *kind*; the figures (kinds tried, kinds
clean) are printed at the end of the run with the fault tier's. By default a deterministic
quarter of the kinds runs (every state and every command among them), and each killed
commit tries every other one of the tier's distinct kill points (``faultkit.kill_points``)
and the last; ``SPECULATORS_PATCH_FULL_SWEEP=1`` (``make test-full``) tries every kind at
every step (about 18 minutes of the two tests, against about 5).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from faultkit import FULL_SWEEP, kill_points
from sandbox import make_sandbox, site_packages
from support import CLI, ROOT
from userfix import FIX002_HEADER, LOGGING_UTILS, write_fix001, write_fix002

STATE = ".speculators-patch"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def cli(*args: str, env: dict | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    """The real CLI, run from a directory that is not the fix's (a new user's shell)."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("SPECULATORS_PATCH_FAULT")}
    full.update({"PYTHONPATH": str(ROOT), **(env or {})})
    return subprocess.run([*CLI, *args], capture_output=True, text=True, env=full, cwd="/", timeout=timeout)


# --- What is true of an install, read directly (not through the tool) ---------------------


def record_digests(site: Path) -> dict[str, str]:
    """pip's RECORD: sha256 of every speculators .py file as installed."""
    info = next(site.glob("speculators-*.dist-info"))
    found = {}
    for line in (info / "RECORD").read_text().splitlines():
        path, _, rest = line.partition(",")
        digest = rest.partition(",")[0]
        if path.startswith("speculators/") and path.endswith(".py") and digest.startswith("sha256="):
            raw = digest[len("sha256=") :]
            found[path] = base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)).hex()
    return found


def base_bytes(record: dict[str, str], path: str) -> bytes:
    """``path`` as the speculators 0.3.0 wheel has it (its RECORD digest checked)."""
    import zipfile

    from sandbox import wheel

    with zipfile.ZipFile(wheel("speculators", "0.3.0")) as z:
        data = z.read(path)
    assert sha(data) == record[path]
    return data


def manifest(site: Path) -> dict | None:
    path = site / STATE / "manifest.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def copies(site: Path) -> dict[str, set[str]]:
    """Verified pristine copies: path -> digests."""
    top = site / STATE / "pristine"
    found: dict[str, set[str]] = {}
    for p in top.rglob("*") if top.is_dir() else []:
        if p.is_file():
            path, _, named = str(p.relative_to(top)).partition(".sha256-")
            if named and sha(p.read_bytes()) == named:
                found.setdefault(path, set()).add(named)
    return found


def files(site: Path, record: dict[str, str]) -> dict[str, bytes | None]:
    return {p: (site / p).read_bytes() if (site / p).exists() else None for p in record}


def covered(site: Path, record: dict[str, str]) -> set[str]:
    """Files that can be had back as pip installed them: they are pip's bytes, or the
    manifest records them with a verified pristine copy."""
    m = manifest(site) or {}
    kept = copies(site)
    out = set()
    for path, data in files(site, record).items():
        entry = (m.get("files") or {}).get(path)
        if data is not None and sha(data) == record[path]:
            out.add(path)
        elif isinstance(entry, dict) and entry.get("pristine_sha256") in kept.get(path, set()):
            out.add(path)
    return out


def litter(site: Path) -> list[str]:
    return sorted(
        str(p.relative_to(site))
        for p in site.rglob("*")
        if p.name.endswith((".speculators-patch.tmp", ".speculators-patch.old"))
        or p.name in ("journal.json", "cleanup.json")
    )


def true_states(site: Path, record: dict[str, str]) -> dict[str, str]:
    """Each recorded file's state as ``status`` must name it."""
    m = manifest(site) or {}
    out = {}
    for path, entry in (m.get("files") or {}).items():
        data = (site / path).read_bytes()
        out[path] = (
            "patched"
            if sha(data) == entry["patched_sha256"]
            else "reinstalled"
            if sha(data) == entry["pristine_sha256"]
            else "modified"
        )
    return out


# --- The states a user fix can leave an install in ------------------------------------------


def build_states(top: Path) -> tuple[dict[str, Path], Path, Path]:
    """Each state in an environment of its own (later copied per trial by hard links: the
    tool replaces files by rename, never in place). Returns them, FIX002's and FIX001's files."""
    fixes = top / "fixes"
    fix2, fix1 = write_fix002(fixes), write_fix001(fixes)
    base = make_sandbox(top / "base", link=True)
    states: dict[str, Path] = {}

    def fresh(name: str) -> Path:
        env = top / "states" / name
        env.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["cp", "-a", str(base), str(env)], check=True)
        states[name] = env
        return env

    def run(env: Path, *args: str, codes=(0, 1)) -> None:
        r = cli(*args, "--target", str(env))
        assert r.returncode in codes, (args, r.stdout, r.stderr)

    fresh("pristine")
    run(fresh("applied"), "apply", "--patch-file", str(fix2))
    run(fresh("applied-alone"), "apply", "--patch-file", str(fix2), "--only", "FIX002")
    run(fresh("applied-with-fix001"), "apply", "--patch-file", str(fix2), "--patch-file", str(fix1))
    env = fresh("fix-reverted")
    run(env, "apply", "--patch-file", str(fix2))
    run(env, "revert", "--only", "FIX002")
    env = fresh("hand-edited")
    run(env, "apply", "--patch-file", str(fix2))
    with (site_packages(env) / LOGGING_UTILS).open("a") as f:
        f.write("# a hand edit after patching\n")
    env = fresh("reinstalled")
    run(env, "apply", "--patch-file", str(fix2))
    site = site_packages(env)
    (site / LOGGING_UTILS).write_bytes((site_packages(base) / LOGGING_UTILS).read_bytes())
    env = fresh("manifest-lost")
    run(env, "apply", "--patch-file", str(fix2))
    (site_packages(env) / STATE / "manifest.json").unlink()
    env = fresh("copy-lost")
    run(env, "apply", "--patch-file", str(fix2))
    for p in (site_packages(env) / STATE / "pristine").rglob("logging_utils.py.sha256-*"):
        p.unlink()
    env = fresh("lost-by-an-older-tool")  # what issue 23's full revert left: patched bytes, no record, no copy
    site = site_packages(env)
    (site / LOGGING_UTILS).write_bytes(b"# FIX002: reviewed for this vLLM\n" + (site / LOGGING_UTILS).read_bytes())
    # An apply killed half-way through its file writes: left at its own path per trial
    # (``interrupt``: a journal names absolute paths), and once moved with its state.
    fresh("interrupted")
    interrupt(fresh("interrupted-then-moved"), fix2)
    moved = top / "states" / "interrupted-then-moved"
    states["interrupted-then-moved"] = moved.rename(moved.with_name("moved-elsewhere"))
    env = fresh("source-changed")
    run(env, "apply", "--patch-file", str(fix2))
    return states, fix2, fix1


def interrupt(env: Path, fix2: Path) -> None:
    """Leave ``env`` as an ``apply`` killed between two of its file writes leaves it."""
    steps = env.parent / f"{env.name}.steps"
    probe = env.parent / f"{env.name}.probe"
    shutil.rmtree(probe, ignore_errors=True)
    subprocess.run(["cp", "-al", str(env), str(probe)], check=True)
    cli(
        "apply",
        "--patch-file",
        str(fix2),
        "--target",
        str(probe),
        env={"SPECULATORS_PATCH_FAULT": "log", "SPECULATORS_PATCH_FAULT_LOG": str(steps)},
    )
    shutil.rmtree(probe)
    writes = [i for i, line in enumerate(steps.read_text().splitlines(), 1) if line.split(" ", 2)[1] == "rename"]
    steps.unlink()
    cli(
        "apply",
        "--patch-file",
        str(fix2),
        "--target",
        str(env),
        env={"SPECULATORS_PATCH_FAULT": f"kill@{writes[len(writes) // 2]}"},
    )
    assert (site_packages(env) / STATE / "journal.json").exists()


COMMANDS = [
    ("status",),
    ("verify",),
    ("diff",),
    ("apply",),
    ("apply", "--dry-run"),
    ("apply", "--adopt"),
    ("revert",),
    ("revert", "--only", "FIX002"),
    ("revert", "--only", "SP004"),
    ("revert", "--force"),
    ("repair",),
]


def _expected_refusal(state: str, command: tuple[str, ...], with_file: bool) -> str | None:
    """The refusals the documentation promises (the fragment the one line must hold):
    damaged state -> ``repair`` (or, with no copy left, reinstall); a hand-edited file ->
    ``--force``; an edited fix -> ``revert --only FIX002`` first; a reinstalled file whose
    fix must run again -> its ``--patch-file``. Anything else must work."""
    sub = command[0]
    if state in ("manifest-lost", "interrupted-then-moved") and sub != "repair":
        return "repair"
    if (
        state in ("pristine", "fix-reverted", "lost-by-an-older-tool", "interrupted")
        and not with_file
        and "FIX002" in command
    ):  # (an interrupted apply is rolled back first: FIX002 was never applied)
        return "this target's record names no such patch"
    if state == "applied-with-fix001" and not with_file and command == ("revert", "--only", "SP004"):
        return "--patch-file"  # FIX001 shares SP004's file: re-deriving it needs FIX001's source
    if state == "copy-lost":
        return "reinstall" if sub == "repair" else "repair"
    if state == "lost-by-an-older-tool" and with_file and sub in ("status", "apply", "diff", "revert"):
        return "repair"  # FIX002's bytes in a file pip did not install, and no record: nothing tells them apart
    if state == "hand-edited" and command in (("revert",), ("revert", "--only", "FIX002")):
        return "--force"
    if state == "hand-edited" and not with_file and command == ("apply", "--adopt"):
        return "--patch-file"  # the edit is re-based onto the kept copy: FIX002 must run again
    if state == "source-changed" and with_file and sub in ("apply", "diff"):
        return "revert --only FIX002"
    if state == "reinstalled" and not with_file and sub in ("apply", "diff"):
        return "--patch-file"
    return None


def trial(
    top: Path, state: str, env: Path, command: tuple[str, ...], with_file: bool, fix2: Path, fix1: Path
) -> list[str]:
    """Run one command on a copy of ``state``'s environment; the findings (empty: clean)."""
    work = top / "trials" / f"{state}-{'-'.join(command)}-{with_file}".replace("/", "_")
    if work.exists():
        shutil.rmtree(work)
    work.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-al", str(env), str(work)], check=True)
    if state == "interrupted":
        interrupt(work, fix2)
    site = site_packages(work)
    record = record_digests(site)
    if state == "source-changed" and with_file:  # the user edited the fix since applying it
        edited = fix2.with_name("fix002_edited.py")
        edited.write_text(fix2.read_text().replace("a header comment", "a header comment, reworded"))
        patch_args = ["--patch-file", str(edited), "--patch-file", str(fix1)]
    else:
        patch_args = ["--patch-file", str(fix2), "--patch-file", str(fix1)] if with_file else []
    before_files, before_covered = files(site, record), covered(site, record)
    r = cli(*command, "--target", str(work), *patch_args)
    findings = []
    what = f"{state} / {' '.join(command)} / {'with' if with_file else 'without'} --patch-file"
    err = r.stderr.strip().splitlines()
    if "Traceback" in r.stderr or r.returncode not in (0, 1, 2):
        findings.append(f"{what}: crashed (exit {r.returncode}): {r.stderr[-400:]}")
        return findings
    expected = _expected_refusal(state, command, with_file)
    if r.returncode == 2:
        if len(err) != 1 or not err[0].startswith("error: "):
            findings.append(f"{what}: a refusal that is not one error: line: {r.stderr!r}")
        elif expected is None:
            findings.append(f"{what}: refused where it should work: {err[0]}")
        elif expected not in err[0]:
            findings.append(f"{what}: refused without naming the way out ({expected!r}): {err[0]}")
    elif expected is not None:
        findings.append(f"{what}: expected a refusal naming {expected!r}, got exit {r.returncode}")
    after_files, after_covered = files(site, record), covered(site, record)
    changed = sorted(p for p in record if before_files[p] != after_files[p])
    # nothing lost
    for path in sorted(before_covered - after_covered):
        findings.append(f"{what}: {path} can no longer be restored (its pristine copy or record is gone)")
    if state == "hand-edited" and command != ("revert", "--force") and LOGGING_UTILS in changed:
        findings.append(f"{what}: the hand edit of {LOGGING_UTILS} was overwritten")
    if r.returncode == 2 and changed:
        findings.append(f"{what}: refused, yet changed {changed}")
    # issue 30: what --adopt keeps as a pristine copy is never a fix's bytes, and revert then
    # gives back stock speculators plus the edit
    if command == ("apply", "--adopt") and r.returncode in (0, 1):
        top = site / STATE / "pristine"
        for copy in top.rglob("*.sha256-*") if top.is_dir() else []:
            if FIX002_HEADER.encode() in copy.read_bytes():
                findings.append(f"{what}: kept FIX002's bytes as the pristine copy {copy.relative_to(top)}")
        if state == "hand-edited" and with_file:
            back = cli("revert", "--target", str(work), *patch_args)
            stock_and_edit = base_bytes(record, LOGGING_UTILS) + b"# a hand edit after patching\n"
            if back.returncode != 0 or files(site, record)[LOGGING_UTILS] != stock_and_edit:
                findings.append(
                    f"{what}: revert after it did not give back the stock file plus the edit: "
                    f"{back.stderr.strip() or back.stdout.splitlines()[-1:]}"
                )
    # whole
    if litter(site) and (r.returncode != 2 or not state.startswith("interrupted")):
        findings.append(f"{what}: left {litter(site)}")
    # true
    out = r.stdout
    if command == ("status",) and r.returncode in (0, 1):  # 1: read, not patched
        for path, truth in true_states(site, record).items():
            if f"  {path}: {truth}" not in out:
                findings.append(f"{what}: status does not say {path}: {truth}")
    if command[0] == "revert" and r.returncode == 0:
        if "nothing to revert" in out and changed:
            findings.append(f"{what}: said nothing to revert but changed {changed}")
        if "restored" in out and f"restored {len(changed)} file(s)" not in out:
            findings.append(f"{what}: restored count is not the {len(changed)} files changed: {out.splitlines()[-3:]}")
    if command == ("apply",) and r.returncode in (0, 1):
        if "nothing to do" in out and changed:
            findings.append(f"{what}: said nothing to do but changed {changed}")
        if re.search(r"^patched \d+ file", out, re.M) and f"patched {len(changed)} file(s)" not in out:
            findings.append(f"{what}: patched count is not the {len(changed)} files changed")
        v = cli("verify", "--target", str(work), *patch_args)
        if (r.returncode == 0) != (v.returncode == 0):
            findings.append(
                f"{what}: apply exit {r.returncode} but verify exit {v.returncode} (calm where verify is not)"
            )
    if command == ("repair",) and r.returncode == 0 and "nothing to repair" in out and (changed or litter(site)):
        findings.append(f"{what}: nothing to repair, yet changed {changed}")
    if command == ("repair",) and r.returncode == 0 and after_covered != set(record):
        findings.append(f"{what}: repair exit 0 while {sorted(set(record) - after_covered)} cannot be restored")
    # after any command but a refusal, the next command sees a whole install
    if r.returncode != 2:
        s = cli("status", "--target", str(work))
        if s.returncode == 2 and "repair" not in s.stderr:  # 1: read, not patched
            findings.append(f"{what}: status afterwards: {s.stderr.strip()}")
    shutil.rmtree(work, ignore_errors=True)
    return findings


def test_every_user_patch_state_times_every_command(tmp_path, figures):
    states, fix2, fix1 = build_states(tmp_path)
    tried, clean, findings = 0, 0, []
    for si, (state, env) in enumerate(states.items()):
        for ci, command in enumerate(COMMANDS):
            for with_file in (False, True):
                if not FULL_SWEEP and (si + ci + with_file) % 4:
                    continue  # sampled: a quarter of the kinds, every state and every command among them
                tried += 1
                found = trial(tmp_path, state, env, command, with_file, fix2, fix1)
                clean += not found
                findings += found
    figures["break test: user-patch states x commands"] = (
        f"{tried} kinds tried ({len(states)} states x {len(COMMANDS)} commands x with/without the fix's file"
        f"{'' if FULL_SWEEP else ', a quarter of them sampled'}), {clean} clean"
    )
    assert not findings, "\n".join(findings)


KILLED = [  # (state, command): each writing command a user fix goes through
    ("pristine", ("apply",), True),
    ("applied", ("revert",), False),
    ("applied", ("revert", "--only", "FIX002"), False),
    ("applied-with-fix001", ("revert", "--only", "SP004"), True),
    ("hand-edited", ("apply", "--adopt"), True),
    ("manifest-lost", ("repair",), True),
]


def test_each_write_of_a_user_patch_commit_killed(tmp_path, figures):
    """Each writing command a user fix goes through, killed at each step of its commit
    (the agent SIGKILLs itself there), then a command without the fix's file: whole."""
    states, fix2, fix1 = build_states(tmp_path)
    tried, clean, findings = 0, 0, []
    for i, (state, command, with_file) in enumerate(KILLED):
        args = ["--patch-file", str(fix2), "--patch-file", str(fix1)] if with_file else []
        probe = tmp_path / "probe"
        shutil.rmtree(probe, ignore_errors=True)
        subprocess.run(["cp", "-al", str(states[state]), str(probe)], check=True)
        log = tmp_path / "steps.log"
        log.unlink(missing_ok=True)
        r = cli(
            *command,
            "--target",
            str(probe),
            *args,
            env={"SPECULATORS_PATCH_FAULT": "log", "SPECULATORS_PATCH_FAULT_LOG": str(log)},
        )
        assert r.returncode in (0, 1), (state, command, r.stderr)
        steps = log.read_text().splitlines() if log.exists() else []
        ends = {}
        points = kill_points(steps)
        if not FULL_SWEEP:  # sampled: every other distinct kill point (alternating start) and the last
            points = sorted(set(points[i % 2 :: 2]) | {points[-1]})
        for k in points:
            work = tmp_path / "killed"
            shutil.rmtree(work, ignore_errors=True)
            subprocess.run(["cp", "-al", str(states[state]), str(work)], check=True)
            site = site_packages(work)
            record = record_digests(site)
            before_covered, before_files = covered(site, record), files(site, record)
            cli(*command, "--target", str(work), *args, env={"SPECULATORS_PATCH_FAULT": f"kill@{k}"})
            s = cli("status", "--target", str(work))  # the next command, without the fix's file
            tried += 1
            what = f"{state} / {' '.join(command)} killed at step {k} ({steps[k - 1]})"
            found = []
            # A repair killed before its commit point leaves the state as damaged as it was:
            # status still refuses, naming repair, and that is the truth.
            still_damaged = state == "manifest-lost" and not (site / STATE / "manifest.json").exists()
            if s.returncode == 2 and not (still_damaged and "repair" in s.stderr):  # 1: read, not patched
                found.append(f"{what}: the next status refused: {s.stderr.strip()}")
            if litter(site):
                found.append(f"{what}: left {litter(site)}")
            # apply --adopt drops the old copy of a file it adopts as it is, at the user's word
            adopted = (
                {LOGGING_UTILS}
                if command == ("apply", "--adopt") and LOGGING_UTILS not in ((manifest(site) or {}).get("files") or {})
                else set()
            )
            for path in sorted(before_covered - covered(site, record) - adopted):
                found.append(f"{what}: {path} can no longer be restored")
            if state == "hand-edited" and files(site, record)[LOGGING_UTILS] != before_files[LOGGING_UTILS]:
                found.append(f"{what}: the hand edit of {LOGGING_UTILS} was overwritten")
            for path, truth in true_states(site, record).items():
                if s.returncode in (0, 1) and f"  {path}: {truth}" not in s.stdout:
                    found.append(f"{what}: status does not say {path}: {truth}")
            ends[json.dumps(sorted(true_states(site, record).items()))] = True
            clean += not found
            findings += found
        assert len(ends) >= 1, (state, command)  # the sweep reached the commit
    figures["break test: user-patch commits killed at each step"] = (
        f"{tried} kills tried ({len(KILLED)} commands, {'every step' if FULL_SWEEP else 'sampled kill points'}), {clean} clean"
    )
    assert not findings, "\n".join(findings)


def _peer(tmp_path: Path, kind: str) -> list[str]:
    """``--exec`` options for a far side that misbehaves: ``echo`` sends its input back,
    ``silent`` reads and never answers, ``hang`` starts the agent's handshake and then
    never answers a request."""
    if kind == "echo":
        return ["--exec", "sh -c cat"]
    if kind == "silent":
        return ["--exec", f"{sys.executable} -c 'import sys; sys.stdin.read()'", "--connect-timeout", "2"]
    hang = tmp_path / "hang.py"
    hang.write_text(
        "import json, os, sys, time\nsize = b''\nwhile not size.endswith(b'\\n'):\n    size += os.read(0, 1)\n"
        "n, buf = int(size), b''\nwhile len(buf) < n:\n    buf += os.read(0, n - len(buf))\n"
        "sys.stdout.write('\\n' + json.loads(buf)['marker'] + '\\n')\nsys.stdout.flush()\ntime.sleep(600)\n"
    )
    return ["--exec", f"{sys.executable} {hang}"]  # with SPECULATORS_PATCH_TIMEOUT=2 (selftest's --timeout is its own)


@pytest.mark.parametrize("kind", ["echo", "silent", "hang"])
def test_every_command_against_a_peer_that_does_not_answer(tmp_path, figures, kind):
    """Each command through ``--exec`` to a far side that echoes, stays silent or stops
    answering: one error: line naming what did not answer, within the bound, nothing
    changed (the local install next to it is untouched)."""
    import time

    tried, clean, findings, slowest = 0, 0, [], 0.0
    words = {"echo": "sent our own input back", "silent": "printed nothing", "hang": "no answer to inspect"}
    for command in COMMANDS + [("selftest",)]:
        tried += 1
        start = time.monotonic()
        r = cli(
            *command,
            *_peer(tmp_path, kind),
            timeout=60,
            env={"SPECULATORS_PATCH_TIMEOUT": "2"} if kind == "hang" else None,
        )
        took = time.monotonic() - start
        slowest = max(slowest, took)
        err = r.stderr.strip().splitlines()
        ok = (
            r.returncode == 2 and len(err) == 1 and err[0].startswith("error: ") and words[kind] in err[0] and took < 15
        )
        clean += ok
        if not ok:
            findings.append(
                f"{kind} / {' '.join(command)}: exit {r.returncode} in {took:.1f} s: {r.stderr.strip()[:300]}"
            )
    figures[f"break test: --exec peer that is {kind}"] = (
        f"{tried} commands tried, {clean} clean (one error: line, nothing changed), slowest {slowest:.1f} s"
    )
    assert not findings, "\n".join(findings)
