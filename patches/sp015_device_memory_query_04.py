"""SP015: speculators 0.4.x sizes the KV cache from the executor, not torch.accelerator.

speculators 0.4.0/0.4.0.1 (data_generation/vllm_hidden_states_generator.py:140) sizes the
KV cache from ``free_memory, _ = mem_get_info()``, its own helper
(speculators/utils/util.py:34): it asks ``torch.accelerator.current_accelerator()`` and
returns ``(0, 0)`` when there is none, so on a CPU-only torch the cache gets 0 bytes; on a
CUDA build of torch without a GPU (the vLLM 0.16.0 CPU engine here) it raises
``RuntimeError: Found no NVIDIA driver on your system``.

The fix is SP011's, with the same vLLM fact: every vLLM executor answers
``determine_available_memory()`` (vllm/v1/executor/abstract.py, one value per worker, in
bytes, from 0.11), what vLLM's own engine core sizes the KV cache from on every platform.
The emitted line is SP011's (both write ``executor_memory_query.py``'s); the helper's import
is left in place (``empty_cache`` and ``is_npu_available`` come from the same import line).
"""

import libcst.matchers as m

from patcher.fixes.patch import CheckHooks, Patch
from speculators_patch_codemods.executor_memory_query import FACTS, FREE_AND_TOTAL, ExecutorMemoryQuery

# free_memory, _ = mem_get_info()   (speculators.utils.util.mem_get_info)
HELPER_QUERY = m.Call(func=m.Name("mem_get_info"), args=[])


# The replacement, what satisfies it and the vLLM fact: executor_memory_query (SP011's too).
class PlatformMemoryQuery04(ExecutorMemoryQuery):
    DESCRIPTION = "mem_get_info() -> min(self.executor.determine_available_memory())"
    MATCH = m.SimpleStatementLine(body=[m.Assign(targets=FREE_AND_TOTAL, value=HELPER_QUERY)])
    TOUCHES = m.Call(func=m.Name("mem_get_info"))
    EXPECTED = "'free_memory, _ = mem_get_info()'"


PATCH = Patch(
    id="SP015",
    name="device-memory-query-04",
    version=1,
    title="KV cache sizing (0.4.x): executor.determine_available_memory() instead of torch.accelerator",
    risk="the KV cache gets 0 bytes on a CPU, or sizing it fails without a GPU",
    file="speculators/data_generation/vllm_hidden_states_generator.py",
    codemod=PlatformMemoryQuery04,
    facts=FACTS,
    speculators=">=0.4.0,<0.4.1",
    order=110,
    portable=True,
    checks=CheckHooks(symptoms=(r"mem_get_info|Torch not compiled with CUDA|Found no NVIDIA driver",)),
)
