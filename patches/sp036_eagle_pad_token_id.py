"""SP036: the EAGLE draft reads ``pad_token_id``, which a transformers 5 config need not have.

``EagleSpeculator.__init__`` (speculators/models/eagle.py:280 in 0.3.0, :336 in 0.4.0 and
0.4.0.1; :298 once SP014 has guarded the module's import) stores
``self.padding_idx = config.transformer_layer_config.pad_token_id``. Up to transformers 4.57
the base ``PretrainedConfig.__init__`` sets ``self.pad_token_id`` on every config
(transformers/configuration_utils.py:313 in 4.57.6); from 5.0.0 the base ``PreTrainedConfig``
sets none (each model's config declares its own: ``LlamaConfig`` does, a bare
``PretrainedConfig`` or a custom config need not). There the draft cannot be built:
``AttributeError: 'CustomConfig' object has no attribute 'pad_token_id'`` (measured:
speculators 0.3.0's own unit test
``tests/unit/models/test_eagle_model.py::test_eagle_speculator_auto_architecture_error_handling``
passes on transformers 4.57.6 and fails so on 5.22.2 with every other patch applied).
``padding_idx`` is only stored (0.3.0 and 0.4.x read it nowhere else), and 4.x's default is
``None``.

The fix: ``getattr(config.transformer_layer_config, "pad_token_id", None)``, the value 4.x
gives a config that names none. Right with transformers 4 and 5 alike (portable): needed
wherever the base config sets no ``pad_token_id`` (transformers 5.0.0 on).
"""

import libcst.matchers as m

from patcher.fixes.codemods import Replace
from patcher.fixes.patch import CheckHooks, Fact, Patch
from patcher.fixes.probes import class_sets_no_attribute

CONFIGURATION = "transformers/configuration_utils.py"
LAYER_CONFIG = m.Attribute(value=m.Name("config"), attr=m.Name("transformer_layer_config"))
READ = m.Attribute(value=LAYER_CONFIG, attr=m.Name("pad_token_id"))
DEFAULTED = m.Call(
    func=m.Name("getattr"),
    args=[m.Arg(value=LAYER_CONFIG), m.Arg(value=m.SimpleString('"pad_token_id"')), m.Arg(value=m.Name("None"))],
)


class PadTokenIdDefault(Replace):
    DESCRIPTION = "config.transformer_layer_config.pad_token_id -> getattr(..., 'pad_token_id', None)"
    MATCH = READ
    REPLACEMENT = 'getattr(config.transformer_layer_config, "pad_token_id", None)'
    SATISFIED = DEFAULTED
    SATISFIED_REASON = "the draft reads pad_token_id with None as default"
    EXPECTED = "'config.transformer_layer_config.pad_token_id' in EagleSpeculator.__init__"
    TOUCHES = m.Attribute(attr=m.Name("pad_token_id"))


PATCH = Patch(
    id="SP036",
    name="eagle-pad-token-id",
    version=1,
    title="EAGLE draft: read the layer config's pad_token_id with None as default (transformers 5)",
    risk="with transformers 5 an EAGLE draft whose layer config declares no pad_token_id cannot be built",
    file="speculators/models/eagle.py",
    codemod=PadTokenIdDefault,
    facts=(
        Fact(
            summary="PreTrainedConfig no longer sets pad_token_id: each model's config declares its own",
            symbol="PretrainedConfig.pad_token_id",
            first_release="5.0.0",
            probe=class_sets_no_attribute(CONFIGURATION, "PretrainedConfig", "pad_token_id"),
        ),
    ),
    speculators=">=0.3.0,<0.4.1",
    order=20,
    portable=True,
    checks=CheckHooks(symptoms=(r"object has no attribute 'pad_token_id'",)),
)
