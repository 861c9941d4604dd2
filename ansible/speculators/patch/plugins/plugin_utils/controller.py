# -*- coding: utf-8 -*-
# Copyright: speculators-patch contributors
# Apache License 2.0 (see the repository's LICENSE)
"""Controller-side helpers shared by the collection's action plugins.

- ``AnsibleTransport``: speculators-patch's ``Transport`` whose every request is one run of
  the collection's module on the managed host (``module_utils/agent_relay.py``), carrying
  the CLI's own bootstrap and agent. ``patcher.engine`` drives it exactly as it drives the
  local and SSH transports: the same ``inspect`` and ``commit`` requests, the same bytes.
- ``PlanCache``: plans on disk, keyed by the digest of everything a plan reads, shared by
  Ansible's forked workers through a ``filelock`` lock per key.

Needs speculators-patch (``patcher``) importable by the Python that runs Ansible.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from pathlib import Path

try:
    import patcher
    from patcher import engine
    from patcher.errors import UserError
    from patcher.registry import all_patches
    from patcher.connect.program import AGENT_PROGRAM, BOOTSTRAP
    from patcher.connect.transport import Transport
except ImportError as e:  # pragma: no cover - reported as a task failure
    IMPORT_ERROR = (f"speculators-patch is not installed in the Python that runs Ansible on the controller "
                    f"({e}); install it there: pip install 'speculators-patch[ansible]'")
    Transport = object
else:
    IMPORT_ERROR = None

try:
    from filelock import FileLock
except ImportError:  # pragma: no cover
    FileLock = None


class AnsibleTransport(Transport):
    """One agent request = one run of ``module`` on the task's host (no process kept open).

    Args:
        action: the running action plugin (its ``_execute_module``).
        module: the collection's module that relays to the agent.
        task_vars: the task's variables.
        target: the ``target`` argument, resolved on the managed host.
        host: the inventory host name (for labels and messages).
        check_mode: run the module in check mode (it then refuses any ``commit``).
    """

    def __init__(self, action, module: str, task_vars: dict, target: str | None, host: str) -> None:
        super().__init__()
        self.action, self.module, self.task_vars = action, module, task_vars
        self.target, self.host = target, host
        self.label = f"{host}:{target}" if target else host
        self.inspected: dict | None = None  # the last ``inspect`` answer, for the plan cache key

    def __enter__(self) -> "AnsibleTransport":
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def request(self, op: str, **payload: object) -> dict:
        """Run the module once with this request; the agent's answer, or ``UserError``."""
        self.exchanges += 1
        result = self.action._execute_module(
            module_name=self.module,
            module_args={"target": self.target, "_agent": AGENT_PROGRAM, "_bootstrap": BOOTSTRAP,
                         "_request": {"op": op, **payload}, "_where": self.host},
            task_vars=self.task_vars,
        )
        if result.get("failed") or "answer" not in result:
            message = result.get("msg") or result.get("module_stderr") or "the module failed without a message"
            raise UserError(" ".join(str(message).split()))
        answer = result["answer"]
        if "error" in answer:
            raise UserError(answer["error"])
        if op == "inspect":
            self.inspected = answer["ok"]
        return answer["ok"]


def _digest(value: str | dict | None) -> str | None:
    """A file content of an ``inspect`` answer, named: base64 -> sha256 of that text;
    ``{"sha256": hex}`` (contents the controller cache holds) -> that digest."""
    if isinstance(value, dict):
        return value["sha256"]
    return None if value is None else hashlib.sha256(value.encode("ascii")).hexdigest()


_TOOL_DIGEST: str | None = None


def tool_digest() -> str:
    """sha256 of speculators-patch's own source (engine and codemods): a plan made by other
    code is never reused, even when a codemod changed without a version bump."""
    global _TOOL_DIGEST
    if _TOOL_DIGEST is None:
        import speculators_patch_codemods

        h = hashlib.sha256(patcher.__version__.encode())
        for package in (patcher, speculators_patch_codemods):
            root = Path(package.__file__).parent
            for f in sorted(root.rglob("*.py")):
                h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
        _TOOL_DIGEST = h.hexdigest()
    return _TOOL_DIGEST


