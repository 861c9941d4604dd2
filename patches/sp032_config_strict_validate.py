"""SP032: saving a draft config calls pydantic's ``validate`` instead of transformers' (5.4+).

From transformers 5.4.0, ``PretrainedConfig.save_pretrained`` checks the config first with
``self.validate()`` (transformers/configuration_utils.py; line 781 in 5.22.2), the method
its ``@strict`` dataclass decorator adds. On ``SpeculatorModelConfig`` (speculators/config.py),
a pydantic model first and a ``PretrainedConfig`` second, that name resolves to pydantic's
deprecated ``BaseModel.validate(value)`` classmethod, so no draft config or checkpoint can be
saved: ``TypeError: BaseModel.validate() missing 1 required positional argument: 'value'``
(measured on 5.22.2 once SP030 and SP031 are applied; the trainer's checkpointer saves
through ``save_pretrained``).

Portable form: ``SpeculatorModelConfig.validate()`` runs transformers' own validation where
``PretrainedConfig`` has it, and does nothing where it has none (before 5.4).
"""

from patcher.fixes.codemods import AddMethod
from patcher.fixes.patch import CheckHooks, Fact, Patch
from patcher.fixes.probes import method_calls

CONFIGURATION = "transformers/configuration_utils.py"


class TransformersValidate(AddMethod):
    DESCRIPTION = "SpeculatorModelConfig.validate(): transformers' checks, not pydantic's deprecated classmethod"
    CLASS = "SpeculatorModelConfig"
    BEFORE = "__init__"
    METHOD = """\
def validate(self):
    # transformers >= 5.4's save_pretrained calls self.validate(), its own checks of the
    # config; pydantic's deprecated BaseModel.validate(value) comes first in this MRO.
    checks = getattr(PretrainedConfig, "validate", None)
    if checks is not None:
        checks(self)
"""


PATCH = Patch(
    id="SP032",
    name="config-strict-validate",
    version=1,
    title="Draft configs: save_pretrained's validate() runs transformers' checks (transformers 5.4+)",
    risk="no draft config or checkpoint can be saved (BaseModel.validate() missing 'value'): training dies at its first save",
    file="speculators/config.py",
    codemod=TransformersValidate,
    facts=(
        Fact(
            summary="PretrainedConfig.save_pretrained calls self.validate()",
            symbol="PretrainedConfig.save_pretrained",
            first_release="5.4.0",
            probe=method_calls(CONFIGURATION, "PretrainedConfig", "save_pretrained", "self.validate"),
        ),
    ),
    speculators=">=0.3.0,<0.4.1",
    order=30,
    portable=True,
    checks=CheckHooks(symptoms=(r"BaseModel\.validate\(\) missing 1 required positional argument",)),
)
