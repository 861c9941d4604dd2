# -*- coding: utf-8 -*-
# Copyright: speculators-patch contributors
# Apache License 2.0 (see the repository's LICENSE)
"""Controller half of ``speculators.patch.speculators_patch`` (the module's docs: modules/).

Reads the target through the agent (one module run: ``inspect``), plans with the libcst
codemods of the speculators-patch installed here (from the plan cache when another host or
worker already planned the same bytes), and, unless in check mode, commits through the
agent (a second module run: ``commit``, all-or-nothing under the lock on the host).
"""

from __future__ import annotations

from ansible.plugins.action import ActionBase

from ansible_collections.speculators.patch.plugins.plugin_utils import controller
from ansible_collections.speculators.patch.plugins.plugin_utils.controller import describe, run_task, text, with_reread

MODULE = "speculators.patch.speculators_patch"

ARGUMENT_SPEC = dict(
    target=dict(type="str"),
    state=dict(type="str", default="patched", choices=["patched", "reverted"]),
    only=dict(type="list", elements="str", default=[]),
    skip=dict(type="list", elements="str", default=[]),
    patch_files=dict(type="list", elements="path", default=[]),
    force=dict(type="bool", default=False),
)


class ActionModule(ActionBase):
    """Apply or revert speculators-patch's patches on one host."""

    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp=None, task_vars=None):
        super().run(tmp, task_vars)
        return run_task(self, task_vars or {}, MODULE, ARGUMENT_SPEC, self._work)

    def _work(self, args: dict, transport) -> dict:
        from patcher import engine
        from patcher.registry import select

        check = bool(self._task.check_mode)
        controller.use_patch_files(args["patch_files"])
        only, skip = tuple(args["only"]), tuple(args["skip"])
        chosen = select(only, skip, "requires") if args["state"] == "patched" else None
        cache = {"state": None}

        if args["state"] == "patched":
            def attempt(snap):
                engine.check_supported(snap)
                engine.check_covered(snap)
                plans, cache["state"] = controller.PlanCache().plans(snap, chosen, transport.inspected)
                return snap, engine.apply(transport, snap, chosen, dry_run=check, plans=plans)
        else:
            def attempt(snap):
                chosen = select(only, skip, "dependents", snap.applied_ids())
                return snap, engine.revert(transport, snap, chosen, partial=bool(args["only"] or args["skip"]),
                                           force=args["force"], dry_run=check)

        snap, outcome = with_reread(transport, attempt)
        changing = [p for p in outcome.plans if p.changed]
        changed = bool(changing) if check else bool(outcome.written)
        result = {**describe(snap), "changed": changed, "written": outcome.written,
                  "files": [{"path": p.path, "state": snap.file_state(p.path),
                             "before_sha256": engine.sha256(p.before), "after_sha256": engine.sha256(p.after),
                             "changed": p.changed} for p in outcome.plans]}
        if args["state"] == "patched":
            result["plan_cache"] = cache["state"]
            result["patches"] = [
                {"id": o.patch.id, "name": o.patch.name, "version": o.patch.version, "file": p.path,
                 "state": "applied-now" if (o.state == "pending" and outcome.written) else o.state,
                 "detail": o.detail}
                for p in outcome.plans for o in p.outcomes]
        if self._task.diff and changing:
            result["diff"] = [{"before_header": f"a/{p.path}", "after_header": f"b/{p.path}",
                               "before": text(p.before), "after": text(p.after)} for p in changing]
        verb = "patch" if args["state"] == "patched" else "restore"
        paths = ", ".join(p.path for p in changing)
        if not changing:
            result["msg"] = ("nothing to do: every needed patch is already applied" if args["state"] == "patched"
                             else "nothing to revert: no file needed restoring")
        elif check:
            result["msg"] = f"would {verb} {len(changing)} file(s) under {snap.speculators_root}: {paths}"
        else:
            result["msg"] = f"{verb}ed {len(outcome.written)} file(s) under {snap.speculators_root}: {', '.join(outcome.written)}"
        warnings = []
        if snap.editable_source:
            warnings.append(f"speculators is an editable install: patching the source at {snap.speculators_root}")
        if snap.recovered:
            warnings.append("an interrupted commit was found and rolled back before reading")
        if warnings:
            result["warnings"] = warnings
        return result
