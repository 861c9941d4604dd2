"""SP018: speculators 0.4.x passes eos_token_id to Request only where vLLM takes it.

speculators 0.4.0/0.4.0.1 (data_generation/vllm_hidden_states_generator.py:264-274) builds
each request as ``Request(..., eos_token_id=self.tokenizer.eos_token_id, ...)``, as 0.3.0
does. vLLM 0.17 removed the parameter (vllm/v1/request.py, ``Request.__init__``), so every
``generate()`` raises TypeError (unexpected keyword argument) there.

The fix is SP013's codemod, unchanged (both run ``eos_token_id_where_taken.py``): the
generator reads ``Request.__init__``'s signature once, at import, and passes the keyword only
where it is accepted, so one patched file runs on vLLM 0.12-0.16 and on 0.17 and later. Like
SP013 it is needed wherever the keyword is passed unconditionally, whatever the installed vLLM.
"""

from patcher.fixes.patch import CheckHooks, Patch
from speculators_patch_codemods.eos_token_id_where_taken import PassEosTokenIdWhereTaken


class PortableEosTokenId04(PassEosTokenIdWhereTaken):
    DESCRIPTION = PassEosTokenIdWhereTaken.DESCRIPTION


PATCH = Patch(
    id="SP018",
    name="request-eos-token-id-04",
    version=1,
    title="Request (0.4.x): pass eos_token_id only where Request.__init__ takes it (removed in 0.17)",
    risk="on vLLM 0.17 and later every request fails: Request() no longer takes eos_token_id",
    file="speculators/data_generation/vllm_hidden_states_generator.py",
    codemod=PortableEosTokenId04,
    speculators=">=0.4.0,<0.4.1",
    order=57,
    portable=True,
    depends_on="at run time: whether Request.__init__ takes eos_token_id (vllm/v1/request.py; removed in 0.17)",
    checks=CheckHooks(symptoms=(r"eos_token_id",)),
)
