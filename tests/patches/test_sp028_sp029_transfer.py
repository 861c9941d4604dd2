"""SP028 (worker: captures staged in shared host memory) and SP029 (generator: collected step by
step): the rewrite on speculators 0.3.0 after the patches they build on, the no-op once applied,
and the refusal of what they do not recognise. The emitted code runs in tests/e2e
(test_capture_transfer.py on stand-ins, every engine test on the real vLLM CPU engine)."""

from __future__ import annotations

import pytest
from codemods import codemod, refusal_test, rewrite_test

from speculators_patch_codemods.sp028_stage_captures_in_shared_memory import METHODS as STAGING_METHODS
from speculators_patch_codemods.sp029_collect_captures_per_step import HELPER_CODE

GENERATOR = "speculators/data_generation/vllm_hidden_states_generator.py"
WORKER = "speculators/data_generation/custom_worker.py"

# -- the rewrites and refusals, string to string --------------------------------------------

# The worker extension after SP010 (its per-request getter), cut down.
PER_REQUEST_WORKER = """\
class HiddenStatesWorkerExtension:
    def _get_captured_states_per_request(self):
        return {}
"""

# The generator after SP005, SP006 and SP012, cut down to the statements SP029 reads.
STEPPED_GENERATOR = """\
import torch


class VllmHiddenStatesGenerator:
    def __init__(self):
        self.executor.initialize_from_config(kv_cache_configs)

    def generate(self, token_ids):
        prompt_lens = {}
        self.executor.collective_rpc("_reset_capture")

        while (scheduler_output := self.scheduler.schedule()).total_num_scheduled_tokens > 0:
            model_output = self.executor.execute_model(scheduler_output)
            self.executor.sample_tokens(None)

        captured_states_list = self.executor.collective_rpc(
            "_get_captured_states",
            kwargs={"per_request": True},
        )
        aux_hidden_states = captured_states_list[0]
        return aux_hidden_states
"""

REWRITES = [
    pytest.param(
        "SP028",
        PER_REQUEST_WORKER,
        PER_REQUEST_WORKER + STAGING_METHODS.split("\n", 1)[1],
        id="SP028 the staging methods appended to the class",
    ),
    pytest.param(
        "SP029",
        STEPPED_GENERATOR,
        "import torch\n\n\n"
        + HELPER_CODE
        + """

class VllmHiddenStatesGenerator:
    def __init__(self):
        self.executor.initialize_from_config(kv_cache_configs)
        # Captures reach this process through shared host memory, step by step (speculators-patch SP029).
        self._host_captures = _HostCaptures(self.executor)

    def generate(self, token_ids):
        prompt_lens = {}
        self.executor.collective_rpc("_reset_capture")
        self._host_captures.start(prompt_lens)

        while (scheduler_output := self.scheduler.schedule()).total_num_scheduled_tokens > 0:
            model_output = self.executor.execute_model(scheduler_output)
            self._host_captures.collect()  # the previous step's rows, copied while the GPU runs this one
            self.executor.sample_tokens(None)

        aux_hidden_states = self._host_captures.finish()
        return aux_hidden_states
""",
        id="SP029 the ring mapped at set-up, collected after each step, finished instead of the RPC",
    ),
]

REFUSALS = [
    pytest.param(
        "SP028",
        PER_REQUEST_WORKER.replace("_get_captured_states_per_request", "_get_captured_states"),
        "SP028 applies after SP010",
        id="SP028 SP010 not applied",
    ),
    pytest.param(
        "SP028",
        PER_REQUEST_WORKER + "\n    def _staged_captures(self):\n        return []\n",
        "no methods named _new_batch_check, _stage_step, _staged_captures of its own",
        id="SP028 a method of the user's by a name it adds",
    ),
    pytest.param(
        "SP029",
        STEPPED_GENERATOR.replace("captured_states_list[0]", "captured_states_list[1]"),
        "one 'aux_hidden_states = captured_states_list[0]' in the generator (SP029 applies after SP012)",
        id="SP029 rank 1's reply read",
    ),
    pytest.param(
        "SP029",
        STEPPED_GENERATOR.replace('kwargs={"per_request": True},\n', ""),
        "(SP029 applies after SP012)",
        id="SP029 SP012 not applied",
    ),
]


