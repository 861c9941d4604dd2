"""SP025: hand the requests finished in a batch's last step to the workers (generator).

``generate()`` steps while ``self.scheduler.schedule()`` schedules tokens. The ``schedule()``
that ends the loop (no tokens) is the one carrying ``finished_req_ids``: the requests the
generator finished after the last step (vllm/v1/core/sched/scheduler.py ``Scheduler.schedule``
hands them out once, then forgets them). 0.3.0 never sends that output, so the workers never
hear that those requests ended. The V1 runner does not mind (it drops requests a step does not
schedule from its persistent batch). Model Runner V2 keeps a slot per request
(vllm/v1/worker/gpu/states.py ``RequestState``, ``max_num_seqs`` slots) and frees it only in
``execute_model`` from ``finished_req_ids`` (``update_states`` in 0.12-0.14,
``finish_requests``/``free_states`` from 0.15): every
``generate()`` call leaks its last step's requests, and once they fill the slots the next
one fails with ``AssertionError: No free indices`` (seen on an H200 with vLLM 0.24.0: the
fifth batch of selftest, after 13 + 6 + 24 prompts).

The emitted code sends that last, token-less scheduler output to the executor when it carries
finished requests. Both runners then drop them (V1 and V2 return at once from a step without
tokens, with no sample_tokens to follow).
"""

import libcst as cst
import libcst.matchers as m

from patcher.fixes.cst_helpers import same_code
from patcher.fixes.patch import Patch, PatchCodemod, VllmFact
from patcher.fixes.probes import class_reads
from speculators_patch_codemods import two_phase_step

# while (scheduler_output := self.scheduler.schedule()).total_num_scheduled_tokens > 0:
STEP_LOOP = m.While(
    test=m.Comparison(
        left=m.Attribute(
            value=m.NamedExpr(target=m.Name("scheduler_output")), attr=m.Name("total_num_scheduled_tokens")
        )
    )
)
FLUSH = m.If(test=m.Attribute(m.Name("scheduler_output"), m.Name("finished_req_ids")))
CODE = """\
# The schedule() that ended the loop carries the requests finished in the last step: Model
# Runner V2 frees their slots only when a step brings them (vLLM >= 0.12).
if scheduler_output.finished_req_ids:
    self.executor.execute_model(scheduler_output)
"""


# The flush as this patch writes it, and as SP005 leaves it when it ran after it (two-phase:
# two_phase_step, what SP005 writes).
FLUSHES = (
    CODE,
    "if scheduler_output.finished_req_ids:\n"
    + "".join(f"    {line}\n" for line in two_phase_step.TWO_PHASE.splitlines()),
)


class ReleaseFinishedRequests(PatchCodemod):
    DESCRIPTION = "send the step loop's last (token-less) scheduler output when it finishes requests"

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        for flush in m.findall(tree, FLUSH):
            if not any(same_code(flush, code) for code in FLUSHES):
                self.refuse(flush, f"'{CODE.splitlines()[2]}' with nothing but {CODE.splitlines()[3].strip()!r}")
            self.already_satisfied("the last scheduler output reaches the workers")
        if len(m.findall(tree, STEP_LOOP)) != 1:
            self.refuse(
                None,
                "one 'while (scheduler_output := self.scheduler.schedule())"
                ".total_num_scheduled_tokens > 0:' loop in generate()",
            )
        return tree.visit(_Rewrite())


class _Rewrite(cst.CSTTransformer):
    def leave_While(self, original, updated):
        if not m.matches(original, STEP_LOOP):
            return updated
        body = list(cst.parse_module("pass\n" + CODE).body[1:])
        body[0] = body[0].with_changes(leading_lines=[cst.EmptyLine(indent=False), *body[0].leading_lines])
        return cst.FlattenSentinel([updated, *body])


PATCH = Patch(
    id="SP025",
    name="release-finished-requests",
    version=1,
    title="Generator: send the last scheduler output, so Model Runner V2 frees finished requests",
    risk="under Model Runner V2 finished requests keep their slots: a later batch fails (No free indices)",
    file="speculators/data_generation/vllm_hidden_states_generator.py",
    codemod=ReleaseFinishedRequests,
    facts=(
        VllmFact(
            summary="Model Runner V2 frees a request's slot only from a step's finished_req_ids",
            symbol="GPUModelRunner (scheduler_output.finished_req_ids)",
            first_release="0.12.0",
            probe=class_reads("vllm/v1/worker/gpu/model_runner.py", "GPUModelRunner", "finished_req_ids"),
        ),
    ),
    order=125,
    portable=True,
)
