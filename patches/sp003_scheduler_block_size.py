"""SP003: pass the block size the Scheduler now requires.

vLLM >= 0.12 (vllm/v1/core/sched/scheduler.py, Scheduler.__init__) takes a required
`block_size`; speculators 0.3.0 omits it (TypeError). The value is the KV cache block
size the generator configured (cache_config.block_size), as vLLM's engine core passes.
"""

from patcher.fixes.codemods import AddKeyword
from patcher.fixes.patch import CheckHooks, Patch, VllmFact
from patcher.fixes.probes import parameter_required


class PassBlockSize(AddKeyword):
    DESCRIPTION = "Scheduler(...) -> Scheduler(..., block_size=cache_config.block_size)"
    CALLEE = "Scheduler"
    KEYWORD = "block_size"
    VALUE = "self.vllm_config.cache_config.block_size"
    ACCEPTED = ("VLLM_BLOCK_SIZE",)


PATCH = Patch(
    id="SP003",
    name="scheduler-block-size",
    version=1,
    title="Scheduler: pass the required block_size",
    risk="the generator fails to start: the Scheduler requires block_size",
    file="speculators/data_generation/vllm_hidden_states_generator.py",
    codemod=PassBlockSize,
    facts=(
        VllmFact(
            summary="Scheduler.__init__ requires block_size",
            symbol="Scheduler.__init__",
            first_release="0.12.0",
            probe=parameter_required("vllm/v1/core/sched/scheduler.py", "Scheduler.__init__", "block_size"),
        ),
    ),
    order=30,
    checks=CheckHooks(symptoms=(r"missing 1 required positional argument: 'block_size'|block_size",)),
)
