#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: speculators-patch contributors
# Apache License 2.0 (see the repository's LICENSE)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: speculators_patch
short_description: Patch an installed speculators 0.3.0 so it works with the installed vLLM
version_added: "0.1.0"
description:
  - Rewrites the installed C(speculators) 0.3.0 source in a target environment on the managed host
    so that it runs with the vLLM installed there, exactly as C(speculators-patch apply) does;
    C(state=reverted) restores the pristine files byte for byte, as C(speculators-patch revert) does.
  - The work is split the Ansible way. The action plugin runs on the controller; it reads the
    target through speculators-patch's standard-library agent, plans the rewrite with the libcst
    codemods of the speculators-patch installed on the controller, and shows diffs. The module runs
    that same agent on the managed host under the target's own interpreter, which writes the
    files all-or-nothing under a lock, with a journal and pristine backups.
  - Plans are cached on the controller by (speculators file digests, patch set, vLLM source
    digests), across hosts and forked workers, so identical hosts cost one plan.
  - Idempotent; supports check mode (nothing is written) and diff mode (a unified diff per file).
requirements:
  - On the controller, speculators-patch with its C(ansible) extra in the Python that runs Ansible
    (C(pip install 'speculators-patch[ansible]')).
  - On the managed host, Python 3.8 or later and the target environment; nothing else.
author:
  - speculators-patch contributors
options:
  target:
    description:
      - The environment to patch on the managed host, resolved there - a venv or conda prefix,
        a C(site-packages) directory, or a Python interpreter. C(~) expands on the managed host.
      - Default is the environment of the interpreter Ansible runs modules with.
    type: str
  state:
    description:
      - C(patched) applies every patch the installed vLLM needs (restricted by O(only) and O(skip)).
      - C(reverted) restores the pristine files; with O(only) or O(skip) it removes only the selected
        patches and keeps the others.
    type: str
    choices: [patched, reverted]
    default: patched
  only:
    description: Only these patches, by id (C(SP004)) or name (C(disable-prefix-caching)).
    type: list
    elements: str
    default: []
  skip:
    description: Leave out these patches, by id or name.
    type: list
    elements: str
    default: []
  patch_files:
    description:
      - Your own patches too, as with C(speculators-patch --patch-file) - paths on the controller
        of Python files defining C(PATCH = Patch(...)). Loaded on the controller only; the
        managed host needs nothing more. The manifest on the host records each one's id,
        version, source and sha256, as the CLI does.
    type: list
    elements: path
    default: []
  force:
    description: With C(state=reverted), also restore files modified by hand after patching (their edits are lost).
    type: bool
    default: false
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
notes:
  - A failure leaves the install untouched and fails the task with speculators-patch's one-line message.
  - Plans are the CLI's, from its plan cache on the controller, C($SPECULATORS_PATCH_PLAN_CACHE), default C(~/.cache/speculators-patch/fast/plans).
"""

EXAMPLES = r"""
- name: Patch speculators in the training environment
  speculators.patch.speculators_patch:
    target: ~/ml-env
  register: patched

- name: Apply one patch only
  speculators.patch.speculators_patch:
    target: /opt/venvs/train
    only: [SP004]

- name: Back to the pristine files
  speculators.patch.speculators_patch:
    target: ~/ml-env
    state: reverted
"""

RETURN = r"""
target:
  description: The target as given, and the host it was resolved on.
  returned: always
  type: str
  sample: "node1:~/ml-env"
python:
  description: The target's interpreter on the managed host.
  returned: success
  type: str
site_packages:
  description: The target's site-packages directory on the managed host.
  returned: success
  type: str
speculators:
  description: The installed speculators version and where its source is.
  returned: success
  type: dict
  sample: {"version": "0.3.0", "root": "/home/u/ml-env/lib/python3.11/site-packages", "editable_source": null}
vllm:
  description: The installed vLLM version(s).
  returned: success
  type: str
  sample: "0.16.0"
patches:
  description:
    - One entry per selected patch. C(state) is C(applied-now), C(pending) (check mode), C(applied)
      (earlier), C(satisfied), C(not-needed) or C(refused); C(detail) says why.
  returned: success, with state=patched
  type: list
  elements: dict
  sample: [{"id": "SP004", "name": "disable-prefix-caching", "version": 1, "state": "applied-now",
            "file": "speculators/data_generation/vllm_hidden_states_generator.py", "detail": ""}]
files:
  description: Every file the selected patches touch, with its sha256 before and after and whether it changes.
  returned: success
  type: list
  elements: dict
  sample: [{"path": "speculators/data_generation/custom_worker.py", "before_sha256": "9f...",
            "after_sha256": "3c...", "changed": true}]
unfinished:
  description:
    - The commit was made but its clean-up could not finish (one line, with the command that finishes it);
      the task then fails, as the CLI exits 1.
  returned: when the clean-up stopped
  type: str
written:
  description: The files written (empty in check mode and when nothing changed).
  returned: success
  type: list
  elements: str
plan_cache:
  description: C(hit) when every file's plan was read (the controller's plan cache, or the record of an earlier apply), C(miss) when this host computed one.
  returned: success, with state=patched
  type: str
msg:
  description: One line - what was done, or the reason for a failure.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.speculators.patch.plugins.module_utils.agent_relay import RELAY_ARGS, relay


def main():
    module = AnsibleModule(
        argument_spec=dict(
            target=dict(type="str"),
            state=dict(type="str", default="patched", choices=["patched", "reverted"]),
            only=dict(type="list", elements="str", default=[]),
            skip=dict(type="list", elements="str", default=[]),
            patch_files=dict(type="list", elements="path", default=[]),
            force=dict(type="bool", default=False),
            **RELAY_ARGS,
        ),
        supports_check_mode=True,
    )
    relay(module, writes_allowed=True)


if __name__ == "__main__":
    main()
