"""SP026: keep the KV cache at the size the generator gives it (vLLM 0.34+, generator).

vLLM 0.34 adds an extensible KV cache (``CacheConfig.enable_extensible_kv_cache``,
vllm/config/cache.py), which ``VllmConfig`` switches on for CUDA when it is left unset
(``VllmConfig._resolve_extensible_kv_cache``, vllm/config/vllm.py). The GPU worker then builds
the cache with ``initialize_kv_cache(extensible=True)`` and backs only its first blocks
(vllm/v1/worker/gpu_worker.py, vllm/v1/worker/extensible_kv_cache.py); vLLM's own engine core
grows it after set-up: ``compile_or_warm_up_model``, ``finalize_extensible_kv_cache``, then
``extend_kv_cache`` on the executor (``EngineCore._initialize_kv_caches``,
vllm/v1/engine/core.py). The generator is its own engine core and stops at
``initialize_from_config``, so every block past the backed ones is unmapped: on an H200 with
vLLM 0.34.0 the worker died at the first batch that reached them (``CUDA error: an illegal
memory access was encountered``, selftest's chunked case).

The generator sizes its cache once (``CACHE_MEMORY_FRACTION`` of the free memory) and has no
use for growth, so the emitted code turns the extensible cache off where ``CacheConfig`` has
the switch and passes nothing elsewhere (0.11-0.33). Following the core instead would also run
vLLM's kernel warm-up, which on 0.34 imports optional packages (``cutlass``) the generator
never needed. docs/design.md: "vLLM 0.34's extensible KV cache".
"""

import libcst as cst
import libcst.matchers as m

from patcher.fixes.cst_helpers import append_keyword, calls_to, statements
from patcher.fixes.patch import CheckHooks, Patch, PatchCodemod, VllmFact
from patcher.fixes.probes import field_defined

CHOICE = "_FIXED_KV_CACHE"
SWITCH = "enable_extensible_kv_cache"
ANCHOR = m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(m.Name("VLLM_BLOCK_SIZE"))])])
DEFINE_CHOICE = f'''\
# vLLM >= 0.34 grows the KV cache after set-up unless told not to (CacheConfig.{SWITCH},
# on for CUDA when unset); this generator sizes its cache once. Read once, at import.
{CHOICE} = {{"{SWITCH}": False}} if "{SWITCH}" in CacheConfig.__dataclass_fields__ else {{}}
'''


class KeepKvCacheFixed(PatchCodemod):
    DESCRIPTION = f"CacheConfig(...) -> CacheConfig(..., **{CHOICE}) ({SWITCH}=False where it exists)"

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        found = calls_to(tree, "CacheConfig")
        anchors = [i for i, s in enumerate(tree.body) if m.matches(s, ANCHOR)]
        if len(found) != 1:
            self.refuse(found[1] if found else None, "one CacheConfig(...) call in the generator")
        call = found[0]
        starred = [a for a in call.args if a.star == "**"]
        if any(m.matches(a.value, m.Name(CHOICE)) for a in starred):
            self.already_satisfied(f"CacheConfig(..., **{CHOICE})")
        hand_set = [a for a in call.args if a.keyword is not None and a.keyword.value == SWITCH]
        if hand_set or starred or call.args and call.args[0].keyword is None:
            self.refuse(
                (hand_set or starred or call.args)[0],
                f"CacheConfig(...) with keyword arguments only and no {SWITCH}= of its own",
            )
        if len(anchors) != 1:
            self.refuse(None, "one module-level VLLM_BLOCK_SIZE = ...")
        tree = tree.visit(_PassChoice(id(call)))
        at = anchors[0] + 1
        return tree.with_changes(body=[*tree.body[:at], *statements(DEFINE_CHOICE).nodes, *tree.body[at:]])


class _PassChoice(cst.CSTTransformer):
    def __init__(self, target: int) -> None:
        super().__init__()
        self.target = target

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        if id(original) != self.target:
            return updated
        keyed = append_keyword(updated, "_", "0")  # the layout of one more argument, then made **CHOICE
        last = keyed.args[-1].with_changes(
            keyword=None, equal=cst.MaybeSentinel.DEFAULT, star="**", value=cst.Name(CHOICE)
        )
        return keyed.with_changes(args=[*keyed.args[:-1], last])


PATCH = Patch(
    id="SP026",
    name="fixed-kv-cache",
    version=1,
    title="CacheConfig: keep the KV cache at the generator's size, no extensible cache (vLLM 0.34)",
    file="speculators/data_generation/vllm_hidden_states_generator.py",
    codemod=KeepKvCacheFixed,
    facts=(
        VllmFact(
            summary="CacheConfig has enable_extensible_kv_cache; vLLM turns it on for CUDA when unset",
            symbol=f"CacheConfig.{SWITCH}",
            first_release="0.34.0",
            probe=field_defined("vllm/config/cache.py", "CacheConfig", SWITCH),
        ),
    ),
    order=165,
    portable=True,
    risk="on a GPU the worker reads KV blocks vLLM never mapped: CUDA illegal memory access at the first long batch",
    checks=CheckHooks(
        engine_steps=("extensible_kv_cache_unsupported_reason", "disable_extensible_kv_cache", "extend_kv_cache")
    ),
)
