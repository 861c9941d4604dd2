"""SP028 (worker: captures staged in shared host memory) and SP029 (generator: collected step by
step): the rewrite on speculators 0.3.0 after the patches they build on, the no-op once applied,
and the refusal of what they do not recognise. The emitted code runs in tests/e2e
(test_capture_transfer.py on stand-ins, every engine test on the real vLLM CPU engine)."""

from __future__ import annotations

import pytest

from patcher.engine import run_codemod
from patcher.fixes.registry import loaded

PATCHES = {p.id: p for p in loaded().patches}
GENERATOR = "speculators/data_generation/vllm_hidden_states_generator.py"
WORKER = "speculators/data_generation/custom_worker.py"


def run(patch_id: str, src: str) -> tuple[str, str, str]:
    verdict, new, detail = run_codemod(PATCHES[patch_id], src.encode())
    return verdict, new.decode(), detail


def in_order(source: str, *ids: str) -> str:
    for patch_id in ids:
        verdict, source, detail = run(patch_id, source)
        assert verdict == "changed", (patch_id, detail)
    return source


@pytest.fixture
def worker(pristine_sources) -> str:
    return in_order(pristine_sources[WORKER].decode(), "SP009", "SP010", "SP022")


@pytest.fixture
def generator(pristine_sources) -> str:
    return in_order(pristine_sources[GENERATOR].decode(), "SP005", "SP006", "SP012", "SP025")


def test_sp028_adds_the_staging_methods(worker):
    verdict, new, _ = run("SP028", worker)
    assert verdict == "changed"
    for method in ("_share_captures", "_stage_step", "_new_batch_check", "_staged_captures"):
        assert new.count(f"def {method}(self") == 1
    assert new.startswith(worker[: worker.index("    def _get_captured_states_per_request")])  # nothing else moved
    compile(new, WORKER, "exec")
    assert run("SP028", new)[:2] == ("satisfied", new)


def test_sp028_refuses_without_sp010(pristine_sources):
    src = pristine_sources[WORKER].decode()
    verdict, new, detail = run("SP028", src)
    assert (verdict, new) == ("refused", src) and "SP028 applies after SP010" in detail


def test_sp029_collects_in_the_step_loop(generator):
    verdict, new, _ = run("SP029", generator)
    assert verdict == "changed"
    assert "captured_states_list" not in new  # the per-request RPC answers through _HostCaptures.finish only
    loop = new[new.index("        while (\n            scheduler_output := self.scheduler.schedule()") :]
    step = "            model_output = self.executor.execute_model(scheduler_output)\n"
    assert (
        loop.index(step) < loop.index("            self._host_captures.collect()") < loop.index("sample_tokens(None)")
    )
    assert new.index("class _HostCaptures:") < new.index("class VllmHiddenStatesGenerator:")
    compile(new, GENERATOR, "exec")
    assert run("SP029", new)[:2] == ("satisfied", new)


def test_sp029_on_vllm_011s_step(pristine_sources):
    """On vLLM 0.11 SP005 is not needed: the loop keeps 0.3.0's bare execute_model call."""
    src = in_order(pristine_sources[GENERATOR].decode(), "SP012")
    verdict, new, _ = run("SP029", src)
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
    verdict, new, detail = run("SP029", src)
    assert (verdict, new) == ("refused", src) and "(SP029 applies after SP012)" in detail
