"""SP012: the generator finishes each prompt across chunked steps and assembles per request."""

from __future__ import annotations

import pytest
from codemods import codemod, noop_test, refusal_test, rewrite_test

from speculators_patch_codemods.sp012_prefill_to_completion import PATCH

# speculators 0.3.0's generate(), condensed to the statements the patch works on.
BEFORE = """\
class VllmHiddenStatesGenerator:
    def generate(self, token_ids):
        input_ids_list = token_ids
        for i, ids in enumerate(input_ids_list):
            ids_list = list(ids)
            req = Request(request_id=f"req_{i}", prompt_token_ids=ids_list)
            self.scheduler.add_request(req)

        self.executor.collective_rpc("_reset_capture")

        while (scheduler_output := self.scheduler.schedule()).total_num_scheduled_tokens > 0:
            self.executor.execute_model(scheduler_output)

            for req_id in scheduler_output.num_scheduled_tokens:
                self.scheduler.finish_requests([req_id], RequestStatus.FINISHED_ABORTED)

        captured_states_list = self.executor.collective_rpc(
            "_get_captured_states",
        )
        aux_hidden_states = captured_states_list[0]

        log.debug(f"Successfully captured {len(aux_hidden_states)} layers")

        seq_lens = [len(ids) for ids in input_ids_list]
        results = []
        offset = 0
        for i, seq_len in enumerate(seq_lens):
            layer_states = [h[offset : offset + seq_len].clone().cpu() for h in aux_hidden_states]
            results.append({"input_ids": input_ids_list[i], "hidden_states": layer_states})
            offset += seq_len

        return results
"""

AFTER = """\
class VllmHiddenStatesGenerator:
    def generate(self, token_ids):
        input_ids_list = token_ids
        prompt_lens = {}
        for i, ids in enumerate(input_ids_list):
            ids_list = list(ids)
            req = Request(request_id=f"req_{i}", prompt_token_ids=ids_list)
            self.scheduler.add_request(req)
            prompt_lens[req.request_id] = len(ids_list)

        self.executor.collective_rpc("_reset_capture")

        computed = dict.fromkeys(prompt_lens, 0)
        while (scheduler_output := self.scheduler.schedule()).total_num_scheduled_tokens > 0:
            self.executor.execute_model(scheduler_output)

            # vLLM may split a prompt across steps (chunked prefill): finish a request only
            # once its whole prompt has run, so no decode step is ever scheduled for it.
            finished = []
            for req_id, num_tokens in scheduler_output.num_scheduled_tokens.items():
                computed[req_id] += num_tokens
                if computed[req_id] >= prompt_lens[req_id]:
                    finished.append(req_id)
            self.scheduler.finish_requests(finished, RequestStatus.FINISHED_ABORTED)

        # Requests vLLM stopped scheduling before their prompt ended are reported below.
        unfinished = [req_id for req_id, n in computed.items() if n < prompt_lens[req_id]]
        if unfinished:
            self.scheduler.finish_requests(unfinished, RequestStatus.FINISHED_ABORTED)

        captured_states_list = self.executor.collective_rpc(
            "_get_captured_states",
            kwargs={"per_request": True},
        )
        aux_hidden_states = captured_states_list[0]

        log.debug(f"Successfully captured {len(aux_hidden_states)} requests")

        results = []
        # Captures arrive per request; refuse to return anything when a request's rows do
        # not cover exactly its prompt.
        for i, (req_id, seq_len) in enumerate(prompt_lens.items()):
            layer_states = aux_hidden_states.get(req_id)
            if (
                computed[req_id] != seq_len
                or not layer_states
                or any(h.shape[0] != seq_len for h in layer_states)
            ):
                raise RuntimeError(
                    f"Hidden states of request {req_id} do not match its prompt: "
                    f"{seq_len} prompt tokens, {computed[req_id]} scheduled, captured rows "
                    f"per layer {[h.shape[0] for h in layer_states or []]}"
                )
            layer_states = [h.cpu() for h in layer_states]
            results.append({"input_ids": input_ids_list[i], "hidden_states": layer_states})

        return results
"""


def rewrite(src: str) -> tuple[str, str]:
    return codemod(PATCH, src)[:2]


REWRITES = [pytest.param("SP012", BEFORE, AFTER, id="prompts finished once prefilled, captures assembled per request")]

NOOPS = [
    pytest.param("SP012", AFTER, id="already per request"),
    pytest.param(
        "SP012",
        'states = self.executor.collective_rpc("_get_captured_states", kwargs={"per_request": True})\n',
        id="the call already asks per request",
    ),
]

REFUSALS = [
    pytest.param(
        "SP012",
        BEFORE.replace("            offset += seq_len\n", ""),
        "expected speculators 0.3.0's generate()",
        id="slicing loop of another shape",
    ),
    pytest.param(
        "SP012",
        BEFORE.replace("self.scheduler.finish_requests([req_id]", "self.abort([req_id]"),
        "expected speculators 0.3.0's generate()",
        id="step loop aborting another way",
    ),
    pytest.param(
        "SP012",
        BEFORE.replace('"_get_captured_states"', '"_get_states"'),
        "expected speculators 0.3.0's generate()",
        id="another capture RPC",
    ),
]


test_prefill_to_completion = rewrite_test(REWRITES)


@pytest.mark.fast
def test_prefill_to_completion_keeps_unique_reply_rank_for_sp006() -> None:
    src = BEFORE.replace('"_get_captured_states",\n', '"_get_captured_states",\n            unique_reply_rank=0,\n')
    verdict, new = rewrite(src)
    assert verdict == "changed"
    assert (
        '"_get_captured_states",\n            unique_reply_rank=0,\n            kwargs={"per_request": True},\n' in new
    )


def test_prefill_to_completion_on_speculators_0_3_0(pristine_sources) -> None:
    verdict, new = rewrite(pristine_sources["speculators/data_generation/vllm_hidden_states_generator.py"].decode())
    assert verdict == "changed"
    assert "offset" not in new and "seq_lens" not in new
    assert "prompt_lens[req.request_id] = len(ids_list)" in new
    compile(new, "vllm_hidden_states_generator.py", "exec")


test_prefill_to_completion_noop = noop_test(NOOPS)


test_prefill_to_completion_refuses_unknown_code = refusal_test(REFUSALS)
