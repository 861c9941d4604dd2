"""SP004: turn prefix caching off for this prefill-only workload.

vLLM >= 0.12 (vllm/config/cache.py, CacheConfig) enables prefix caching by default. The
KV manager then needs Request.block_hashes (a crash without a block hasher) and, worse,
skips cached prefix tokens, so their hidden states are never captured (silently short
captures). Every prompt must be computed in full, so the generator disables it.
"""

from patcher.fixes.codemods import AddKeyword
from patcher.fixes.patch import CheckHooks, Patch, VllmFact
from patcher.fixes.probes import field_default


class DisablePrefixCaching(AddKeyword):
    DESCRIPTION = "CacheConfig(...) -> CacheConfig(..., enable_prefix_caching=False)"
    CALLEE = "CacheConfig"
    KEYWORD = "enable_prefix_caching"
    VALUE = "False"


PATCH = Patch(
    id="SP004",
    name="disable-prefix-caching",
    version=1,
    title="CacheConfig: disable prefix caching so every prompt token is computed and captured",
    risk="cached prompt prefixes are never computed, so their hidden states are not captured (or the KV manager crashes)",
    file="speculators/data_generation/vllm_hidden_states_generator.py",
    codemod=DisablePrefixCaching,
    facts=(
        VllmFact(
            summary="CacheConfig.enable_prefix_caching defaults to True",
            symbol="CacheConfig.enable_prefix_caching",
            first_release="0.12.0",
            probe=field_default("vllm/config/cache.py", "CacheConfig", "enable_prefix_caching", "True"),
        ),
    ),
    order=40,
    portable=True,
    checks=CheckHooks(symptoms=(r"block_hashes",)),
)
