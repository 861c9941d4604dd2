# -*- coding: utf-8 -*-
# Copyright: speculators-patch contributors
# Apache License 2.0 (see the repository's LICENSE)
"""Controller half of ``speculators.patch.speculators_patch`` (the module's docs: modules/).

Reads the target through the agent (one module run: ``inspect``), then runs the CLI's own
verbs (``patcher.commands``: apply or revert, with their refusals) with the speculators-patch
installed here -- its plans from the plan cache the CLI uses when another host or worker
already planned the same bytes -- and, unless in check mode, commits through the agent (a
second module run: ``commit``, all-or-nothing under the lock on the host). ``msg`` is the
verb's own summary and ``warnings`` its notes on the install, in the CLI's words.
"""

from __future__ import annotations

from ansible.plugins.action import ActionBase
from ansible_collections.speculators.patch.plugins.plugin_utils import controller
from ansible_collections.speculators.patch.plugins.plugin_utils.controller import (
    plan_cache_state,
    run_task,
    task_target,
    text,
)

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
        from patcher.commands import session
        from patcher.commands.common import notes
        from patcher.commands.requests import ApplyRequest, RevertRequest

        check = bool(self._task.check_mode)
        patch_set = controller.task_patches(args["patch_files"])
        only, skip = tuple(args["only"]), tuple(args["skip"])
        patched = args["state"] == "patched"
        # the CLI's requests: apply (its checks on the result are the info task's) and revert
        if patched:
            request = ApplyRequest(only, skip, dry_run=check, verify_after=False)
        else:
            request = RevertRequest(only, skip, force=args["force"], dry_run=check)
        snap, done = session.run(
            transport, lambda snap: request.run(transport, snap), patches=patch_set
        )  # the CLI's read and retry
        outcome = done.result
        changing = [p for p in outcome.plans if p.changed]
        changed = bool(changing) if check else bool(outcome.written)
        result = {
            **task_target(snap),
            "changed": changed,
            "written": outcome.written,
            "files": [
                {
                    "path": p.path,
                    "state": snap.file_state(p.path),
                    "before_sha256": engine.sha256(p.before),
                    "after_sha256": engine.sha256(p.after),
                    "changed": p.changed,
                }
                for p in outcome.plans
            ],
        }
        if patched:
            result["plan_cache"] = plan_cache_state(outcome.plans)
            result["patches"] = done.rows
        if self._task.diff and changing:
            result["diff"] = [
                {
                    "before_header": f"a/{p.path}",
                    "after_header": f"b/{p.path}",
                    "before": text(p.before),
                    "after": text(p.after),
                }
                for p in changing
            ]
        result["msg"] = done.summary  # the CLI's words, as apply/revert (--dry-run in check mode) print them
        if outcome.unfinished:  # committed, but its clean-up stopped: the CLI exits 1, the task fails
            verb = "apply" if patched else "revert"
            result.update(failed=True, unfinished=outcome.unfinished)
            result["msg"] = f"{done.summary}; {verb}: NOT FINISHED: {outcome.unfinished}"
        warnings = notes(snap)
        if warnings:
            result["warnings"] = warnings
        return result
