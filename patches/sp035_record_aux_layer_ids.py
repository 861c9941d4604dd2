"""SP035: the trained draft's config names the hidden states it was trained on, in vLLM's numbering.

speculators' generator stores the **output** of decoder layer ``i``
(data_generation/custom_worker.py: appended after ``layer(...)``), by default of layers
``[2, n//2, n-3, n-1]`` (vllm_hidden_states_generator.py), and writes them to the data's
``data_config.json`` (``hidden_states.layer_ids``, data_generation/config_generator.py). The
trainer uses all but the last as the draft's auxiliary input (train/data.py
``standardize_data_v1``). vLLM hands an EAGLE-3 draft, as auxiliary layer ``i``, the hidden
state **entering** layer ``i`` (vllm/model_executor/models/llama.py: taken before ``layer(...)``
up to 0.17, ``_maybe_add_hidden_state(aux, idx + 1, ...)`` after it from 0.18; the same in
every release 0.11-0.34, ``patcher.fixes.vllm_eagle3``), so speculators' layer ``i`` is vLLM's
``i + 1``. Neither 0.3.0's ``scripts/train.py`` nor 0.4.x's ``Eagle3DraftModel.from_training_args``
sets ``eagle_aux_hidden_state_layer_ids``: vLLM then serves its defaults ``(2, n//2, n-3)``, the
outputs of layers 1, n/2-1, n-4, to a draft trained on 2, n/2, n-3. Silently one layer off.

The fix: ``Trainer.__init__`` (train/trainer.py) first reads the ``data_config.json`` beside the
training files and records their layers in vLLM's numbering in the draft's config (every
checkpoint then carries them, as speculators >= 0.9 writes its ids); a config that names other
layers than its data is refused before any step. Training data without a ``data_config.json``
is left as it was, with a warning. Portable: it reads JSON files and the model's config only.
"""

import libcst as cst
import libcst.matchers as m

from patcher.fixes.codemods import AddMethod
from patcher.fixes.cst_helpers import same_code, statements
from patcher.fixes.patch import Fact, Patch
from patcher.fixes.probes import aux_layers_are_layer_inputs

CLASS = "Trainer"
NAME = "record_aux_hidden_state_layers"
CALL = f"self.{NAME}()\n"
SETUP = m.SimpleStatementLine(
    body=[m.Expr(m.Call(func=m.Attribute(value=m.Name("self"), attr=m.Name("setup_trainer")), args=[]))]
)
RECORDED = m.SimpleStatementLine(
    body=[m.Expr(m.Call(func=m.Attribute(value=m.Name("self"), attr=m.Name(NAME)), args=[]))]
)
METHOD = """\
def record_aux_hidden_state_layers(self):
    # speculators-patch SP035: record in the draft's config, in vLLM's numbering, the layers its
    # training data holds (the data_config.json beside the training files). speculators'
    # generator stores the output of layer i; vLLM hands an EAGLE-3 draft the hidden state
    # entering layer i as its layer i: the same tensor is i + 1 there.
    import json
    import logging
    import os
    from pathlib import Path

    log = logging.getLogger("speculators")
    config = getattr(self.model, "config", None)
    if not hasattr(config, "eagle_aux_hidden_state_layer_ids"):
        return
    files = getattr(getattr(self.train_loader, "dataset", None), "data", None)
    if not isinstance(files, (list, tuple)):
        files = []
    directories = {os.path.dirname(os.fspath(f)) for f in files if isinstance(f, (str, os.PathLike))}
    found = {}
    for directory in sorted(directories):
        path = Path(directory) / "data_config.json"
        if not path.is_file():
            continue
        try:
            captured = sorted(set(json.loads(path.read_text())["hidden_states"]["layer_ids"]))
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{path}: no hidden_states.layer_ids saying which layers the data holds ({e})") from e
        # The last layer is the verifier's last hidden state; the others are the draft's input.
        found[str(path)] = [i + 1 for i in captured[:-1]]
    if len({tuple(ids) for ids in found.values()}) > 1:
        raise ValueError(f"the training data holds the hidden states of different layers: {found}")
    recorded = config.eagle_aux_hidden_state_layer_ids
    if not found:
        if recorded is None:
            log.warning(
                "no data_config.json beside the training data: the draft's config names no auxiliary "
                "layers (eagle_aux_hidden_state_layer_ids) and vLLM will serve it its default layers"
            )
        return
    where, ids = next(iter(found.items()))
    if recorded is None:
        config.eagle_aux_hidden_state_layer_ids = ids
        log.info(f"draft config: eagle_aux_hidden_state_layer_ids = {ids} (vLLM's numbering), from {where}")
    elif sorted(recorded) != ids:
        raise ValueError(
            f"the draft's config names auxiliary layers {list(recorded)} (eagle_aux_hidden_state_layer_ids, "
            f"vLLM's numbering: the hidden state entering each layer) but its data holds {ids} "
            f"({where}; speculators' layer i is vLLM's i + 1): set {ids} or leave it unset"
        )
"""


