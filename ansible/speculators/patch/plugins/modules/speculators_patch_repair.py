#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: speculators-patch contributors
# Apache License 2.0 (see the repository's LICENSE)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: speculators_patch_repair
short_description: Rebuild a damaged or lost speculators-patch record on a managed host
version_added: "0.2.0"
description:
  - Does what C(speculators-patch repair) does - rebuilds the record of a target environment on the
    managed host from its files and the verified pristine copies, after finishing or salvaging what
    an interrupted commit left. No speculators file is changed except to finish rolling back such a
    commit where the files allow it.
  - As with M(speculators.patch.speculators_patch), the controller plans and the managed host runs
    speculators-patch's standard-library agent.
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
  patch_files:
    description:
      - Your own patches too, as with C(speculators-patch repair --patch-file) - paths on the controller
        of Python files defining C(PATCH = Patch(...)).
    type: list
    elements: path
    default: []
attributes:
  check_mode:
    support: none
    details: Repair writes the record; the task is skipped in check mode.
  diff_mode:
    support: none
notes:
  - The task fails, in repair's words, when a file differs from what pip installed and nothing kept
    restores it (the CLI's exit 1); reinstalling speculators does.
"""

EXAMPLES = r"""
- name: Rebuild the record
  speculators.patch.speculators_patch_repair:
    target: ~/ml-env
"""

RETURN = r"""
was:
  description: What the record had wrong before the repair, or null.
  returned: success
  type: str
files:
  description: One line per file, as C(speculators-patch repair) prints them.
  returned: success
  type: list
  elements: str
unrestorable:
  description: The files that differ from what pip installed with nothing kept to restore them.
  returned: success
  type: list
  elements: str
msg:
  description: One line - repair's summary, or the reason for a failure.
  returned: always
  type: str
  sample: "nothing to repair: the record already matched the files; checked again"
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.speculators.patch.plugins.module_utils.agent_relay import RELAY_ARGS, relay


def main():
    module = AnsibleModule(
        argument_spec=dict(
            target=dict(type="str"), patch_files=dict(type="list", elements="path", default=[]), **RELAY_ARGS
        ),
        supports_check_mode=False,
    )
    relay(module, writes_allowed=True)


if __name__ == "__main__":
    main()
