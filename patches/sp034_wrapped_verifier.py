"""SP034: the EAGLE-3 draft cannot start from a verifier inside a vision-language wrapper.

``Eagle3DraftModel._setup_embeddings_and_lm_heads`` (speculators/models/eagle3/core.py:223-280
in 0.3.0, :257-354 in 0.4.0 and 0.4.0.1) builds the draft's embedding and heads from its
verifier: it reads ``hidden_size``, ``vocab_size`` and ``pad_token_id`` from
``AutoConfig.from_pretrained(verifier)`` and loads ``model.embed_tokens.weight`` and
``lm_head.weight`` by those exact names (0.3.0; 0.4.x takes the text config and matches names
by suffix). A verifier whose text model sits in a vision-language wrapper keeps both elsewhere:

- the config under ``text_config`` (transformers' ``PretrainedConfig.get_text_config``,
  configuration_utils.py; from transformers 4.45, line 1193 in 4.57.6, 1516 in 5.22.2; vLLM
  reads a wrapper's text model config the same way);
- the tensors under ``language_model.`` as the published checkpoints name them
  (``language_model.model.embed_tokens.weight``, ``language_model.lm_head.weight``:
  Kimi-K2.5, Llama-4, Gemma-3, Mistral-3, LLaVA; transformers 4.57's ``_checkpoint_conversion_mapping``
  of Gemma3/Mistral3/Llava maps exactly that layout, and ``save_pretrained`` maps it back), or
  under ``model.language_model.`` with ``lm_head.weight`` at the top, the module layout of
  transformers >= 4.52, which a model without a legacy mapping saves as is (Qwen3-VL's published
  checkpoints). Qwen2-VL and Qwen2.5-VL keep the causal LM's own names; a tied head (Gemma-3)
  has no ``lm_head`` tensor at all and 0.3.0 already falls back to the embedding.

Kimi-K2.5 (``KimiK25ForConditionalGeneration``, ``model_type: kimi_k25``) is all of it at once:
its ``hidden_size`` lives in ``text_config`` (a ``DeepseekV3Config``), its tensors under
``language_model.``, and its config is remote code (``auto_map``). Up to transformers 4.x, which
has no kimi_k25, the load without ``trust_remote_code`` is refused in a job (measured, 4.57.6:
``ValueError: The repository ... contains custom code which must be executed to correctly load
the model``); 5.17.0, 5.19.0 and 5.22.2 (5.4.0 not yet) have their own ``Kimi_K25Config``
(models/kimi_k25/configuration_kimi_k25.py:59 in 5.22.2, ``text_config`` a DeepSeek-V3
sub-config) and load that instead, whose top level has no ``hidden_size`` (measured, 5.19.0 and
5.22.2: ``AttributeError: 'Kimi_K25Config' object has no attribute 'hidden_size'``). With 0.3.0
the trainer stops before the first step; 0.4.x reads ``text_config`` and suffixes, but on
transformers 4 its config load is refused the same way.

The fix, in the draft's own module: the verifier's config is loaded as speculators' data
generator loads it for the same path (``trust_remote_code=True``,
data_generation/vllm_hidden_states_generator.py:86 in 0.3.0) and ``get_text_config()`` gives
the text model's; ``pad_token_id``, which a transformers 5 config need not declare (it left
the base ``PreTrainedConfig``: each model's config declares its own), is read with ``None``
as default; 0.3.0 looks the embedding up under each of the three layouts above (the first
whose text-model tensors are all there) and returns the tensors under the names it asked
for. Right on every transformers from 4.45 (4.x and 5.x): needed wherever that holds.
"""

import libcst as cst
import libcst.matchers as m

from patcher.fixes.cst_helpers import code_of, same_code, statements
from patcher.fixes.patch import CheckHooks, Fact, Patch, PatchCodemod
from patcher.fixes.probes import method_mentions

CONFIGURATION = "transformers/configuration_utils.py"
CLASS = "Eagle3DraftModel"
METHOD = "_setup_embeddings_and_lm_heads"

