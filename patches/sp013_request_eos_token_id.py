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
"""

import libcst as cst
import libcst.matchers as m
from libcst.codemod.visitors import AddImportsVisitor

from patcher.fixes.cst_helpers import calls_to, keyword, statements
from patcher.fixes.patch import Patch, PatchCodemod

FLAG = "_REQUEST_TAKES_EOS_TOKEN_ID"
FLAG_DEFINED = m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(m.Name(FLAG))])])
DEFINE_FLAG = f"""\
# vLLM <= 0.16 requires Request(eos_token_id=); 0.17 removed it. Read once, at import.
{FLAG} = "eos_token_id" in inspect.signature(Request.__init__).parameters
"""
IMPORT = m.SimpleStatementLine(body=[m.Import() | m.ImportFrom()])


class PortableEosTokenId(PatchCodemod):
    DESCRIPTION = "Request(..., eos_token_id=x) -> **({'eos_token_id': x} if Request takes it else {})"

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        requests = calls_to(tree, "Request")
        if not requests:
            self.refuse(None, "a call Request(...)")
        pending = [c for c in requests if keyword(c, "eos_token_id") is not None]
        if not pending:
            self.already_satisfied("Request(...) does not pass eos_token_id unconditionally")
        if m.findall(tree, FLAG_DEFINED):
            self.refuse(None, f"no module-level {FLAG} before this patch")
        imports = [i for i, s in enumerate(tree.body) if m.matches(s, IMPORT)]
        if not imports:
            self.refuse(None, "module-level imports (Request is imported from vllm.v1.request)")
        AddImportsVisitor.add_needed_import(self.context, "inspect")
        tree = tree.visit(_Rewrite({id(c) for c in pending}))
        at = imports[-1] + 1
        flag = statements(DEFINE_FLAG, [cst.EmptyLine()]).nodes
        return tree.with_changes(body=[*tree.body[:at], *flag, *tree.body[at:]])


class _Rewrite(cst.CSTTransformer):
    def __init__(self, targets: set[int]) -> None:
        super().__init__()
        self.targets = targets

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        if id(original) not in self.targets:
            return updated
        args = []
        for arg in updated.args:
            if arg.keyword is not None and arg.keyword.value == "eos_token_id":
                value = cst.Module([]).code_for_node(arg.value)
                splat = cst.parse_expression(f'({{"eos_token_id": {value}}} if {FLAG} else {{}})')
                arg = cst.Arg(value=splat, star="**", comma=arg.comma)
            args.append(arg)
        return updated.with_changes(args=args)


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
    symptoms=(r"eos_token_id",),
)
