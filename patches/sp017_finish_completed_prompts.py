"""SP017: speculators 0.4.x finishes each prompt once it has run, so every prompt is captured.

speculators 0.4.0/0.4.0.1 (data_generation/vllm_hidden_states_generator.py:287-320) adds
every prompt to vLLM's scheduler, steps while the scheduler schedules tokens, and finishes
the requests only after the loop. A request whose prompt has run stays ``running``; vLLM's
scheduler admits no waiting request while ``max_num_seqs`` requests run
(``Scheduler.schedule``, vllm/v1/core/sched/scheduler.py: ``len(self.running) ==
self.max_num_running_reqs``, every release 0.11-0.17) and schedules no token for a request
whose prompt is computed (the generator never feeds sampled tokens back). With more prompts
than the generator's ``MAX_NUM_SEQS`` (32) the step after the first schedules nothing, the
loop ends, and ``generate()`` raises ``RuntimeError: Request req_0_32 not found in captured
states`` (measured: 41 prompts, vLLM 0.16.0 CPU).

The emitted code ends each step by finishing (``FINISHED_ABORTED``, as the generator
already does after the loop) the requests of that step whose whole prompt has now been
scheduled, which frees their slots and KV blocks for the waiting ones. The generator's own
bookkeeping (``request_num_computed``, ``request_id_to_prompt_len``) decides; a prompt
split across steps (chunked prefill) is finished after its last chunk. The call after the
loop stays: ``Scheduler.finish_requests`` skips ids already finished (0.11: gone from
``self.requests``; 0.12+: ``request.is_finished()``). No vLLM fact: needed on every release.
"""

import libcst as cst
import libcst.matchers as m

from patcher.fixes.cst_helpers import same_code, statements
from patcher.fixes.patch import CheckHooks, Patch, PatchCodemod

SCHEDULE = m.Call(func=m.Attribute(m.Attribute(m.Name("self"), m.Name("scheduler")), m.Name("schedule")))
EXECUTE = m.Call(func=m.Attribute(m.Attribute(m.Name("self"), m.Name("executor")), m.Name("execute_model")))
FINISH = m.Call(func=m.Attribute(attr=m.Name("finish_requests")))
# request_num_computed[req_id] += num_tokens
COUNT = m.AugAssign(target=m.Subscript(value=m.Name("request_num_computed")))
# while (scheduler_output := self.scheduler.schedule()).total_num_scheduled_tokens > 0 ...:
STEP_LOOP = m.While(
    test=m.MatchIfTrue(
        lambda test: bool(m.findall(test, m.NamedExpr(target=m.Name("scheduler_output"), value=SCHEDULE)))
    ),
    body=m.MatchIfTrue(lambda body: bool(m.findall(body, EXECUTE)) and bool(m.findall(body, COUNT))),
)
FINISH_COMPLETED = """\
# Finish the requests whose whole prompt has now run: they free their slot
# (max_num_seqs) and KV blocks for the prompts still waiting.
self.scheduler.finish_requests(
    [
        req_id
        for req_id in scheduler_output.num_scheduled_tokens
        if request_num_computed[req_id] >= request_id_to_prompt_len[req_id]
    ],
    RequestStatus.FINISHED_ABORTED,
)
"""


class FinishCompletedPrompts(PatchCodemod):
    DESCRIPTION = "finish each step's requests whose prompt has run, inside the step loop"

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        loops = m.findall(tree, STEP_LOOP)
        if len(loops) != 1:
            self.refuse(
                loops[1] if loops else None,
                "one 'while (scheduler_output := self.scheduler.schedule())...' loop that calls "
                "self.executor.execute_model and counts request_num_computed[req_id] += num_tokens",
            )
        calls = m.findall(loops[0].body, FINISH)
        if calls:  # 0.4.x finishes requests after the loop: in it, only this patch's statement is known
            ours = {
                id(c)
                for s in m.findall(loops[0].body, m.SimpleStatementLine(body=[m.Expr(FINISH)]))
                if same_code(s, FINISH_COMPLETED)
                for c in m.findall(s, FINISH)
            }
            for call in calls:
                if id(call) not in ours:
                    self.refuse(call, "no finish_requests in the step loop but the one this patch adds")
            self.already_satisfied("the step loop finishes requests whose prompt has run")
        return tree.visit(_Rewrite())


class _Rewrite(cst.CSTTransformer):
    def leave_While(self, original, updated):
        if not m.matches(original, STEP_LOOP):
            return updated
        added = statements(FINISH_COMPLETED, [cst.EmptyLine(indent=False)]).nodes
        return updated.with_changes(body=updated.body.with_changes(body=[*updated.body.body, *added]))


PATCH = Patch(
    id="SP017",
    name="finish-completed-prompts",
    version=1,
    title="Step loop (0.4.x): finish each prompt once it has run, so prompts beyond max_num_seqs are scheduled",
    risk="a batch of more prompts than max_num_seqs fails: finished requests keep their slots",
    file="speculators/data_generation/vllm_hidden_states_generator.py",
    codemod=FinishCompletedPrompts,
    speculators=">=0.4.0,<0.4.1",
    order=140,
    portable=True,
    checks=CheckHooks(symptoms=(r"not found in captured states",)),
)
