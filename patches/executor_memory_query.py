"""The KV cache sizing that SP011 (speculators 0.3.0) and SP015 (0.4.x) both write, written out once.

Both rewrite the generator's ``free_memory, _ = <a query of the device>`` into the line
``ExecutorMemoryQuery`` writes: the smallest of the workers' available memory, which every
vLLM executor answers (``FACTS``). Each patch names the query it rewrites (``MATCH``):
``torch.cuda.mem_get_info()`` in 0.3.0, speculators' own ``mem_get_info()`` in 0.4.x. The
emitted bytes are pinned by tests/patches/test_codemod_audit.py: a change here changes what
SP011 and SP015 write. Not a patch: it defines no ``PATCH``.
"""

import libcst.matchers as m

from patcher.fixes.codemods import Replace
from patcher.fixes.patch import VllmFact
from patcher.fixes.probes import method_defined

# free_memory, _ = ... (the one shape rewritten: the replacement binds free_memory only)
FREE_AND_TOTAL = [m.AssignTarget(m.Tuple([m.Element(m.Name("free_memory")), m.Element(m.Name("_"))]))]
NEUTRAL = "free_memory = min(self.executor.determine_available_memory())  # bytes, any platform\n"
EXECUTOR_QUERY = m.Call(func=m.Attribute(attr=m.Name("determine_available_memory")))

FACTS = (
    VllmFact(
        summary="executors report available memory per worker, on every platform",
        symbol="Executor.determine_available_memory",
        first_release="0.11.0",
        probe=method_defined("vllm/v1/executor/abstract.py", "Executor.determine_available_memory"),
    ),
)


class ExecutorMemoryQuery(Replace):
    """``free_memory, _ = ...`` (``MATCH``, set by each patch) -> the executor's figure."""

    REPLACEMENT = NEUTRAL
    SATISFIED = EXECUTOR_QUERY
    SATISFIED_REASON = "memory is queried through the executor"
