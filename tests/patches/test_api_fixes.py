"""Before/after pairs for the API-fix codemods (SP001-SP008, SP011): rewrite, no-op, refusal."""

from __future__ import annotations

import pytest
from codemods import (
    codemod,
    noop_test,
    patch_of,
    refusal_test,
    rewrite_test,
)

pytestmark = pytest.mark.fast

REWRITES = [
    pytest.param(
        "SP001",
        """\
        c = SchedulerConfig(
            max_num_seqs=8,
            max_model_len=n,
        )
        """,
        """\
        c = SchedulerConfig(
            max_num_seqs=8,
            max_model_len=n,
            is_encoder_decoder=False,
        )
        """,
        id="SP001 multi-line call keeps one argument per line",
    ),
    pytest.param(
        "SP001",
        "c = config.SchedulerConfig(max_num_seqs=8)\n",
        "c = config.SchedulerConfig(max_num_seqs=8, is_encoder_decoder=False)\n",
        id="SP001 attribute callee, one line",
    ),
    pytest.param(
        "SP002",
        """\
        get_kv_cache_config_from_groups(
            vllm_config=v,
            kv_cache_specs=s,
            available_memory=m,
        )
        """,
        """\
        get_kv_cache_config_from_groups(
            vllm_config=v,
            available_memory=m,
        )
        """,
        id="SP002 middle keyword removed",
    ),
    pytest.param(
        "SP002",
        "get_kv_cache_config_from_groups(v, g, kv_cache_specs=s)\n",
        "get_kv_cache_config_from_groups(v, g)\n",
        id="SP002 last keyword removed",
    ),
    pytest.param(
        "SP003",
        "s = Scheduler(vllm_config=v, kv_cache_config=k)\n",
        "s = Scheduler(vllm_config=v, kv_cache_config=k, block_size=self.vllm_config.cache_config.block_size)\n",
        id="SP003 block size from the cache config",
    ),
    pytest.param(
        "SP004",
        "c = CacheConfig(block_size=16)\n",
        "c = CacheConfig(block_size=16, enable_prefix_caching=False)\n",
        id="SP004 prefix caching off",
    ),
    pytest.param(
        "SP005",
        """\
        while x:
            # run a step
            self.executor.execute_model(scheduler_output)
            done()
        """,
        """\
        while x:
            # run a step
            model_output = self.executor.execute_model(scheduler_output)
            if model_output is None and hasattr(self.executor, "sample_tokens"):
                # vLLM >= 0.12: a step is execute_model() then sample_tokens().
                self.executor.sample_tokens(None)
            done()
        """,
        id="SP005 sample_tokens follows, comment kept",
    ),
    pytest.param(
        "SP006",
        'r = self.executor.collective_rpc("_get_captured_states", unique_reply_rank=0)\n',
        'r = self.executor.collective_rpc("_get_captured_states")\n',
        id="SP006 reply list",
    ),
    pytest.param(
        "SP007",
        """\
        def _patched_forward(self, input_ids):
            return self.get_input_embeddings(input_ids)
        """,
        """\
        def _patched_forward(self, input_ids):
            return (self.embed_input_ids if hasattr(self, "embed_input_ids") else self.get_input_embeddings)(input_ids)
        """,
        id="SP007 either embedding method",
    ),
    pytest.param(
        "SP008",
        """\
        from vllm.model_executor.models.interfaces import supports_eagle3

        def setup(self):
            model = self.model_runner.model
            if not supports_eagle3(model):
                raise ValueError("no")
            base_model = model.model
        """,
        """\

        def setup(self):
            model = self.model_runner.model
            # Not supports_eagle3(): its answer for DeepSeek-V2/V3 and Kimi-K2.5 changes across vLLM
            # releases; their decoder layers are captured alike. Multimodal wrappers hold the text
            # model behind get_language_model() and have no .model.
            if hasattr(model, "get_language_model"):
                model = model.get_language_model()
            base_model = getattr(model, "model", model)
            if not hasattr(base_model, "layers"):
                raise ValueError(
                    f"Model {type(model).__name__} does not support hidden state extraction"
                )
        """,
        id="SP008 language model lookup, unused import removed",
    ),
    pytest.param(
        "SP011",
        "free_memory, _ = torch.cuda.mem_get_info()\n",
        "free_memory = min(self.executor.determine_available_memory())  # bytes, any platform\n",
        id="SP011 executor memory query",
    ),
]