TEXT_CONFIG = """\
def _verifier_text_config(name_or_path):
    # The verifier's text model config (a vision-language wrapper keeps it under text_config:
    # get_text_config() finds it, as vLLM does); its code trusted as speculators' own data
    # generator trusts it for the same path.
    config = AutoConfig.from_pretrained(name_or_path, trust_remote_code=True)
    return config.get_text_config()
"""
WEIGHTS = """\
# Where a checkpoint keeps its text model, as (prefix of model.*, prefix of lm_head.*): a causal
# LM; a vision-language wrapper as published (Kimi-K2.5, Llama-4, Gemma-3, Mistral-3); one laid
# out by transformers >= 4.52 (Qwen3-VL).
_TEXT_MODEL_LAYOUTS = (
    ("model.", "lm_head."),
    ("language_model.model.", "language_model.lm_head."),
    ("model.language_model.", "lm_head."),
)


def _verifier_tensor_names(name_or_path):
    # The names in the files load_model_layers reads: the index's weight map, else the keys
    # of the one model.safetensors.
    import json

    from huggingface_hub.errors import EntryNotFoundError
    from safetensors import safe_open

    from speculators.utils.loading import _resolve_file

    try:
        index = _resolve_file(name_or_path, "model.safetensors.index.json")
    except (FileNotFoundError, EntryNotFoundError):
        single = _resolve_file(name_or_path, "model.safetensors")
        with safe_open(single, framework="pt", device="cpu") as f:
            return set(f.keys())
    with open(index) as f:
        return set(json.load(f)["weight_map"])


def _load_verifier_weights(names, name_or_path):
    # load_model_layers for a causal LM's names (model.*, lm_head.*) wherever the checkpoint
    # keeps its text model: the first layout holding every model.* name; the tensors come
    # back under the names asked for (a tied checkpoint has no lm_head: left out).
    stored = _verifier_tensor_names(name_or_path)
    for layout in _TEXT_MODEL_LAYOUTS:
        keys = {}
        for name in names:
            for plain, prefix in zip(("model.", "lm_head."), layout):
                if name.startswith(plain):
                    keys[name] = prefix + name[len(plain) :]
        if all(keys[n] in stored for n in names if n.startswith("model.")):
            loaded = load_model_layers([keys[n] for n in names if keys[n] in stored], name_or_path)
            return {n: loaded[keys[n]] for n in names if keys[n] in loaded}
    raise KeyError(
        f"{name_or_path} holds none of {[p + 'embed_tokens.weight' for p, _ in _TEXT_MODEL_LAYOUTS]}"
    )
"""
# What each release's call reads: 0.3.0 the exact names (rewritten to _load_verifier_weights),
# 0.4.x suffixes ("embed_tokens.weight"), which already match a wrapper's names (left as is).
EXACT, SUFFIX = "model.embed_tokens.weight", "embed_tokens.weight"
LOAD = m.Call(func=m.Name("load_model_layers"))
CONFIG_LOAD = m.Call(
    func=m.Attribute(value=m.Name("AutoConfig"), attr=m.Name("from_pretrained")),
    args=[m.Arg(value=m.Attribute(value=m.Name("config"), attr=m.Name("name_or_path")), keyword=None)],
)
PAD = m.Attribute(value=m.Name("verifier_model_config"), attr=m.Name("pad_token_id"))


def _defined(tree: cst.Module, name: str) -> list[cst.CSTNode]:
    """The module-level statements that define ``name`` (a function or an assignment)."""
    return [
        s
        for s in tree.body
        if m.matches(s, m.FunctionDef(name=m.Name(name)))
        or m.matches(s, m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(target=m.Name(name))])]))
    ]


def _first_name(call: cst.Call) -> str | None:
    """The first string of the list ``call`` gets first (``load_model_layers([...], path)``)."""
    if not call.args or not isinstance(call.args[0].value, cst.List) or not call.args[0].value.elements:
        return None
    first = call.args[0].value.elements[0].value
    return first.evaluated_value if isinstance(first, cst.SimpleString) else None