def plan_key(inspected: dict, chosen) -> str:
    """The cache key of ``engine.plan(snapshot, chosen)``: digests of everything a plan reads.

    That is the speculators files, the vLLM files the facts are read from (so the facts),
    the target's Python grammar version, the manifest (which patches this tool recorded),
    the selected patches, their versions and (user patches) the sha256 of their files, and
    the tool's own source.
    """
    spec, vllm = inspected["speculators"], inspected["vllm"] or {}
    doc = {
        "tool": tool_digest(),
        "python": inspected["python_version"],
        "patches": [[p.id, p.version, p.source_sha256] for p in chosen],  # a user patch's source too
        "speculators": {"version": spec["version"], "files": {k: _digest(v) for k, v in spec["files"].items()}},
        "vllm": {"versions": vllm.get("versions"), "files": {k: _digest(v) for k, v in (vllm.get("files") or {}).items()}},
        "manifest": inspected["manifest"],
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def default_cache_dir() -> Path:
    explicit = os.environ.get("SPECULATORS_PATCH_PLAN_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("SPECULATORS_PATCH_CACHE") or Path.home() / ".cache" / "speculators-patch"
    return Path(base) / "plans"


class PlanCache:
    """Plans on disk, one JSON file per key; a ``filelock`` lock per key makes the first
    worker compute while the others wait and then read its result.

    A plan holds the bytes after the patches and each patch's outcome per file; the bytes
    before are the snapshot's own (they are part of the key).
    """

    LOCK_TIMEOUT = 900

    def __init__(self, directory: Path | None = None) -> None:
        self.dir = directory or default_cache_dir()

    def plans(self, snap, chosen, inspected: dict) -> tuple[list, str]:
        """``engine.plan(snap, chosen)``, from the cache when possible: (plans, "hit" | "miss")."""
        key = plan_key(inspected, chosen)
        path = self.dir / f"{key}.json"
        if FileLock is None:
            return engine.plan(snap, chosen), "miss"
        self.dir.mkdir(parents=True, exist_ok=True)
        with FileLock(str(path) + ".lock", timeout=self.LOCK_TIMEOUT):
            if path.exists():
                try:
                    return self._load(snap, json.loads(path.read_text(encoding="utf-8"))), "hit"
                except (ValueError, KeyError):
                    pass  # a damaged entry: plan again and replace it
            plans = engine.plan(snap, chosen)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(self._dump(plans)), encoding="utf-8")
            os.replace(tmp, path)
            return plans, "miss"

    @staticmethod
    def _dump(plans) -> dict:
        return {"plans": [{"path": p.path, "before_sha256": engine.sha256(p.before),
                           "after": base64.b64encode(p.after).decode("ascii"),
                           "outcomes": [[o.patch.id, o.state, o.detail] for o in p.outcomes]} for p in plans]}

    @staticmethod
    def _load(snap, data: dict) -> list:
        by_id = {p.id: p for p in all_patches()}
        plans = []
        for entry in data["plans"]:
            before = snap.files[entry["path"]]
            if before is None or engine.sha256(before) != entry["before_sha256"]:
                raise KeyError(entry["path"])
            plan = engine.FilePlan(entry["path"], before, base64.b64decode(entry["after"]))
            plan.outcomes = [engine.Outcome(by_id[pid], state, detail) for pid, state, detail in entry["outcomes"]]
            plans.append(plan)
        return plans


def describe(snap) -> dict:
    """Where the target is, as task result data."""
    return {
        "python": snap.python,
        "site_packages": snap.site_packages,
        "speculators": {"version": snap.speculators_version, "root": snap.speculators_root,
                        "editable_source": snap.editable_source},
        "vllm": snap.vllm.version if snap.vllm else None,
    }


def text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


def run_task(action, task_vars: dict, module: str, argument_spec: dict, work) -> dict:
    """The frame both action plugins share: validate the arguments, run ``work(args,
    transport)``, turn speculators-patch's ``UserError`` into a task failure with its one
    line, and remove the remote temporary directory."""
    result = {}
    validation, args = action.validate_argument_spec(argument_spec=argument_spec)
    if IMPORT_ERROR:
        return {"failed": True, "msg": IMPORT_ERROR}
    host = str(task_vars.get("inventory_hostname", "managed host"))
    target = None if args.get("target") is None else str(args["target"])
    transport = AnsibleTransport(action, module, task_vars, target, host)
    result["target"] = transport.label
    try:
        result.update(work(args, transport))
    except UserError as e:
        result.update(failed=True, msg=str(e))
    finally:
        action._remove_tmp_path(action._connection._shell.tmpdir)
    result["exchanges"] = transport.exchanges
    return result


def use_patch_files(paths: list[str]) -> None:
    """Load the task's ``patch_files`` into this worker's registry, as ``--patch-file`` does
    (each Ansible worker is its own process). Raises ``UserError`` (one line) for a bad file."""
    if paths:
        from patcher.registry import use_patch_files as load

        load([str(p) for p in paths])


def with_reread(transport, attempt):
    """``attempt(snapshot)``; once more on a fresh snapshot when a file changed between the
    read and the commit (another writer got there first), as the CLI does."""
    snap = engine.read_snapshot(transport)
    try:
        return attempt(snap)
    except UserError as e:
        if not str(e).startswith("changed-since-read"):
            raise
        return attempt(engine.read_snapshot(transport))
