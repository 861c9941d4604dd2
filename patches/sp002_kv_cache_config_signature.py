"""SP002: stop passing kv_cache_specs to get_kv_cache_config_from_groups.

vLLM >= 0.12 (vllm/v1/core/kv_cache_utils.py) has
`get_kv_cache_config_from_groups(vllm_config, kv_cache_groups, available_memory)`;
the `kv_cache_specs` parameter speculators 0.3.0 passes is gone (TypeError). vLLM 0.33 moved
the function, unchanged, to vllm/v1/core/kv_cache_planning.py (line 642; SP023 imports it
from there), so the fact is read where the function is.
"""

from patcher.fixes.codemods import RemoveKeyword
from patcher.fixes.patch import CheckHooks, Patch, VllmFact
from patcher.fixes.probes import parameter_absent


class DropKvCacheSpecs(RemoveKeyword):
    DESCRIPTION = "get_kv_cache_config_from_groups(..., kv_cache_specs=...) -> without it"
    CALLEE = "get_kv_cache_config_from_groups"
    KEYWORD = "kv_cache_specs"
    # Any value goes: vLLM has no such parameter, so whatever it carries never reached it (the
    # value is not read elsewhere). A **mapping, which may carry it unseen, is refused.


PATCH = Patch(
    id="SP002",
    name="kv-cache-config-signature",
    version=1,
    title="get_kv_cache_config_from_groups: drop the removed kv_cache_specs argument",
    risk="the generator fails to start: get_kv_cache_config_from_groups no longer takes kv_cache_specs",
    file="speculators/data_generation/vllm_hidden_states_generator.py",
    codemod=DropKvCacheSpecs,
    facts=(
        VllmFact(
            summary="get_kv_cache_config_from_groups no longer takes kv_cache_specs",
            symbol="get_kv_cache_config_from_groups",
            first_release="0.12.0",
            probe=parameter_absent(
                "vllm/v1/core/kv_cache_utils.py",
                "get_kv_cache_config_from_groups",
                "kv_cache_specs",
                moved_to="vllm/v1/core/kv_cache_planning.py",
            ),
        ),
    ),
    order=20,
    checks=CheckHooks(symptoms=(r"kv_cache_specs",)),
)
