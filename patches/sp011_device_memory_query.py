"""SP011: ask vLLM's workers for available memory instead of torch.cuda.

speculators 0.3.0 sizes the KV cache from torch.cuda.mem_get_info(), which fails on
non-CUDA platforms (the CPU build of vLLM, among others). Every vLLM executor answers
determine_available_memory() (vllm/v1/executor/abstract.py, one value per worker, in
bytes), which is what vLLM's own engine core sizes the KV cache from, on every platform.
The smallest worker's figure bounds the cache, as in vLLM.
"""

import libcst as cst
import libcst.matchers as m

from patcher.cst_helpers import calls_to, replace_statements
from patcher.patch import Patch, PatchCodemod, VllmFact
from patcher.probes import method_defined

CUDA_QUERY = m.Call(func=m.Attribute(value=m.Attribute(m.Name("torch"), m.Name("cuda")), attr=m.Name("mem_get_info")))
QUERY_LINE = m.SimpleStatementLine(body=[m.Assign(value=CUDA_QUERY)])
NEUTRAL = "free_memory = min(self.executor.determine_available_memory())  # bytes, any platform\n"


class PlatformMemoryQuery(PatchCodemod):
    DESCRIPTION = "torch.cuda.mem_get_info() -> min(self.executor.determine_available_memory())"

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        if calls_to(tree, "determine_available_memory"):
            self.already_satisfied("memory is queried through the executor")
        if not m.findall(tree, QUERY_LINE):
            self.refuse(None, "'free_memory, _ = torch.cuda.mem_get_info()'")
        return replace_statements(tree, {QUERY_LINE: NEUTRAL})


PATCH = Patch(
    id="SP011",
    name="device-memory-query",
    version=1,
    title="KV cache sizing: executor.determine_available_memory() instead of torch.cuda",
    file="speculators/data_generation/vllm_hidden_states_generator.py",
    codemod=PlatformMemoryQuery,
    facts=(
        VllmFact(
            summary="executors report available memory per worker, on every platform",
            modules=("vllm/v1/executor/abstract.py",),
            symbol="Executor.determine_available_memory",
            first_release="0.11.0",
            probe=method_defined("vllm/v1/executor/abstract.py", "Executor.determine_available_memory"),
        ),
    ),
    order=110,
    portable=True,
)
