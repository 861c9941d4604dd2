"""SP011: ask vLLM's workers for available memory instead of torch.cuda.

speculators 0.3.0 sizes the KV cache from torch.cuda.mem_get_info(), which fails on
non-CUDA platforms (the CPU build of vLLM, among others). Every vLLM executor answers
determine_available_memory() (vllm/v1/executor/abstract.py, one value per worker, in
bytes), which is what vLLM's own engine core sizes the KV cache from, on every platform.
The smallest worker's figure bounds the cache, as in vLLM.
"""

import libcst.matchers as m

from patcher.fixes.codemods import Replace
from patcher.fixes.patch import Patch, VllmFact
from patcher.fixes.probes import method_defined

ANY_CUDA_QUERY = m.Call(
    func=m.Attribute(value=m.Attribute(m.Name("torch"), m.Name("cuda")), attr=m.Name("mem_get_info"))
)
CUDA_QUERY = m.Call(func=ANY_CUDA_QUERY.func, args=[])
# free_memory, _ = ... (the one shape rewritten: the replacement binds free_memory only)
FREE_AND_TOTAL = [m.AssignTarget(m.Tuple([m.Element(m.Name("free_memory")), m.Element(m.Name("_"))]))]
NEUTRAL = "free_memory = min(self.executor.determine_available_memory())  # bytes, any platform\n"
EXECUTOR_QUERY = m.Call(func=m.Attribute(attr=m.Name("determine_available_memory")))


class PlatformMemoryQuery(Replace):
    DESCRIPTION = "torch.cuda.mem_get_info() -> min(self.executor.determine_available_memory())"
    MATCH = m.SimpleStatementLine(body=[m.Assign(targets=FREE_AND_TOTAL, value=CUDA_QUERY)])
    TOUCHES = ANY_CUDA_QUERY
    REPLACEMENT = NEUTRAL
    SATISFIED = EXECUTOR_QUERY
    SATISFIED_REASON = "memory is queried through the executor"
    EXPECTED = "'free_memory, _ = torch.cuda.mem_get_info()'"


PATCH = Patch(
    id="SP011",
    name="device-memory-query",
    version=1,
    title="KV cache sizing: executor.determine_available_memory() instead of torch.cuda",
    risk="the KV cache cannot be sized off CUDA (torch.cuda.mem_get_info)",
    file="speculators/data_generation/vllm_hidden_states_generator.py",
    codemod=PlatformMemoryQuery,
    facts=(
        VllmFact(
            summary="executors report available memory per worker, on every platform",
            symbol="Executor.determine_available_memory",
            first_release="0.11.0",
            probe=method_defined("vllm/v1/executor/abstract.py", "Executor.determine_available_memory"),
        ),
    ),
    order=110,
    portable=True,
    engine_steps=("determine_available_memory",),
    symptoms=(r"mem_get_info|Torch not compiled with CUDA|Found no NVIDIA driver",),
)
