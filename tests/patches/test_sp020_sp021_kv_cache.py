"""SP020 (KV cache layout resolved before sizing) and SP021 (vLLM picks the block size).

The emitted code's effect is proven on the real vLLM 0.32.0 engine (torch 2.13) by
``make test-engines`` and, for releases before the layout existed, by the engine tier
(0.16.0, 0.18.1): there SP020's block is skipped and SP021 keeps or lets vLLM choose 16.
"""

from __future__ import annotations

import zipfile

import pytest
from sandbox import wheel

from patcher.engine import run_codemod
from patcher.fixes.registry import loaded

PATCHES = {p.id: p for p in loaded().patches}
GENERATOR = "speculators/data_generation/vllm_hidden_states_generator.py"


@pytest.fixture(scope="module")
def generator_src() -> str:
    with zipfile.ZipFile(wheel("speculators", "0.3.0")) as z:
        return z.read(GENERATOR).decode()


def run(patch_id: str, src: str) -> tuple[str, str, str]:
    verdict, new, detail = run_codemod(PATCHES[patch_id], src.encode())
    return verdict, new.decode(), detail


def test_sp020_resolves_the_layout_right_after_the_specs_and_before_sizing(generator_src):
    verdict, new, _ = run("SP020", generator_src)
    assert verdict == "changed"
    specs = new.index('kv_cache_spec_list = self.executor.collective_rpc("get_kv_cache_spec")')
    resolve = new.index("attention_utils.resolve_kv_cache_layout(")
    broadcast = new.index("self.executor.set_kv_cache_layout(layout.name)")
    sizing = new.index("free_memory", specs)  # the memory query that sizes the cache
    assert specs < resolve < broadcast < sizing
    guard = new[specs:resolve]
    assert 'hasattr(self.executor, "get_supported_kv_cache_layouts")' in guard
    compile(new, GENERATOR, "exec")
    assert run("SP020", new)[0] == "satisfied"


def test_sp021_passes_none_only_where_vllm_records_a_user_block_size(generator_src):
    verdict, new, _ = run("SP021", generator_src)
    assert verdict == "changed"
    assert "block_size=_KV_CACHE_BLOCK_SIZE," in new and "block_size=VLLM_BLOCK_SIZE" not in new
    assert (
        '_KV_CACHE_BLOCK_SIZE = None if "user_specified_block_size" in CacheConfig.__dataclass_fields__ '
        "else VLLM_BLOCK_SIZE"
    ) in new
    assert new.index("VLLM_BLOCK_SIZE = 16") < new.index("_KV_CACHE_BLOCK_SIZE =")
    compile(new, GENERATOR, "exec")
    assert run("SP021", new)[0] == "satisfied"


@pytest.mark.parametrize(
    ("patch_id", "src"),
    [
        ("SP020", "x = self.executor.collective_rpc('other')\n"),
        ("SP021", "VLLM_BLOCK_SIZE = 16\nCacheConfig(block_size=32)\n"),
    ],
)
def test_unrecognised_code_is_refused(patch_id, src):
    verdict, new, _ = run(patch_id, src)
    assert verdict == "refused" and new == src
