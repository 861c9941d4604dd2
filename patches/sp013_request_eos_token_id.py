"""SP013: pass eos_token_id to Request only where vLLM still takes it (removed in 0.17).

vLLM 0.11-0.16 (vllm/v1/request.py, Request.__init__) require `eos_token_id`; vLLM 0.17
removed the parameter (the end-of-sequence token lives on the sampling parameters), so
speculators 0.3.0's `Request(..., eos_token_id=...)` raises TypeError (unexpected
keyword argument) there. The generator is prefill-only with max_tokens=1, so the request
ends after one token whatever the EOS token is.

Portable form: the generator reads `Request.__init__`'s signature once, at import
(`inspect.signature`), and passes the keyword only where it is accepted. One patched file
runs on 0.11-0.16 and on 0.17 and later, so vLLM can be upgraded or downgraded under it.
The patch is needed wherever the generator passes `eos_token_id` unconditionally,
whatever the installed vLLM: a 0.16-patched install then survives an upgrade to 0.17.
The codemod is written out in ``eos_token_id_where_taken.py``, which SP018 (0.4.x) runs too.
"""

from patcher.fixes.patch import CheckHooks, Patch
from speculators_patch_codemods.eos_token_id_where_taken import PassEosTokenIdWhereTaken


class PortableEosTokenId(PassEosTokenIdWhereTaken):
    DESCRIPTION = PassEosTokenIdWhereTaken.DESCRIPTION


PATCH = Patch(
    id="SP013",
    name="request-eos-token-id",
    version=2,
    title="Request: pass eos_token_id only where Request.__init__ takes it (removed in 0.17)",
    risk="on vLLM 0.17 and later every request fails: Request() no longer takes eos_token_id",
    file="speculators/data_generation/vllm_hidden_states_generator.py",
    codemod=PortableEosTokenId,
    order=57,
    portable=True,
    depends_on="at run time: whether Request.__init__ takes eos_token_id (vllm/v1/request.py; removed in 0.17)",
    checks=CheckHooks(symptoms=(r"eos_token_id",)),
)