test_capture_transfer = rewrite_test(REWRITES)


test_capture_transfer_refuses_unknown_code = refusal_test(REFUSALS)


# -- on speculators 0.3.0's files -----------------------------------------------------------


def in_order(source: str, *ids: str) -> str:
    for patch_id in ids:
        verdict, source, detail = codemod(patch_id, source)
        assert verdict == "changed", (patch_id, detail)
    return source


@pytest.fixture
def worker(pristine_sources) -> str:
    return in_order(pristine_sources[WORKER].decode(), "SP009", "SP010", "SP022")


@pytest.fixture
def generator(pristine_sources) -> str:
    return in_order(pristine_sources[GENERATOR].decode(), "SP005", "SP006", "SP012", "SP025")


def test_sp028_adds_the_staging_methods(worker):
    verdict, new, _ = codemod("SP028", worker)
    assert verdict == "changed"
    for method in ("_share_captures", "_stage_step", "_new_batch_check", "_staged_captures"):
        assert new.count(f"def {method}(self") == 1
    assert new.startswith(worker[: worker.index("    def _get_captured_states_per_request")])  # nothing else moved
    compile(new, WORKER, "exec")
    assert codemod("SP028", new)[:2] == ("satisfied", new)


def test_sp028_refuses_without_sp010(pristine_sources):
    src = pristine_sources[WORKER].decode()
    verdict, new, detail = codemod("SP028", src)
    assert (verdict, new) == ("refused", src) and "SP028 applies after SP010" in detail


def test_sp029_collects_in_the_step_loop(generator):
    verdict, new, _ = codemod("SP029", generator)
    assert verdict == "changed"
    assert "captured_states_list" not in new  # the per-request RPC answers through _HostCaptures.finish only
    loop = new[new.index("        while (\n            scheduler_output := self.scheduler.schedule()") :]
    step = "            model_output = self.executor.execute_model(scheduler_output)\n"
    assert (
        loop.index(step) < loop.index("            self._host_captures.collect()") < loop.index("sample_tokens(None)")
    )
    assert new.index("class _HostCaptures:") < new.index("class VllmHiddenStatesGenerator:")
    compile(new, GENERATOR, "exec")
    assert codemod("SP029", new)[:2] == ("satisfied", new)


def test_sp029_on_vllm_011s_step(pristine_sources):
    """On vLLM 0.11 SP005 is not needed: the loop keeps 0.3.0's bare execute_model call."""
    src = in_order(pristine_sources[GENERATOR].decode(), "SP012")
    verdict, new, _ = codemod("SP029", src)
    assert verdict == "changed"
    assert "            self.executor.execute_model(scheduler_output)\n            self._host_captures.collect()" in new


@pytest.mark.parametrize(
    "edit",
    [
        ("aux_hidden_states = captured_states_list[0]", "aux_hidden_states = captured_states_list[1]"),
        ('self.executor.collective_rpc("_reset_capture")', 'self.executor.collective_rpc("_reset_capture", timeout=5)'),
        (
            "            model_output = self.executor.execute_model(scheduler_output)\n",
            "            model_output = self.executor.execute_model(scheduler_output)\n"
            "            model_output = self.executor.execute_model(scheduler_output)\n",
        ),
    ],
    ids=["rank 1's reply read", "the reset RPC edited", "two steps in the loop"],
)
def test_sp029_refuses_what_it_does_not_recognise(generator, edit):
    src = generator.replace(*edit)
    assert src != generator
    verdict, new, detail = codemod("SP029", src)
    assert (verdict, new) == ("refused", src) and "(SP029 applies after SP012)" in detail
