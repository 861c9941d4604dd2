"""SP024: send the KV cache interleave size with the layout where vLLM requires it (0.33).

vLLM 0.33's ``Executor.set_kv_cache_layout(self, layout_name, cp_kv_cache_interleave_size)``
(vllm/v1/executor/abstract.py:183) takes a second, required parameter; 0.29-0.32 take the
layout name only (abstract.py:158 in 0.29, :172 in 0.32), 0.11-0.28 have no such method. The
call SP020 emits passes the name only, so the generator stops there on 0.33 (TypeError:
missing argument). The workers store the value as
``parallel_config.cp_kv_cache_interleave_size`` (vllm/v1/worker/worker_base.py:112).

The value: 0.33's engine core passes ``vllm_config.parallel_config.cp_kv_cache_interleave_size``
(vllm/v1/engine/core.py:294) right after ``VllmConfig.adjust_dcp_kv_cache_interleave_size``
(vllm/config/vllm.py:3339), which changes it only for a KV transfer instance with decode context
parallelism (it returns at :3347-3355 without a ``kv_transfer_config`` or with
``decode_context_parallel_size`` 1). The generator's config has neither, so the value the
engine core would pass is the configured one, 1 by default (vllm/config/parallel.py:423).

Portable form: SP020's block, unedited (anything else is refused), with its last statement
replaced: the interleave size is passed, by keyword, only where the executor's
``set_kv_cache_layout`` signature takes it (``inspect.signature``, read at the call), so on
0.29-0.32 the call is exactly SP020's and 0.11-0.28 still skip the block.
"""

import libcst as cst
import libcst.matchers as m

from patcher.fixes.cst_helpers import calls_to
from patcher.fixes.patch import Patch, PatchCodemod, VllmFact
from patcher.fixes.probes import parameter_required
from speculators_patch_codemods import kv_cache_layout_block

PARAM = "cp_kv_cache_interleave_size"
CALL = f'''\
    # vLLM >= 0.33 sends the KV cache interleave size with the layout: the value its engine
    # core passes (parallel_config.{PARAM}), where the signature takes it.
    import inspect

    interleave = {{}}
    if "{PARAM}" in inspect.signature(self.executor.set_kv_cache_layout).parameters:
        interleave["{PARAM}"] = self.vllm_config.parallel_config.{PARAM}
    self.executor.set_kv_cache_layout(layout.name, **interleave)
'''
# SP020's block (kv_cache_layout_block, as SP020 writes it) with its last statement replaced.
SP020_BLOCK = kv_cache_layout_block.RESOLVE_LAYOUT
BLOCK = SP020_BLOCK[: -len(kv_cache_layout_block.SET_LAYOUT)] + CALL


def _block(code: str, newline: str) -> cst.If:
    """The ``if`` statement of ``code`` (SP020's template or this patch's), in ``newline``."""
    return next(s for s in cst.parse_module(code.replace("\n", newline)).body if isinstance(s, cst.If))


def _passes_interleave(call: cst.Call) -> bool:
    return len(call.args) >= 2 or any(
        a.star == "**" or (a.keyword is not None and a.keyword.value == PARAM) for a in call.args
    )


class PassInterleaveSize(PatchCodemod):
    DESCRIPTION = "SP020's set_kv_cache_layout(layout.name) -> also the interleave size where vLLM takes it (0.33)"

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        if any(_passes_interleave(c) for c in calls_to(tree, "set_kv_cache_layout")):
            self.already_satisfied("the KV cache layout is sent with the interleave size where vLLM takes it")
        # The one shape accepted: SP020's block as SP020 writes it (a hand-edited copy is refused).
        sp020 = _block(SP020_BLOCK, tree.default_newline)
        found = [
            n
            for n in m.findall(tree, m.If())
            if isinstance(n, cst.If) and n.deep_equals(sp020.with_changes(leading_lines=n.leading_lines))
        ]
        if len(found) != 1:
            self.refuse(None, "SP020's KV cache layout block in the generator, unedited (SP024 applies after SP020)")
        return tree.visit(_Rewrite(found[0], _block(BLOCK, tree.default_newline)))


class _Rewrite(cst.CSTTransformer):
    def __init__(self, target: cst.If, block: cst.If) -> None:
        super().__init__()
        self.target, self.block = target, block

    def leave_If(self, original: cst.If, updated: cst.If) -> cst.If:
        if original is not self.target:
            return updated
        return self.block.with_changes(leading_lines=updated.leading_lines)


PATCH = Patch(
    id="SP024",
    name="kv-cache-layout-interleave",
    version=1,
    title="Generator: send the KV cache interleave size with the layout where vLLM takes it (0.33)",
    risk="on vLLM 0.33 the generator fails at KV cache set-up: set_kv_cache_layout needs the interleave size",
    file="speculators/data_generation/vllm_hidden_states_generator.py",
    codemod=PassInterleaveSize,
    facts=(
        VllmFact(
            summary="Executor.set_kv_cache_layout requires cp_kv_cache_interleave_size",
            symbol="Executor.set_kv_cache_layout",
            first_release="0.33.0",
            # set_kv_cache_layout itself is new in 0.29 (SP020 calls it only where it exists).
            probe=parameter_required(
                "vllm/v1/executor/abstract.py", "Executor.set_kv_cache_layout", PARAM, optional=True
            ),
        ),
    ),
    order=180,
    portable=True,
    requires=("SP020",),  # rewrites the block SP020 adds
)
