"""SP031: speculators' config subclasses cannot be validated under transformers 5.4+ (``torch``).

From transformers 5.4.0, ``PretrainedConfig``'s fields are class-level annotations, some
naming torch (``dtype: str | torch.dtype | None``, transformers/configuration_utils.py; line
416 in 5.22.2) in a module that imports torch for type checkers only. pydantic resolves a
model's annotations in the namespace of the module that defines it, where ``torch`` is
absent; SP019 rebuilds the base ``SpeculatorModelConfig`` with torch in scope, but every
subclass (``Eagle3SpeculatorConfig``, speculators/models/eagle3/config.py) stays "not fully
defined", and building a draft config fails:
``PydanticUserError: `Eagle3SpeculatorConfig` is not fully defined; you should define
`torch`, then call `Eagle3SpeculatorConfig.model_rebuild()``` (measured on 5.22.2 once SP030
is applied).

Portable form: ``SpeculatorModelConfig.__pydantic_init_subclass__`` (pydantic's hook, run
once a subclass is complete) rebuilds the subclass with torch imported in its own frame,
which ``model_rebuild`` reads names from (as SP019 does for the base); an annotation that
still cannot be resolved is left for pydantic to report as before (``raise_errors=False``).
"""

from patcher.fixes.codemods import AddMethod
from patcher.fixes.patch import CheckHooks, Fact, Patch
from patcher.fixes.probes import field_annotation_mentions

CONFIGURATION = "transformers/configuration_utils.py"


class RebuildSubclassesWithTorch(AddMethod):
    DESCRIPTION = "SpeculatorModelConfig: rebuild each subclass with torch in scope"
    CLASS = "SpeculatorModelConfig"
    BEFORE = "__init__"
    METHOD = """\
@classmethod
def __pydantic_init_subclass__(cls, **kwargs):
    # transformers >= 5.4 annotates PretrainedConfig's fields with torch types; pydantic
    # resolves them in the caller's frame of model_rebuild: this one, with torch in it.
    super().__pydantic_init_subclass__(**kwargs)
    import torch  # noqa: F401

    cls.model_rebuild(force=True, raise_errors=False)
"""


PATCH = Patch(
    id="SP031",
    name="config-subclass-torch-annotations",
    version=1,
    title="Draft configs: rebuild each config subclass with torch in scope (transformers 5.4+)",
    risk="no EAGLE-3 draft config can be built (Eagle3SpeculatorConfig is not fully defined): training cannot start",
    file="speculators/config.py",
    codemod=RebuildSubclassesWithTorch,
    facts=(
        Fact(
            summary="PretrainedConfig declares its dtype field with a torch annotation",
            symbol="PretrainedConfig.dtype",
            first_release="5.4.0",
            probe=field_annotation_mentions(CONFIGURATION, "PretrainedConfig", "dtype", "torch"),
        ),
    ),
    speculators=">=0.3.0,<0.4.1",
    order=20,
    portable=True,
    checks=CheckHooks(symptoms=(r"is not fully defined; you should define `torch`",)),
)
