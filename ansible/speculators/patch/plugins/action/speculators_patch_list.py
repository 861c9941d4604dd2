# -*- coding: utf-8 -*-
# Copyright: speculators-patch contributors
# Apache License 2.0 (see the repository's LICENSE)
"""Controller half of ``speculators.patch.speculators_patch_list`` (docs: modules/).

What ``speculators-patch list`` says, as data: every patch the speculators-patch installed
here knows (shipped, installed packs, ``patch_files``) with the vLLM facts it depends on
(``patcher.commands.listing``, the CLI's verb). It reads no host: the module never runs.
"""

from __future__ import annotations

from ansible.plugins.action import ActionBase
from ansible_collections.speculators.patch.plugins.plugin_utils import controller

ARGUMENT_SPEC = dict(
    patch_files=dict(type="list", elements="path", default=[]),
)


class ActionModule(ActionBase):
    """Every patch, as ``speculators-patch list --json`` lists it."""

    _supports_check_mode = True
    _supports_async = False
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        super().run(tmp, task_vars)
        _, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        if controller.IMPORT_ERROR:
            return {"failed": True, "msg": controller.IMPORT_ERROR}
        from patcher.commands.listing import listing
        from patcher.errors import UserError

        try:
            done = listing(controller.task_patches(args["patch_files"]))
        except UserError as e:
            return {"failed": True, "changed": False, "msg": str(e)}
        return {"changed": False, "patches": done.rows, "msg": done.summary}
