"""SP021: let vLLM pick the KV cache block size, as ``vllm serve`` without ``--block-size``.

speculators 0.3.0 builds ``CacheConfig(block_size=VLLM_BLOCK_SIZE)`` with a fixed 16. From
vLLM 0.18, ``CacheConfig`` records whether the user gave a block size
(``user_specified_block_size``, vllm/config/cache.py); when none is given the platform and
the attention backends choose one (``Platform.check_and_update_config``,
vllm/platforms/interface.py), and a given one is kept even where a backend cannot use it.
vLLM 0.32's CPU attention takes multiples of 32 only, so the generator fails at KV cache
set-up: ``RuntimeError: ... No common block size for 16 (CPU_ATTN: [MultipleOf(32)])``
(measured on the vLLM 0.32.0 CPU engine); GPU backends with their own sizes (FlashMLA: 64)
are in the same position.

Portable form: the generator reads, once at import, whether ``CacheConfig`` has
``user_specified_block_size``; there it passes ``block_size=None`` (vLLM decides), elsewhere
(0.11-0.17, where the engine tier proved 16) the same 16 as before. The scheduler and the
KV cache sizing already read the resolved ``cache_config.block_size`` (SP003). Needed on
every install.
"""

import libcst as cst
import libcst.matchers as m

from patcher.fixes.cst_helpers import calls_to, keyword, statements
from patcher.fixes.patch import Patch, PatchCodemod

CHOICE = "_KV_CACHE_BLOCK_SIZE"
FIXED = m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(m.Name("VLLM_BLOCK_SIZE"))])])
DEFINE_CHOICE = f"""\
# vLLM >= 0.18 picks the block size per platform and attention backend when none is given
# (CacheConfig.user_specified_block_size); some refuse 16. Read once, at import.
{CHOICE} = None if "user_specified_block_size" in CacheConfig.__dataclass_fields__ else VLLM_BLOCK_SIZE
"""


class LetVllmPickBlockSize(PatchCodemod):
    DESCRIPTION = "CacheConfig(block_size=VLLM_BLOCK_SIZE) -> block_size=None where vLLM picks it (0.18+)"

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        given = [c for c in calls_to(tree, "CacheConfig") if keyword(c, "block_size") is not None]
        if any(m.matches(keyword(c, "block_size").value, m.Name(CHOICE)) for c in given):
            self.already_satisfied(f"CacheConfig(block_size={CHOICE})")
        fixed = [i for i, s in enumerate(tree.body) if m.matches(s, FIXED)]
        pending = [c for c in given if m.matches(keyword(c, "block_size").value, m.Name("VLLM_BLOCK_SIZE"))]
        if len(pending) != 1 or len(fixed) != 1:
            self.refuse(None, "one module-level VLLM_BLOCK_SIZE and one CacheConfig(block_size=VLLM_BLOCK_SIZE)")
        tree = tree.visit(_UseChoice(id(pending[0])))
        at = fixed[0] + 1
        return tree.with_changes(body=[*tree.body[:at], *statements(DEFINE_CHOICE).nodes, *tree.body[at:]])


class _UseChoice(cst.CSTTransformer):
    def __init__(self, target: int) -> None:
        super().__init__()
        self.target = target

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        if id(original) != self.target:
            return updated
        return updated.with_changes(
            args=[
                a.with_changes(value=cst.Name(CHOICE))
                if a.keyword is not None and a.keyword.value == "block_size"
                else a
                for a in updated.args
            ]
        )


PATCH = Patch(
    id="SP021",
    name="kv-cache-block-size",
    version=1,
    title="CacheConfig: let vLLM pick the KV cache block size where it does (0.18+), 16 before",
    risk="on vLLM 0.18 and later a backend that refuses block size 16 fails at KV cache set-up",
    file="speculators/data_generation/vllm_hidden_states_generator.py",
    codemod=LetVllmPickBlockSize,
    order=160,
    portable=True,
    depends_on="at run time: CacheConfig.user_specified_block_size (vllm/config/cache.py; 0.18+)",
)
