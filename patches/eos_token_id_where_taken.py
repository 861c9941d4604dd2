"""The codemod that SP013 (speculators 0.3.0) and SP018 (0.4.x) both run, written out once.

Both releases' generators build each request as ``Request(..., eos_token_id=..., ...)``, which
vLLM 0.17 no longer takes. ``PassEosTokenIdWhereTaken`` rewrites that keyword into a splat
that passes it only where ``Request.__init__``'s signature, read once at import, takes it.
The emitted bytes are pinned by tests/patches/test_codemod_audit.py: a change here changes
what SP013 and SP018 write. Not a patch: it defines no ``PATCH``.
"""

import libcst as cst
import libcst.matchers as m
from libcst.codemod.visitors import AddImportsVisitor

from patcher.fixes.cst_helpers import calls_to, keyword, statements
from patcher.fixes.patch import PatchCodemod

FLAG = "_REQUEST_TAKES_EOS_TOKEN_ID"
FLAG_DEFINED = m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(m.Name(FLAG))])])
DEFINE_FLAG = f"""\
# vLLM <= 0.16 requires Request(eos_token_id=); 0.17 removed it. Read once, at import.
{FLAG} = "eos_token_id" in inspect.signature(Request.__init__).parameters
"""
IMPORT = m.SimpleStatementLine(body=[m.Import() | m.ImportFrom()])


class PassEosTokenIdWhereTaken(PatchCodemod):
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
