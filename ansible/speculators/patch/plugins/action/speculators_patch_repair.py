# -*- coding: utf-8 -*-
# Copyright: speculators-patch contributors
# Apache License 2.0 (see the repository's LICENSE)
"""Controller half of ``speculators.patch.speculators_patch_repair`` (docs: modules/).

``speculators-patch repair`` on one host, through the CLI's own verb
(``patcher.commands.repair``): it reads the target through the agent, has the agent finish or
salvage what an interrupted commit left, reads again, and commits the rebuilt record (module
runs: ``inspect``, ``repair``, ``inspect``, ``commit``). ``msg`` is repair's summary and
``warnings`` its notes on the install, in the CLI's words. Not in check mode: repair writes.
"""

from __future__ import annotations

from ansible.plugins.action import ActionBase
from ansible_collections.speculators.patch.plugins.plugin_utils import controller
from ansible_collections.speculators.patch.plugins.plugin_utils.controller import run_task, task_target

MODULE = "speculators.patch.speculators_patch_repair"

ARGUMENT_SPEC = dict(
    target=dict(type="str"),
    patch_files=dict(type="list", elements="path", default=[]),
)


class ActionModule(ActionBase):
    """Rebuild a damaged or lost record on one host."""

    _supports_check_mode = False
    _supports_async = False

    def run(self, tmp=None, task_vars=None):
        super().run(tmp, task_vars)
        return run_task(self, task_vars or {}, MODULE, ARGUMENT_SPEC, self._work)

    def _work(self, args: dict, transport) -> dict:
        from patcher.commands.repair import repair

        done = repair(transport, controller.task_patches(args["patch_files"]))
        result = {
            **task_target(done.result.snap),
            "changed": done.changed,
            "was": done.was,
            "files": done.lines,
            "unrestorable": done.result.unrestorable,
            "msg": done.summary,
        }
        if done.exit_code:  # the CLI's exit 1: nothing here restores these files
            result["failed"] = True
        if done.notes:
            result["warnings"] = done.notes
        return result