class RecordAuxLayerIds(AddMethod):
    DESCRIPTION = f"{CLASS}.__init__: record the data's auxiliary layers in the draft's config (vLLM's numbering)"
    CLASS = CLASS
    BEFORE = "setup_trainer"
    METHOD = METHOD

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        init = self._init(tree)
        calls = [s for s in init.body.body if m.matches(s, RECORDED)]
        if calls:
            method = m.findall(tree, m.FunctionDef(name=m.Name(NAME)))
            if len(calls) == 1 and len(method) == 1 and same_code(method[0], METHOD):
                self.already_satisfied(f"{CLASS}.__init__ calls {NAME}")
            self.refuse(calls[0], f"{CLASS}.{NAME} as SP035 writes it, called once from __init__")
        if m.findall(tree, m.FunctionDef(name=m.Name(NAME))):
            self.refuse(init, f"no {NAME} in class {CLASS} without its call in __init__")
        setups = [i for i, s in enumerate(init.body.body) if m.matches(s, SETUP)]
        if len(setups) != 1:
            self.refuse(init, f"one 'self.setup_trainer()' in {CLASS}.__init__")
        tree = super().transform_module_impl(tree)  # the method, above setup_trainer
        init = self._init(tree)
        body = list(init.body.body)
        at = setups[0]
        body[at:at] = statements(CALL, body[at].leading_lines).nodes
        body[at + 1] = body[at + 1].with_changes(leading_lines=[])
        return tree.deep_replace(init, init.with_changes(body=init.body.with_changes(body=body)))

    def _init(self, tree: cst.Module) -> cst.FunctionDef:
        classes = [s for s in tree.body if m.matches(s, m.ClassDef(name=m.Name(CLASS)))]
        if len(classes) != 1:
            self.refuse(classes[1] if classes else None, f"one module-level class {CLASS}")
        inits = m.findall(classes[0], m.FunctionDef(name=m.Name("__init__")))
        if len(inits) != 1 or not isinstance(inits[0].body, cst.IndentedBlock):
            self.refuse(classes[0], f"one __init__ in class {CLASS}")
        return inits[0]


PATCH = Patch(
    id="SP035",
    name="record-aux-layer-ids",
    version=1,
    title="Trainer: the draft's config names the layers its data holds, in vLLM's numbering (one layer off otherwise)",
    risk="vLLM serves the draft the hidden states one layer before those it was trained on (acceptance drops, no error)",
    file="speculators/train/trainer.py",
    codemod=RecordAuxLayerIds,
    facts=(
        Fact(
            summary="vLLM hands an EAGLE-3 draft, as auxiliary layer i, the hidden state entering decoder layer i",
            symbol="LlamaModel.forward (aux_hidden_state_layers)",
            first_release="0.11.0",
            probe=aux_layers_are_layer_inputs("vllm/model_executor/models/llama.py"),
            of_serving=True,  # the draft is served by a vLLM that may be elsewhere: needed where it trains
        ),
    ),
    speculators=">=0.3.0,<0.4.1",
    order=10,
    portable=True,
)
