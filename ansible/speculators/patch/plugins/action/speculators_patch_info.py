# -*- coding: utf-8 -*-
# Copyright: speculators-patch contributors
# Apache License 2.0 (see the repository's LICENSE)
"""Controller half of ``speculators.patch.speculators_patch_info`` (docs: modules/).

Reads the target through the agent (``inspect``; with ``verify`` also ``sources``), then
computes what ``speculators-patch status --json`` and ``verify --json`` report, with the
same verbs (``patcher.commands``); ``msg`` is status's summary and verify's verdict, and
``warnings`` the notes on the install, in the CLI's words. Never commits: the info module
refuses every write request.
"""

from __future__ import annotations

from ansible.plugins.action import ActionBase
from ansible_collections.speculators.patch.plugins.plugin_utils import controller
from ansible_collections.speculators.patch.plugins.plugin_utils.controller import (
    plan_cache_state,
    run_task,
    task_target,
)

MODULE = "speculators.patch.speculators_patch_info"

ARGUMENT_SPEC = dict(
    target=dict(type="str"),
    only=dict(type="list", elements="str", default=[]),
    skip=dict(type="list", elements="str", default=[]),
    patch_files=dict(type="list", elements="path", default=[]),
    verify=dict(type="bool", default=True),
)

# Keys of ``verify --json`` that describe the target (returned once, at the top level).
_DESCRIBE = ("target", "python", "site_packages", "speculators", "speculators_root", "editable_source", "vllm")


class ActionModule(ActionBase):
    """Status and verify findings of one host, as data."""

    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp=None, task_vars=None):
        super().run(tmp, task_vars)
        return run_task(self, task_vars or {}, MODULE, ARGUMENT_SPEC, self._work)

    def _work(self, args: dict, transport) -> dict:
        from patcher.commands import session
        from patcher.commands.common import notes
        from patcher.commands.requests import StatusRequest, VerifyRequest

        patch_set = controller.task_patches(args["patch_files"])
        only, skip = tuple(args["only"]), tuple(args["skip"])
        asked = StatusRequest(only, skip)
        snap, found = session.run(
            transport, lambda snap: asked.run(transport, snap), patches=patch_set
        )  # as the CLI runs it
        patches = found.rows
        result = {
            **task_target(snap),
            "changed": False,
            "plan_cache": plan_cache_state(found.plans),
            "status": {"files": found.files, "patches": patches},
        }
        said = [found.summary]
        if args["verify"]:
            verified = VerifyRequest(only, skip).run(transport, snap)
            result["verify"] = {k: v for k, v in verified.data.items() if k not in _DESCRIBE}
            said.append(verified.summary)
        result["msg"] = "; ".join(said)  # status's summary, then verify's verdict: the CLI's words
        warnings = notes(snap)
        if warnings:
            result["warnings"] = warnings
        return result
