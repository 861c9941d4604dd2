"""SP020 (KV cache layout resolved before sizing) and SP021 (vLLM picks the block size).

The emitted code's effect is proven on the real vLLM 0.32.0 engine (torch 2.13) by
``make test-engines`` and, for releases before the layout existed, by the engine tier
(0.16.0, 0.18.1): there SP020's block is skipped and SP021 keeps or lets vLLM choose 16.
"""

from __future__ import annotations

import zipfile

import pytest
from codemods import codemod, refusal_test, rewrite_test
from sandbox import wheel

GENERATOR = "speculators/data_generation/vllm_hidden_states_generator.py"


@pytest.fixture(scope="module")
def generator_src() -> str:
    with zipfile.ZipFile(wheel("speculators", "0.3.0")) as z:
        return z.read(GENERATOR).decode()


REWRITES = [
    pytest.param(
        "SP020",
        """\
        class VllmHiddenStatesGenerator:
            def __init__(self):
                kv_cache_spec_list = self.executor.collective_rpc("get_kv_cache_spec")
                kv_cache_spec = kv_cache_spec_list[0]
        """,
        """\
        class VllmHiddenStatesGenerator:
            def __init__(self):
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
                kv_cache_spec = kv_cache_spec_list[0]
        """,
        id="SP020 the layout resolved right after the workers' specs",
    ),
    pytest.param(
        "SP021",
        """\
        VLLM_BLOCK_SIZE = 16  # Block size for KV cache


        def _create_vllm_config(self):
            cache_config = CacheConfig(
                block_size=VLLM_BLOCK_SIZE,
                gpu_memory_utilization=gpu_memory_utilization,
            )
        """,
        """\
        VLLM_BLOCK_SIZE = 16  # Block size for KV cache
        # vLLM >= 0.18 picks the block size per platform and attention backend when none is given
        # (CacheConfig.user_specified_block_size); some refuse 16. Read once, at import.
        _KV_CACHE_BLOCK_SIZE = None if "user_specified_block_size" in CacheConfig.__dataclass_fields__ else VLLM_BLOCK_SIZE


        def _create_vllm_config(self):
            cache_config = CacheConfig(
                block_size=_KV_CACHE_BLOCK_SIZE,
                gpu_memory_utilization=gpu_memory_utilization,
            )
        """,
        id="SP021 the block size read once at import, passed where the 16 was",
    ),
]

REFUSALS = [
    pytest.param(
        "SP020",
        "x = self.executor.collective_rpc('other')\n",
        "'kv_cache_spec_list = self.executor.collective_rpc(\"get_kv_cache_spec\")' in the generator",
        id="SP020 no spec query",
    ),
    pytest.param(
        "SP020",
        'specs = self.executor.collective_rpc("get_kv_cache_spec", timeout=60)\n',
        "kv_cache_spec_list = self.executor.collective_rpc",
        id="SP020 the specs read another way",
    ),
    pytest.param(
        "SP021",
        "VLLM_BLOCK_SIZE = 16\nCacheConfig(block_size=32)\n",
        "one module-level VLLM_BLOCK_SIZE and one CacheConfig(block_size=VLLM_BLOCK_SIZE)",
        id="SP021 a block size of the user's",
    ),
]


test_kv_cache_fix = rewrite_test(REWRITES)


def test_sp020_resolves_the_layout_right_after_the_specs_and_before_sizing(generator_src):
    verdict, new, _ = codemod("SP020", generator_src)
    assert verdict == "changed"
    specs = new.index('kv_cache_spec_list = self.executor.collective_rpc("get_kv_cache_spec")')
    resolve = new.index("attention_utils.resolve_kv_cache_layout(")
    broadcast = new.index("self.executor.set_kv_cache_layout(layout.name)")
    sizing = new.index("free_memory", specs)  # the memory query that sizes the cache
    assert specs < resolve < broadcast < sizing
    guard = new[specs:resolve]
    assert 'hasattr(self.executor, "get_supported_kv_cache_layouts")' in guard
    compile(new, GENERATOR, "exec")
    assert codemod("SP020", new)[0] == "satisfied"


def test_sp021_passes_none_only_where_vllm_records_a_user_block_size(generator_src):
    verdict, new, _ = codemod("SP021", generator_src)
    assert verdict == "changed"
    assert "block_size=_KV_CACHE_BLOCK_SIZE," in new and "block_size=VLLM_BLOCK_SIZE" not in new
    assert (
        '_KV_CACHE_BLOCK_SIZE = None if "user_specified_block_size" in CacheConfig.__dataclass_fields__ '
        "else VLLM_BLOCK_SIZE"
    ) in new
    assert new.index("VLLM_BLOCK_SIZE = 16") < new.index("_KV_CACHE_BLOCK_SIZE =")
    compile(new, GENERATOR, "exec")
    assert codemod("SP021", new)[0] == "satisfied"


test_unrecognised_code_is_refused = refusal_test(REFUSALS)