class WrappedVerifier(PatchCodemod):
    DESCRIPTION = "Eagle3DraftModel: the verifier's text config and weights where a vision-language wrapper keeps them"

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        cls, method = self._method(tree)
        configs, loads, pads = (m.findall(method, matcher) for matcher in (CONFIG_LOAD, LOAD, PAD))
        if m.findall(method, m.Call(func=m.Name("_verifier_text_config"))):
            self._satisfied(tree, method)
        if len(configs) != 1 or len(loads) != 1 or len(pads) != 1:
            self.refuse(
                method,
                f"in {CLASS}.{METHOD} one AutoConfig.from_pretrained(config.name_or_path), one "
                "load_model_layers(...) and one verifier_model_config.pad_token_id",
            )
        first = _first_name(loads[0])
        if first not in (EXACT, SUFFIX):
            self.refuse(loads[0], f'load_model_layers(["{EXACT}", ...]) (0.3.0) or (["{SUFFIX}", ...]) (0.4)')
        helpers = [TEXT_CONFIG] + ([WEIGHTS] if first == EXACT else [])
        for name in (
            "_verifier_text_config",
            "_TEXT_MODEL_LAYOUTS",
            "_verifier_tensor_names",
            "_load_verifier_weights",
        ):
            if _defined(tree, name):
                self.refuse(_defined(tree, name)[0], f"no module-level {name} of its own")
        new_method = method.visit(_Rewrite(rename_load=first == EXACT))
        new_cls = cls.with_changes(
            body=cls.body.with_changes(body=[new_method if s is method else s for s in cls.body.body])
        )
        added = statements("\n\n".join(helpers), [cst.EmptyLine(indent=False)] * 2).nodes
        at = tree.body.index(cls)  # the helpers go just above the class, its own comments kept with it
        return tree.with_changes(body=[*tree.body[:at], *added, new_cls, *tree.body[at + 1 :]])

    def _method(self, tree: cst.Module) -> tuple[cst.ClassDef, cst.FunctionDef]:
        classes = [s for s in tree.body if m.matches(s, m.ClassDef(name=m.Name(CLASS)))]
        if len(classes) != 1:
            self.refuse(classes[1] if classes else None, f"one module-level class {CLASS}")
        cls = classes[0]
        found = [s for s in cls.body.body if m.matches(s, m.FunctionDef(name=m.Name(METHOD)))]
        if len(found) != 1:
            self.refuse(cls, f"one method {METHOD} in class {CLASS}")
        return cls, found[0]

    def _satisfied(self, tree: cst.Module, method: cst.FunctionDef) -> None:
        """The method already calls ``_verifier_text_config``: satisfied when the module's
        helpers are this patch's own (0.3.0: all of them, 0.4: the config's), else refused."""
        source = TEXT_CONFIG
        if m.findall(method, m.Call(func=m.Name("_load_verifier_weights"))):
            source += "\n\n" + WEIGHTS
        own = cst.parse_module(source)
        for stmt in own.body:
            name = stmt.name.value if isinstance(stmt, cst.FunctionDef) else "_TEXT_MODEL_LAYOUTS"
            found = _defined(tree, name)
            if len(found) != 1 or not same_code(found[0], code_of(stmt)):
                self.refuse(found[0] if found else method, f"this patch's {name} next to {CLASS}")
        if m.findall(method, CONFIG_LOAD) or m.findall(method, PAD):
            self.refuse(method, f"{METHOD} without AutoConfig.from_pretrained or .pad_token_id once patched")
        self.already_satisfied("the draft reads its verifier's text config through _verifier_text_config")


class _Rewrite(cst.CSTTransformer):
    """Inside the method: the config load, ``pad_token_id`` and (0.3.0) the weights load."""

    def __init__(self, rename_load: bool) -> None:
        super().__init__()
        self.rename_load = rename_load

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        if m.matches(original, CONFIG_LOAD):
            return updated.with_changes(func=cst.Name("_verifier_text_config"))
        if self.rename_load and m.matches(original, LOAD):
            return updated.with_changes(func=cst.Name("_load_verifier_weights"))
        return updated

    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute) -> cst.BaseExpression:
        if m.matches(original, PAD):
            return cst.parse_expression('getattr(verifier_model_config, "pad_token_id", None)')
        return updated


PATCH = Patch(
    id="SP034",
    name="wrapped-verifier",
    version=1,
    title="EAGLE-3 draft: find the verifier's text config and weights inside a vision-language wrapper (Kimi-K2.5)",
    risk="no EAGLE-3 draft can be built for a verifier inside a vision-language wrapper (Kimi-K2.5, Llama-4, Qwen3-VL, Gemma-3, Mistral-3)",
    file="speculators/models/eagle3/core.py",
    codemod=WrappedVerifier,
    facts=(
        Fact(
            summary="PretrainedConfig.get_text_config returns the text model's config a wrapper keeps under text_config",
            symbol="PretrainedConfig.get_text_config",
            first_release="4.45.0",
            probe=method_mentions(CONFIGURATION, "PretrainedConfig", "get_text_config", "text_config"),
        ),
    ),
    speculators=">=0.3.0,<0.4.1",
    order=10,
    portable=True,
    checks=CheckHooks(
        symptoms=(
            r"contains custom code which must be executed",
            r"object has no attribute '(hidden_size|vocab_size|pad_token_id)'",
            r"Could not find embedding weights in",
            r"KeyError: 'model\.embed_tokens\.weight'",
        )
    ),
)
