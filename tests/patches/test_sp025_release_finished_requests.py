"""SP025: the step loop's last scheduler output reaches the workers when it finishes requests."""

from __future__ import annotations

import pytest
from codemods import codemod, refusal_test, rewrite_test

from speculators_patch_codemods.sp025_release_finished_requests import PATCH

GENERATE = """\
class VllmHiddenStatesGenerator:
    def generate(self, token_ids):
        while (
            scheduler_output := self.scheduler.schedule()
        ).total_num_scheduled_tokens > 0:
            self.executor.execute_model(scheduler_output)

        return self.executor.collective_rpc("_get_captured_states")
"""

AFTER = """\
class VllmHiddenStatesGenerator:
    def generate(self, token_ids):
        while (
            scheduler_output := self.scheduler.schedule()
        ).total_num_scheduled_tokens > 0:
            self.executor.execute_model(scheduler_output)

        # The schedule() that ended the loop carries the requests finished in the last step: Model
        # Runner V2 frees their slots only when a step brings them (vLLM >= 0.12).
        if scheduler_output.finished_req_ids:
            self.executor.execute_model(scheduler_output)

        return self.executor.collective_rpc("_get_captured_states")
"""


def rewrite(src: str) -> tuple[str, str]:
    return codemod(PATCH, src)[:2]


REWRITES = [pytest.param("SP025", GENERATE, AFTER, id="the output that ended the loop sent when it finishes requests")]

REFUSALS = [
    pytest.param(
        "SP025", GENERATE.replace("scheduler_output :=", "out :="), "scheduler.schedule()", id="another loop variable"
    ),
    pytest.param(
        "SP025",
        GENERATE + "\n    def again(self):\n"
        "        while (scheduler_output := self.scheduler.schedule()).total_num_scheduled_tokens > 0:\n"
        "            pass\n",
        "scheduler.schedule()",
        id="two step loops",
    ),
]


test_sends_the_last_scheduler_output = rewrite_test(REWRITES)


def test_on_speculators_0_3_0(pristine_sources) -> None:
    verdict, new = rewrite(pristine_sources["speculators/data_generation/vllm_hidden_states_generator.py"].decode())
    assert verdict == "changed" and new.count("if scheduler_output.finished_req_ids:") == 1
    compile(new, "vllm_hidden_states_generator.py", "exec")


test_refuses_unknown_loops = refusal_test(REFUSALS)


class Output:
    def __init__(self, tokens, finished=()):
        self.num_scheduled_tokens = tokens
        self.total_num_scheduled_tokens = sum(tokens.values())
        self.finished_req_ids = set(finished)


@pytest.mark.fast
@pytest.mark.parametrize("finished, sent", [(("a", "b"), 3), ((), 2)])
def test_the_emitted_loop_sends_finished_requests_once(finished, sent) -> None:
    """Two steps, then the token-less output: sent only when it finishes requests."""
    namespace: dict = {}
    exec(AFTER, namespace)
    outputs = iter([Output({"a": 2}), Output({"b": 1}, ["x"]), Output({}, finished)])
    calls = []
    gen = namespace["VllmHiddenStatesGenerator"]()
    gen.scheduler = type("S", (), {"schedule": lambda self: next(outputs)})()
    gen.executor = type(
        "E", (), {"execute_model": lambda self, out: calls.append(out), "collective_rpc": lambda self, name: None}
    )()
    gen.generate([])
    assert len(calls) == sent and (sent == 2 or calls[-1].finished_req_ids == {"a", "b"})
