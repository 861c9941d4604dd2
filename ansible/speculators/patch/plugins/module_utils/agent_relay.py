# -*- coding: utf-8 -*-
# Copyright: speculators-patch contributors
# Apache License 2.0 (see the repository's LICENSE)
"""The managed-host half of the collection: hand one request to speculators-patch's agent.

The action plugin on the controller sends, as private module arguments, the two programs
the CLI sends over ``--host`` -- ``patcher/agent/bootstrap.py`` and the agent package
``patcher/agent/`` (through ``loader.py``), byte for byte from the controller's installed speculators-patch --
and one agent request (``inspect`` or ``commit``). This relay runs the bootstrap under the
module's interpreter with the same length-prefixed header the SSH transport writes; the
bootstrap resolves ``target`` here (so ``~`` is this host's home) and execs the target's
own interpreter on the agent, which answers with one JSON line. Standard library only.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import sys

# Private arguments every module of the collection accepts; only the action plugin sets them.
RELAY_ARGS = dict(
    _agent=dict(type="str", no_log=False),
    _bootstrap=dict(type="str", no_log=False),
    _request=dict(type="dict"),
    _where=dict(type="str"),
)

READ_ONLY_OPS = ("inspect", "sources")


def relay(module, writes_allowed):
    """Run one agent request; ``exit_json(answer=...)`` with the agent's JSON answer.

    ``writes_allowed``: False for the read-only info module. A ``commit`` is refused in
    check mode whatever the caller says, so ``--check`` cannot write even by mistake.
    """
    params = module.params
    request = params["_request"]
    if not request or not params["_agent"] or not params["_bootstrap"]:
        module.fail_json(
            msg="this module runs through its action plugin on the controller, which needs "
            "speculators-patch installed there (pip install 'speculators-patch[ansible]')"
        )
    op = request.get("op")
    if op not in READ_ONLY_OPS and (module.check_mode or not writes_allowed):
        module.fail_json(
            msg="refusing agent request %r: %s" % (op, "check mode" if module.check_mode else "read-only module")
        )
    where = params["_where"] or "managed host"
    marker = "speculators-patch-agent-%s" % os.urandom(8).hex()
    header = json.dumps(
        {"target": params["target"], "agent": params["_agent"], "where": where, "marker": marker}
    ).encode("utf-8")
    stdin = b"%d\n" % len(header) + header + json.dumps(request).encode("utf-8") + b"\n"
    rc, out, err = module.run_command(
        [sys.executable, "-c", params["_bootstrap"]], data=stdin, binary_data=True, encoding=None
    )
    lines = out.splitlines()
    answer = None
    if marker.encode() in lines:
        rest = [line for line in lines[lines.index(marker.encode()) + 1 :] if line.strip()]
        if rest:
            try:
                answer = json.loads(rest[0].decode("utf-8"))
            except ValueError:
                answer = None
    if answer is None:
        last = [line for line in err.decode("utf-8", "replace").splitlines() if line.strip()]
        module.fail_json(
            msg="%s: the agent ended (status %d) without answering %s: %s"
            % (where, rc, op, last[-1] if last else "no output")
        )
    module.exit_json(changed=False, answer=answer)
