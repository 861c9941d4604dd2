#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: speculators-patch contributors
# Apache License 2.0 (see the repository's LICENSE)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: speculators_patch_list
short_description: Every patch speculators-patch knows, with the vLLM facts it depends on
version_added: "0.2.0"
description:
  - Returns what C(speculators-patch list --json) prints - every patch (shipped, installed patch
    packs, O(patch_files)) with its id, name, version, file, the vLLM facts it depends on and the
    patches it requires.
  - Runs on the controller only, with the speculators-patch installed there; it reads no host.
requirements:
  - On the controller, speculators-patch with its C(ansible) extra in the Python that runs Ansible.
author:
  - speculators-patch contributors
options:
  patch_files:
    description:
      - Your own patches too, as with C(speculators-patch list --patch-file) - paths on the controller
        of Python files defining C(PATCH = Patch(...)).
    type: list
    elements: path
    default: []
attributes:
  check_mode:
    support: full
    details: Read-only; it runs the same way in check mode.
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: List the patches
  speculators.patch.speculators_patch_list:
  register: listed
  run_once: true

- name: Show their ids
  ansible.builtin.debug:
    msg: "{{ listed.patches | map(attribute='id') | list }}"
"""

RETURN = r"""
patches:
  description: One entry per patch, as C(speculators-patch list --json) - id, name, version, file, title, origin, facts, requires.
  returned: success
  type: list
  elements: dict
  sample: [{"id": "SP004", "name": "disable-prefix-caching", "version": 1, "origin": "shipped", "requires": []}]
msg:
  description: One line - how many patches, and where they come from; or the reason for a failure.
  returned: always
  type: str
  sample: "29 patch(es): 29 shipped"
"""

from ansible.module_utils.basic import AnsibleModule


def main():
    module = AnsibleModule(
        argument_spec=dict(patch_files=dict(type="list", elements="path", default=[])), supports_check_mode=True
    )
    module.fail_json(
        msg="this module runs through its action plugin on the controller, which needs "
        "speculators-patch installed there (pip install 'speculators-patch[ansible]')"
    )


if __name__ == "__main__":
    main()
