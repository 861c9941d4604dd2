"""SP011: ask vLLM's workers for available memory instead of torch.cuda.

speculators 0.3.0 sizes the KV cache from torch.cuda.mem_get_info(), which fails on
non-CUDA platforms (the CPU build of vLLM, among others). Every vLLM executor answers
determine_available_memory() (vllm/v1/executor/abstract.py, one value per worker, in
bytes), which is what vLLM's own engine core sizes the KV cache from, on every platform.
The smallest worker's figure bounds the cache, as in vLLM.
"""

import libcst.matchers as m

from patcher.fixes.patch import CheckHooks, Patch
from speculators_patch_codemods.executor_memory_query import FACTS, FREE_AND_TOTAL, ExecutorMemoryQuery

ANY_CUDA_QUERY = m.Call(
    func=m.Attribute(value=m.Attribute(m.Name("torch"), m.Name("cuda")), attr=m.Name("mem_get_info"))
)
CUDA_QUERY = m.Call(func=ANY_CUDA_QUERY.func, args=[])


# The replacement, what satisfies it and the vLLM fact: executor_memory_query (SP015's too).
class PlatformMemoryQuery(ExecutorMemoryQuery):
    DESCRIPTION = "torch.cuda.mem_get_info() -> min(self.executor.determine_available_memory())"
    MATCH = m.SimpleStatementLine(body=[m.Assign(targets=FREE_AND_TOTAL, value=CUDA_QUERY)])
    TOUCHES = ANY_CUDA_QUERY
    EXPECTED = "'free_memory, _ = torch.cuda.mem_get_info()'"


PATCH = Patch(
    id="SP011",
    name="device-memory-query",
    version=1,
    title="KV cache sizing: executor.determine_available_memory() instead of torch.cuda",
    risk="the KV cache cannot be sized off CUDA (torch.cuda.mem_get_info)",
    file="speculators/data_generation/vllm_hidden_states_generator.py",
    codemod=PlatformMemoryQuery,
    facts=FACTS,
    order=110,
    portable=True,
    checks=CheckHooks(
        engine_steps=("determine_available_memory",),
        symptoms=(r"mem_get_info|Torch not compiled with CUDA|Found no NVIDIA driver",),
    ),
)
