"""SP014: speculators/models/eagle.py imports a transformers module that 5.24 removed.

transformers 5.24.0 removed `transformers/modeling_attn_mask_utils.py` (present in 4.x and
5.0-5.23), whose `_prepare_4d_causal_attention_mask` speculators 0.3.0's EAGLE model
imports at module level. speculators' registry imports every module of speculators.models
when speculators is imported, so the data generator itself cannot be imported:
`ModuleNotFoundError: No module named 'transformers.modeling_attn_mask_utils'`. speculators
0.4.0 and 0.4.0.1 import it the same way (speculators/models/eagle.py:24). vLLM
0.19-0.30 allow transformers 5.24 (0.24-0.30 require >= 5.5.3, no upper bound), so a fresh
install of them gets it. Its successor, `transformers.masking_utils.create_causal_mask`,
takes a model config and a cache and may return no mask at all, so it is no drop-in.

Portable form: keep the import where the module exists; where it does not, define a
function with the same contract (2-D padding mask in, additive float mask
[batch, 1, query, key] out: 0 where a query may attend, the dtype's minimum elsewhere;
causal with `past_key_values_length` cached keys; `sliding_window` keys back at most).
The emitted code is right with either transformers (portable); needed where the installed
transformers has no `modeling_attn_mask_utils` (its fact reads the install: 4.x and 5.0-5.23
still have it, so there the unpatched import works and the patch is not needed).
"""

import libcst as cst
import libcst.matchers as m

from patcher.fixes.cst_helpers import replace_statements
from patcher.fixes.patch import CheckHooks, Fact, Patch, PatchCodemod
from patcher.fixes.probes import module_absent

MODULE = "modeling_attn_mask_utils"
NAME = "_prepare_4d_causal_attention_mask"
IMPORT = m.SimpleStatementLine(
    body=[
        m.ImportFrom(
            module=m.Attribute(value=m.Name("transformers"), attr=m.Name(MODULE)),
            names=[m.ImportAlias(name=m.Name(NAME), asname=None)],
        )
    ]
)
GUARDED = m.Try(body=m.IndentedBlock(body=[IMPORT]))
# Satisfied only where the guard still gives the name: an ImportError handler that defines it.
DEFINES = (
    m.FunctionDef(name=m.Name(NAME))
    | m.AssignTarget(target=m.Name(NAME))
    | m.ImportAlias(name=m.Name(NAME), asname=None)
    | m.ImportAlias(asname=m.AsName(m.Name(NAME)))
)
FALLBACK = m.ExceptHandler(type=m.Name("ImportError"), body=m.MatchIfTrue(lambda body: bool(m.findall(body, DEFINES))))
PORTABLE = f"""\
try:  # transformers < 5.24
    from transformers.{MODULE} import {NAME}
except ImportError:  # transformers 5.24 removed the module: the same mask, built here

    def {NAME}(
        attention_mask, input_shape, inputs_embeds, past_key_values_length, sliding_window=None
    ):
        # [batch, 1, query, key]: 0 where a query may attend, the dtype's minimum elsewhere.
        _, query_length = input_shape
        key_length = query_length + past_key_values_length
        device, dtype = inputs_embeds.device, inputs_embeds.dtype
        query = torch.arange(query_length, device=device).view(-1, 1) + past_key_values_length
        key = torch.arange(key_length, device=device).view(1, -1)
        blocked = key > query
        if sliding_window is not None:
            blocked = blocked | (key < query - sliding_window)
        blocked = blocked[None, None] | (attention_mask[:, None, None, :] == 0)
        mask = torch.zeros(blocked.shape, dtype=dtype, device=device)
        return mask.masked_fill(blocked, torch.finfo(dtype).min)
"""


class AttentionMaskImport(PatchCodemod):
    DESCRIPTION = f"from transformers.{MODULE} import {NAME} -> guarded, with a fallback"

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        for guard in m.findall(tree, GUARDED):
            if not any(m.matches(h, FALLBACK) for h in guard.handlers):
                self.refuse(guard, f"'except ImportError:' that defines {NAME} after the guarded import")
            self.already_satisfied(f"the {MODULE} import has a fallback")
        top_level = [s for s in tree.body if m.matches(s, IMPORT)]
        if len(top_level) != 1 or not m.findall(
            tree, m.ImportFrom(module=m.Name("torch")) | m.Import(names=[m.ImportAlias(name=m.Name("torch"))])
        ):
            self.refuse(None, f"one module-level 'from transformers.{MODULE} import {NAME}' and 'import torch'")
        return replace_statements(tree, {IMPORT: PORTABLE})


PATCH = Patch(
    id="SP014",
    name="attention-mask-import",
    version=1,
    title="EAGLE model: a fallback for transformers' modeling_attn_mask_utils where it is gone (removed in 5.24)",
    risk="with transformers 5.24 and later speculators cannot be imported (modeling_attn_mask_utils is gone)",
    file="speculators/models/eagle.py",
    codemod=AttentionMaskImport,
    speculators=">=0.3.0,<0.4.1",  # 0.4.0 and 0.4.0.1 import it the same way (eagle.py:24)
    order=10,
    portable=True,
    facts=(
        Fact(
            summary="transformers has no modeling_attn_mask_utils (removed in 5.24.0)",
            symbol=f"transformers.{MODULE}",
            first_release="5.24.0",
            probe=module_absent(f"transformers/{MODULE}.py"),
        ),
    ),
    checks=CheckHooks(symptoms=(r"modeling_attn_mask_utils",)),
)
