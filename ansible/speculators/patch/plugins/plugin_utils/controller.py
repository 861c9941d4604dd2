# -*- coding: utf-8 -*-
# Copyright: speculators-patch contributors
# Apache License 2.0 (see the repository's LICENSE)
"""Controller-side helpers shared by the collection's action plugins.

- ``AnsibleTransport``: speculators-patch's ``Transport`` whose every request is one run of
  the collection's module on the managed host (``module_utils/agent_relay.py``), carrying
  the CLI's own bootstrap and agent. ``patcher.engine`` drives it exactly as it drives the
  local and SSH transports: the same ``inspect`` and ``commit`` requests, the same bytes.
- The verbs are the CLI's (``patcher.commands``), plans included: the engine's plan cache
  (``$SPECULATORS_PATCH_PLAN_CACHE``, else the controller cache) is shared by Ansible's
  forked workers and by the CLI, each set of identical hosts planned once.

Needs speculators-patch (``patcher``) importable by the Python that runs Ansible.
"""

from __future__ import annotations

try:
    from patcher.connect.program import AGENT_PROGRAM, BOOTSTRAP
    from patcher.connect.transport import Transport
    from patcher.errors import UserError
except ImportError as e:  # pragma: no cover - reported as a task failure
    IMPORT_ERROR = (
        f"speculators-patch is not installed in the Python that runs Ansible on the controller "
        f"({e}); install it there: pip install 'speculators-patch[ansible]'"
    )
    Transport = object
else:
    IMPORT_ERROR = None


class AnsibleTransport(Transport):
    """One agent request = one run of ``module`` on the task's host (no process kept open).

    Args:
        action: the running action plugin (its ``_execute_module``).
        module: the collection's module that relays to the agent.
        task_vars: the task's variables.
        target: the ``target`` argument, resolved on the managed host.
        host: the inventory host name (for labels and messages).
        check_mode: run the module in check mode (it then refuses any ``commit``).
    """

    def __init__(self, action, module: str, task_vars: dict, target: str | None, host: str) -> None:
        super().__init__()
        self.action, self.module, self.task_vars = action, module, task_vars
        self.target, self.host = target, host
        self.label = f"{host}:{target}" if target else host

    def __enter__(self) -> "AnsibleTransport":
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def request(self, op: str, **payload: object) -> dict:
        """Run the module once with this request; the agent's answer, or ``UserError``."""
        self.exchanges += 1
        result = self.action._execute_module(
            module_name=self.module,
            module_args={
                "target": self.target,
                "_agent": AGENT_PROGRAM,
                "_bootstrap": BOOTSTRAP,
                "_request": {"op": op, **payload},
                "_where": self.host,
            },
            task_vars=self.task_vars,
        )
        if result.get("failed") or "answer" not in result:
            message = result.get("msg") or result.get("module_stderr") or "the module failed without a message"
            raise UserError(" ".join(str(message).split()))
        answer = result["answer"]
        if "error" in answer:
            raise UserError(answer["error"])
        return answer["ok"]


def task_target(snap) -> dict:
    """Where the target is, as task result data (``commands.common.describe``, nested)."""
    from patcher.commands.common import describe

    where = describe(snap)
    return {
        "python": where["python"],
        "site_packages": where["site_packages"],
        "speculators": {
            "version": where["speculators"],
            "root": where["speculators_root"],
            "editable_source": where["editable_source"],
        },
        "vllm": where["vllm"],
    }


def plan_cache_state(plans) -> str:
    """``hit`` when every file's plan was read (the plan cache, or the manifest's record of an
    earlier apply), ``miss`` when this task ran a codemod."""
    return "hit" if all(p.reused for p in plans) else "miss"


def text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


def run_task(action, task_vars: dict, module: str, argument_spec: dict, work) -> dict:
    """The frame both action plugins share: validate the arguments, run ``work(args,
    transport)``, turn speculators-patch's ``UserError`` into a task failure with its one
    line, and remove the remote temporary directory. Every way out in the result is said as
    the CLI says it for the task's ``target`` and ``patch_files`` (``Advice``)."""
    result = {}
    validation, args = action.validate_argument_spec(argument_spec=argument_spec)
    if IMPORT_ERROR:
        return {"failed": True, "msg": IMPORT_ERROR}
    host = str(task_vars.get("inventory_hostname", "managed host"))
    target = None if args.get("target") is None else str(args["target"])
    transport = AnsibleTransport(action, module, task_vars, target, host)
    result["target"] = transport.label
    try:
        result.update(work(args, transport))
    except UserError as e:
        result.update(failed=True, msg=str(e))
    finally:
        action._remove_tmp_path(action._connection._shell.tmpdir)
    result["exchanges"] = transport.exchanges
    return worded(result, args)


def worded(result: dict, args: dict) -> dict:
    """``result`` with each way out (``patcher.ways.Way``) said with the task's target options."""
    from patcher import ways
    from patcher.cli.options import Advice, Options

    opts = Options(target=args.get("target"), patch_files=tuple(str(p) for p in args.get("patch_files") or ()))
    return ways.render_all(result, Advice(opts).say)


def task_patches(paths: list[str]):
    """The task's patches: shipped, installed packs and its ``patch_files``, as
    ``--patch-file`` loads them (``patcher.fixes.registry.loaded``: a ``PatchSet``, a value
    of this task alone). Raises ``UserError`` (one line) for a bad file or pack."""
    from patcher.fixes.registry import loaded

    return loaded([str(p) for p in paths])
