"""SP013: stop passing eos_token_id to Request (removed in vLLM 0.17).

vLLM >= 0.17 (vllm/v1/request.py, Request.__init__) no longer takes `eos_token_id`; the
end-of-sequence token now lives on the sampling parameters. speculators 0.3.0 passes it
(TypeError: unexpected keyword argument). The generator is prefill-only with
max_tokens=1, so the request ends after one token whatever the EOS token is: dropping
the argument changes nothing it computes.

No code form serves every release: vLLM <= 0.16 requires the argument. The patch
targets the installed vLLM; after a downgrade to <= 0.16 `verify` reports it stale.
"""

from patcher.codemods import RemoveKeyword
from patcher.patch import Patch, VllmFact
from patcher.probes import parameter_absent


class DropEosTokenId(RemoveKeyword):
    DESCRIPTION = "Request(..., eos_token_id=...) -> without it"
    CALLEE = "Request"
    KEYWORD = "eos_token_id"


PATCH = Patch(
    id="SP013",
    name="request-eos-token-id",
    version=1,
    title="Request: drop the removed eos_token_id argument",
    file="speculators/data_generation/vllm_hidden_states_generator.py",
    codemod=DropEosTokenId,
    facts=(
        VllmFact(
            summary="Request.__init__ no longer takes eos_token_id",
            modules=("vllm/v1/request.py",),
            symbol="Request.__init__",
            first_release="0.17.0",
            probe=parameter_absent("vllm/v1/request.py", "Request.__init__", "eos_token_id"),
        ),
    ),
    order=57,
)
