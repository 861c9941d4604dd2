"""SP020: resolve the KV cache layout before sizing the cache, as vLLM's engine core does (0.29+).

From vLLM 0.29 the engine core resolves one physical KV cache layout for the whole model
before memory profiling (``vllm/v1/engine/core.py``, ``EngineCore._initialize_kv_caches``:
``resolve_kv_cache_layout(vllm_config, executor.get_supported_kv_cache_layouts(), specs)``
then ``executor.set_kv_cache_layout(layout.name)``), and ``get_kv_cache_config_from_groups``
reads it (``CacheConfig.get_resolved_kv_cache_layout``, vllm/config/cache.py). speculators
0.3.0's generator is its own engine core and never resolves it, so it fails at start-up:
``ValueError: KV cache layout has not been resolved yet`` (measured on the vLLM 0.32.0 CPU
engine; with this patch the generator extracts correctly there).

Portable form: right after the workers report their KV cache specs, resolve and broadcast the
layout when the executor has the two methods (vLLM 0.29+, where they came with the layout);
vLLM 0.11-0.28 skip the block. Needed on every install, so an upgrade under a patched
install keeps working.
"""

import libcst.matchers as m

from patcher.fixes.codemods import Replace
from patcher.fixes.patch import CheckHooks, Patch
from speculators_patch_codemods import kv_cache_layout_block

SPEC_NAME = m.SimpleString('"get_kv_cache_spec"') | m.SimpleString("'get_kv_cache_spec'")
SPECS = m.SimpleStatementLine(
    body=[
        m.Assign(
            targets=[m.AssignTarget(m.Name("kv_cache_spec_list"))],
            value=m.Call(
                func=m.Attribute(
                    value=m.Attribute(value=m.Name("self"), attr=m.Name("executor")), attr=m.Name("collective_rpc")
                ),
                args=[m.Arg(SPEC_NAME)],
            ),
        )
    ]
)
BROADCAST = m.Call(func=m.Attribute(attr=m.Name("set_kv_cache_layout")))


class ResolveKvCacheLayout(Replace):
    DESCRIPTION = "after the workers' KV cache specs: resolve and broadcast the KV cache layout (vLLM 0.29+)"
    MATCH = SPECS
    REPLACEMENT = kv_cache_layout_block.RESOLVE_LAYOUT  # which SP024 rewrites
    SATISFIED = BROADCAST
    SATISFIED_REASON = "the generator already resolves the KV cache layout"
    EXPECTED = "'kv_cache_spec_list = self.executor.collective_rpc(\"get_kv_cache_spec\")' in the generator"
    TOUCHES = m.Call(func=m.Attribute(attr=m.Name("collective_rpc")), args=[m.Arg(SPEC_NAME), m.ZeroOrMore()])


PATCH = Patch(
    id="SP020",
    name="kv-cache-layout",
    version=1,
    title="Generator: resolve and broadcast the KV cache layout before sizing the cache (vLLM 0.29+)",
    risk="on vLLM 0.29 and later the generator fails at start-up: the KV cache layout is not resolved",
    file="speculators/data_generation/vllm_hidden_states_generator.py",
    codemod=ResolveKvCacheLayout,
    order=150,
    portable=True,
    depends_on="at run time: Executor.get_supported_kv_cache_layouts/set_kv_cache_layout and resolve_kv_cache_layout (vllm/v1/executor/abstract.py, vllm/v1/attention/backends/utils.py; 0.29+)",
    checks=CheckHooks(engine_steps=("get_supported_kv_cache_layouts", "set_kv_cache_layout")),
)
