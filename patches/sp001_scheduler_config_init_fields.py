"""SP001: pass SchedulerConfig's init-only field is_encoder_decoder.

vLLM >= 0.12 (vllm/config/scheduler.py, SchedulerConfig) declares
`is_encoder_decoder: InitVar[bool]` without a default; speculators 0.3.0 does not pass it
and fails with pydantic's "is_encoder_decoder Field required". The generator only serves
decoder-only target models (EAGLE-3 verifiers), so the value is False.
"""

from patcher.fixes.codemods import AddKeyword
from patcher.fixes.patch import CheckHooks, Patch, VllmFact
from patcher.fixes.probes import init_field_required


class PassIsEncoderDecoder(AddKeyword):
    DESCRIPTION = "SchedulerConfig(...) -> SchedulerConfig(..., is_encoder_decoder=False)"
    CALLEE = "SchedulerConfig"
    KEYWORD = "is_encoder_decoder"
    VALUE = "False"


PATCH = Patch(
    id="SP001",
    name="scheduler-config-init-fields",
    version=1,
    title="SchedulerConfig: pass the required init-only field is_encoder_decoder",
    risk="the generator fails to start: SchedulerConfig requires is_encoder_decoder",
    file="speculators/data_generation/vllm_hidden_states_generator.py",
    codemod=PassIsEncoderDecoder,
    facts=(
        VllmFact(
            summary="SchedulerConfig requires the init-only field is_encoder_decoder",
            symbol="SchedulerConfig.is_encoder_decoder",
            first_release="0.12.0",
            probe=init_field_required("vllm/config/scheduler.py", "SchedulerConfig", "is_encoder_decoder"),
        ),
    ),
    order=10,
    checks=CheckHooks(symptoms=(r"is_encoder_decoder|max_model_len\s+Field required",)),
)
