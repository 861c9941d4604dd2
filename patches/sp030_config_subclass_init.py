"""SP030: transformers 5.4+ replaces the ``__init__`` of speculators' config subclasses.

From transformers 5.4.0, ``PretrainedConfig`` is a dataclass whose ``__init_subclass__``
(``PreTrainedConfig.__init_subclass__``, transformers/configuration_utils.py; line 539 in
5.22.2) turns every subclass into a keyword-only dataclass and, when the subclass defines no
``__init__``, wraps a generated one (``wrap_init_to_accept_kwargs``) that sets each field
with ``setattr`` before anything else runs. speculators' ``Eagle3SpeculatorConfig``
(speculators/models/eagle3/config.py) defines none: its ``__init__`` should be
``SpeculatorModelConfig.__init__`` (speculators/config.py), which initialises the pydantic
model first. With the generated one, pydantic's ``__setattr__`` runs on an uninitialised
model and no EAGLE-3 draft can be built:
``AttributeError: 'Eagle3SpeculatorConfig' object has no attribute '__pydantic_fields_set__'``
(measured on transformers 5.4.0-5.25.0; 4.56-5.3 build it).

Portable form: ``SpeculatorModelConfig.__init_subclass__`` lets transformers' hook run, then
drops the ``__init__`` it put on a subclass that had none, so the inherited one is used
again. Where transformers adds none (before 5.4) the method changes nothing.
"""

from patcher.fixes.codemods import AddMethod
from patcher.fixes.patch import CheckHooks, Fact, Patch
from patcher.fixes.probes import method_calls

CONFIGURATION = "transformers/configuration_utils.py"


class KeepSubclassInit(AddMethod):
    DESCRIPTION = "SpeculatorModelConfig: a subclass keeps the inherited __init__ under transformers >= 5.4"
    CLASS = "SpeculatorModelConfig"
    BEFORE = "__init__"
    METHOD = """\
def __init_subclass__(cls, **kwargs):
    # transformers >= 5.4 replaces the __init__ of a config subclass that defines none
    # (PretrainedConfig.__init_subclass__): take it off, so this class's is inherited.
    defines_init = "__init__" in cls.__dict__
    super().__init_subclass__(**kwargs)
    if not defines_init and "__init__" in cls.__dict__:
        del cls.__init__
"""


PATCH = Patch(
    id="SP030",
    name="config-subclass-init",
    version=1,
    title="Draft configs: keep SpeculatorModelConfig's __init__ on subclasses (transformers 5.4+)",
    risk="no EAGLE-3 draft config can be built (AttributeError: ... '__pydantic_fields_set__'): training cannot start",
    file="speculators/config.py",
    codemod=KeepSubclassInit,
    facts=(
        Fact(
            summary="PretrainedConfig.__init_subclass__ wraps the __init__ of subclasses that define none",
            symbol="PretrainedConfig.__init_subclass__",
            first_release="5.4.0",
            probe=method_calls(CONFIGURATION, "PretrainedConfig", "__init_subclass__", "wrap_init_to_accept_kwargs"),
        ),
    ),
    speculators=">=0.3.0,<0.4.1",
    order=10,
    portable=True,
    checks=CheckHooks(symptoms=(r"__pydantic_fields_set__",)),
)
