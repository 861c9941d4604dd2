"""The KV cache layout block that SP020 writes and SP024 recognises, written out once.

SP020 replaces the generator's ``kv_cache_spec_list = self.executor.collective_rpc(...)``
with ``RESOLVE_LAYOUT``; SP024 accepts the block only as written here (a hand-edited copy is
refused) and rewrites its last statement, ``SET_LAYOUT``. The emitted bytes are pinned by
tests/patches/test_codemod_audit.py: a change here changes what SP020 writes and what SP024
accepts. Not a patch: it defines no ``PATCH``.
"""

RESOLVE_LAYOUT = """\
kv_cache_spec_list = self.executor.collective_rpc("get_kv_cache_spec")
# vLLM >= 0.29: the engine core resolves one KV cache layout before sizing the cache
# (EngineCore._initialize_kv_caches); this generator is its own engine core.
if hasattr(self.executor, "get_supported_kv_cache_layouts") and hasattr(self.executor, "set_kv_cache_layout"):
    from vllm.v1.attention.backends import utils as attention_utils

    layout = attention_utils.resolve_kv_cache_layout(
        self.vllm_config,
        self.executor.get_supported_kv_cache_layouts(),
        [spec for specs in kv_cache_spec_list for spec in specs.values()],
    )
    self.executor.set_kv_cache_layout(layout.name)
"""
# The block's last statement: the layout broadcast, by name only (vLLM 0.29-0.32).
SET_LAYOUT = "    self.executor.set_kv_cache_layout(layout.name)\n"
assert RESOLVE_LAYOUT.endswith(SET_LAYOUT), "the block ends with its set_kv_cache_layout call"
