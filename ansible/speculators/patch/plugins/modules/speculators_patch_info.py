#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: speculators-patch contributors
# Apache License 2.0 (see the repository's LICENSE)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: speculators_patch_info
short_description: Status, verify findings and vLLM evidence of an installed speculators, as data
version_added: "0.1.0"
description:
  - Reads a target environment on the managed host and returns what C(speculators-patch status)
    and C(speculators-patch verify) print, as data - each file's state, each patch's state, the
    static evidence for every vLLM fact a patch relies on (file, line, what was found), and the
    verdicts of the call-site and import-path checks.
  - Never writes (the agent's read requests only) and never imports vLLM.
  - Like M(speculators.patch.speculators_patch), the reading and checking happen on the controller
    with the speculators-patch installed there; the managed host runs the standard-library agent.
requirements:
  - On the controller, speculators-patch with its C(ansible) extra in the Python that runs Ansible.
  - On the managed host, Python 3.8 or later and the target environment.
author:
  - speculators-patch contributors
options:
  target:
    description:
      - A venv or conda prefix, a C(site-packages) directory or a Python interpreter on the managed
        host. C(~) expands on the managed host.
    type: str
  only:
    description: Narrow the patch checks to these patches (id or name).
    type: list
    elements: str
    default: []
  skip:
    description: Leave these patches out of the patch checks.
    type: list
    elements: str
    default: []
  patch_files:
    description:
      - Your own patches too, as with C(speculators-patch --patch-file) - paths on the controller
        of Python files defining C(PATCH = Patch(...)), loaded on the controller only.
    type: list
    elements: path
    default: []
  verify:
    description: Also run the verify checks (facts with evidence, patch verdicts, call sites, imports).
    type: bool
    default: true
attributes:
  check_mode:
    support: full
    details: Read-only; it runs the same way in check mode.
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Read the state of the patches
  speculators.patch.speculators_patch_info:
    target: ~/ml-env
  register: info

- name: Fail when vLLM and speculators disagree
  ansible.builtin.assert:
    that: info.verify.ok
    fail_msg: "{{ info.verify.patches | rejectattr('verdict', 'equalto', 'ok') | map(attribute='id') | list }}"
"""

RETURN = r"""
speculators:
  description: The installed speculators version and where its source is.
  returned: success
  type: dict
vllm:
  description: The installed vLLM version(s).
  returned: success
  type: str
status:
  description: What C(speculators-patch status --json) returns - C(files) (path to pristine, patched, reinstalled or modified) and C(patches).
  returned: success
  type: dict
  sample: {"files": {"speculators/data_generation/custom_worker.py": "patched"},
           "patches": [{"id": "SP004", "state": "applied"}]}
verify:
  description:
    - What C(speculators-patch verify --json) returns - C(ok), C(facts) (per vLLM fact - holds, file, line,
      found), C(patches) (needed, state, verdict, hint), C(calls), C(imports), C(model_runner).
  returned: success, with verify=true
  type: dict
msg:
  description: One line summary, or the reason for a failure.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.speculators.patch.plugins.module_utils.agent_relay import RELAY_ARGS, relay


def main():
    module = AnsibleModule(
        argument_spec=dict(
            target=dict(type="str"),
            only=dict(type="list", elements="str", default=[]),
            skip=dict(type="list", elements="str", default=[]),
            patch_files=dict(type="list", elements="path", default=[]),
            verify=dict(type="bool", default=True),
            **RELAY_ARGS,
        ),
        supports_check_mode=True,
    )
    relay(module, writes_allowed=False)


if __name__ == "__main__":
    main()