NOOPS = [
    pytest.param("SP001", "SchedulerConfig(max_num_seqs=8, is_encoder_decoder=False)\n", id="SP001 already passed"),
    pytest.param("SP002", "get_kv_cache_config_from_groups(v, g, available_memory=m)\n", id="SP002 already gone"),
    pytest.param("SP003", "Scheduler(vllm_config=v, block_size=VLLM_BLOCK_SIZE)\n", id="SP003 fixed by hand"),
    pytest.param("SP004", "CacheConfig(block_size=16, enable_prefix_caching=False)\n", id="SP004 already off"),
    pytest.param(
        "SP005",
        "out = self.executor.execute_model(o)\nself.executor.sample_tokens(None)\n",
        id="SP005 already two-phase",
    ),
    pytest.param("SP006", 'self.executor.collective_rpc("_get_captured_states")\n', id="SP006 already a list"),
    pytest.param("SP007", "def f(self, ids):\n    return self.embed_input_ids(ids)\n", id="SP007 uses the new name"),
    pytest.param(
        "SP007", "def setup(self):\n    register_hooks(self)\n", id="SP007 no replacement forward (superseded)"
    ),
    pytest.param("SP008", "model = model.get_language_model()\nbase = model.model\n", id="SP008 already looked up"),
    pytest.param("SP011", "free = min(self.executor.determine_available_memory())\n", id="SP011 already neutral"),
]

REFUSALS = [
    pytest.param("SP001", "make_config(max_num_seqs=8)\n", "SchedulerConfig(...)", id="SP001 no SchedulerConfig call"),
    pytest.param(
        "SP002",
        'get_kv_cache_config_from_groups(v, g, **{"kv_cache_specs": s})\n',
        "without **kwargs",
        id="SP002 the keyword in a **mapping is not dropped unseen",
    ),
    pytest.param(
        "SP003",
        "Scheduler(vllm_config=v, block_size=32)\n",
        "found 32",
        id="SP003 a block size of the user's is not overwritten",
    ),
    pytest.param(
        "SP003",
        "Scheduler(vllm_config=v, **scheduler_kwargs)\n",
        "without **kwargs",
        id="SP003 a **mapping may carry block_size",
    ),
    pytest.param(
        "SP004",
        "CacheConfig(enable_prefix_caching=True)\n",
        "enable_prefix_caching=",
        id="SP004 explicit True is not overwritten",
    ),
    pytest.param("SP005", "run(self.executor)\n", "execute_model", id="SP005 no execute_model statement"),
    pytest.param(
        "SP006", 'self.executor.collective_rpc("other")\n', "_get_captured_states", id="SP006 another rpc only"
    ),
    pytest.param(
        "SP007",
        "def _patched_forward(self, ids):\n    return ids\n",
        "get_input_embeddings",
        id="SP007 unknown forward",
    ),
    pytest.param("SP008", "base_model = model.model\n", "supports_eagle3", id="SP008 no gate"),
    pytest.param(
        "SP011", "free = psutil.virtual_memory().available\n", "mem_get_info", id="SP011 unknown memory query"
    ),
]


test_api_fix = rewrite_test(REWRITES)


test_api_fix_noop = noop_test(NOOPS)


test_api_fix_refuses_unknown_code = refusal_test(REFUSALS)


def test_refusal_names_the_line():
    src = "x = 1\n\nCacheConfig(block_size=16,\n    enable_prefix_caching=True)\n"
    verdict, _, detail = codemod("SP004", src)
    assert verdict == "refused" and f"{patch_of('SP004').file}:4:" in detail
