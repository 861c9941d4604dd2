"""SP012: run every prompt's prefill to completion and assemble results per request (generator).

speculators 0.3.0 aborts every scheduled request after the step it was first scheduled in
and slices the concatenated captures by prompt length in submission order. With chunked
prefill (vLLM >= 0.12 default) a prompt that does not fit the step's token budget is split:
0.3.0 aborts it half-computed, and its rows plus everything after it are attributed to the
wrong requests, silently (REFERENCE item 10; upstream speculators issue #279).

The emitted generator code counts each request's scheduled prompt tokens and finishes a
request only once its whole prompt has run (so no decode step is ever scheduled), keeps
stepping while vLLM schedules anything, asks the workers for the captures per request
(``_get_captured_states(per_request=True)``, added by SP010), and returns them in input
order. It
raises ``RuntimeError`` instead of returning data when a request's scheduled tokens or
captured rows differ from its prompt length (e.g. a request that never got KV cache room,
or a preempted one that was recomputed).
"""

import libcst as cst
import libcst.matchers as m

from patcher.fixes.cst_helpers import append_keyword, same_code, statements
from patcher.fixes.patch import CheckHooks, Patch, PatchCodemod

PER_REQUEST = '{"per_request": True}'  # collective_rpc(..., kwargs=PER_REQUEST)


def _self_call(owner: str, method: str) -> m.Call:
    return m.Call(func=m.Attribute(value=m.Attribute(m.Name("self"), m.Name(owner)), attr=m.Name(method)))


ADD_REQUEST = m.SimpleStatementLine(body=[m.Expr(_self_call("scheduler", "add_request"))])
SUBMIT_LOOP = m.For(body=m.IndentedBlock(body=[m.ZeroOrMore(), ADD_REQUEST, m.ZeroOrMore()]))
# for req_id in scheduler_output.num_scheduled_tokens: self.scheduler.finish_requests(...)
ABORT_LOOP = m.For(
    iter=m.Attribute(m.Name("scheduler_output"), m.Name("num_scheduled_tokens")),
    body=m.IndentedBlock(body=[m.SimpleStatementLine(body=[m.Expr(_self_call("scheduler", "finish_requests"))])]),
)
STEP_LOOP = m.While(body=m.IndentedBlock(body=[m.ZeroOrMore(), ABORT_LOOP, m.ZeroOrMore()]))
RPC = m.Call(
    func=m.Attribute(attr=m.Name("collective_rpc")),
    args=[m.Arg(m.SimpleString('"_get_captured_states"') | m.SimpleString("'_get_captured_states'")), m.ZeroOrMore()],
)
RPC_PER_REQUEST = m.Call(
    func=m.Attribute(attr=m.Name("collective_rpc")),
    args=[m.Arg(m.SimpleString()), m.ZeroOrMore(), m.Arg(keyword=m.Name("kwargs")), m.ZeroOrMore()],
)
SEQ_LENS = m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(m.Name("seq_lens"))])])
OFFSET = m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(m.Name("offset"))], value=m.Integer("0"))])
# layer_states = [h[offset : offset + seq_len]... for h in aux_hidden_states]
SLICE_STATES = m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(m.Name("layer_states"))])])
OFFSET_STEP = m.SimpleStatementLine(body=[m.AugAssign(target=m.Name("offset"))])
RESULTS_LOOP = m.For(
    iter=m.Call(func=m.Name("enumerate"), args=[m.Arg(m.Name("seq_lens"))]),
    body=m.IndentedBlock(body=[m.ZeroOrMore(), SLICE_STATES, m.ZeroOrMore(), OFFSET_STEP, m.ZeroOrMore()]),
)
LAYERS_LOG = 'log.debug(f"Successfully captured {len(aux_hidden_states)} layers")'

PROMPT_LENS = "prompt_lens = {}\n"
RECORD_LEN = "prompt_lens[req.request_id] = len(ids_list)\n"
COMPUTED = "computed = dict.fromkeys(prompt_lens, 0)\n"
FINISH_DONE = """\
# vLLM may split a prompt across steps (chunked prefill): finish a request only
# once its whole prompt has run, so no decode step is ever scheduled for it.
finished = []
for req_id, num_tokens in scheduler_output.num_scheduled_tokens.items():
    computed[req_id] += num_tokens
    if computed[req_id] >= prompt_lens[req_id]:
        finished.append(req_id)
self.scheduler.finish_requests(finished, RequestStatus.FINISHED_ABORTED)
"""
ABORT_REST = """\
# Requests vLLM stopped scheduling before their prompt ended are reported below.
unfinished = [req_id for req_id, n in computed.items() if n < prompt_lens[req_id]]
if unfinished:
    self.scheduler.finish_requests(unfinished, RequestStatus.FINISHED_ABORTED)
"""
REQUESTS_LOG = 'log.debug(f"Successfully captured {len(aux_hidden_states)} requests")\n'
RESULTS_COMMENT = (
    "# Captures arrive per request; refuse to return anything when a request's rows do",
    "# not cover exactly its prompt.",
)
RESULTS_TARGET = "i, (req_id, seq_len)"
RESULTS_ITER = "enumerate(prompt_lens.items())"
CHECKED_STATES = """\
layer_states = aux_hidden_states.get(req_id)
if (
    computed[req_id] != seq_len
    or not layer_states
    or any(h.shape[0] != seq_len for h in layer_states)
):
    raise RuntimeError(
        f"Hidden states of request {req_id} do not match its prompt: "
        f"{seq_len} prompt tokens, {computed[req_id]} scheduled, captured rows "
        f"per layer {[h.shape[0] for h in layer_states or []]}"
    )
layer_states = [h.cpu() for h in layer_states]
"""


# What the rewrite drops or replaces, as speculators 0.3.0 has it (a hand edit there is refused, not lost).
EXACT = (
    (
        ABORT_LOOP,
        "for req_id in scheduler_output.num_scheduled_tokens:\n"
        "    self.scheduler.finish_requests([req_id], RequestStatus.FINISHED_ABORTED)",
    ),
    (SEQ_LENS, "seq_lens = [len(ids) for ids in input_ids_list]"),
    (SLICE_STATES, "layer_states = [h[offset : offset + seq_len].clone().cpu() for h in aux_hidden_states]"),
    (OFFSET_STEP, "offset += seq_len"),
    (ADD_REQUEST, "self.scheduler.add_request(req)"),
)
RESULTS_HEAD = "for i, seq_len in enumerate(seq_lens): pass"
IDS_LIST = m.Assign(targets=[m.AssignTarget(m.Name("ids_list"))])  # RECORD_LEN reads it


def _rpc_args_known(call: cst.Call) -> bool:
    """``collective_rpc("_get_captured_states")``, or with 0.3.0's ``unique_reply_rank=0`` (SP006 skipped)."""
    rest = call.args[1:]
    return not rest or (
        len(rest) == 1 and m.matches(rest[0], m.Arg(m.Integer("0"), keyword=m.Name("unique_reply_rank")))
    )


def _code(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node).strip()


class PrefillToCompletion(PatchCodemod):
    DESCRIPTION = "abort a request only after its whole prompt ran; assemble results per request id"

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        for call in m.findall(tree, RPC):
            if m.matches(call, RPC_PER_REQUEST):
                kwargs = next(a for a in call.args if a.keyword is not None and a.keyword.value == "kwargs")
                if not same_code(kwargs.value, PER_REQUEST):
                    self.refuse(kwargs, f'collective_rpc("_get_captured_states", kwargs={PER_REQUEST})')
                self.already_satisfied("the generator assembles captures per request")
        anchors = (SUBMIT_LOOP, STEP_LOOP, RPC, SEQ_LENS, OFFSET, RESULTS_LOOP)
        shape = (
            "speculators 0.3.0's generate(): the add_request loop, the step loop aborting every scheduled "
            'request, collective_rpc("_get_captured_states"), and the seq_lens/offset slicing loop'
        )
        if not all(m.findall(tree, a) for a in anchors):
            self.refuse(None, shape)
        for matcher in (*anchors, ADD_REQUEST, ABORT_LOOP, SLICE_STATES, OFFSET_STEP):
            for extra in m.findall(tree, matcher)[1:]:
                self.refuse(extra, shape + ", each once")
        for matcher, code in EXACT:
            for node in m.findall(tree, matcher):
                if not same_code(node, code):
                    self.refuse(node, f"'{code.splitlines()[0]}...'" if "\n" in code else f"'{code}'")
        loop = m.findall(tree, RESULTS_LOOP)[0]
        if not same_code(
            loop.with_changes(body=cst.IndentedBlock([cst.SimpleStatementLine([cst.Pass()])])), RESULTS_HEAD
        ):
            self.refuse(loop, f"'{RESULTS_HEAD[:-6]}'")
        for call in m.findall(tree, RPC):
            if not _rpc_args_known(call):
                self.refuse(call, 'collective_rpc("_get_captured_states") without other arguments')
        if not m.findall(m.findall(tree, SUBMIT_LOOP)[0], IDS_LIST):
            self.refuse(m.findall(tree, SUBMIT_LOOP)[0], "an add_request loop that sets ids_list")
        return tree.visit(_Rewrite())


class _Rewrite(cst.CSTTransformer):
    def leave_SimpleStatementLine(self, original, updated):
        if m.matches(updated, ADD_REQUEST):
            return cst.FlattenSentinel([updated, *cst.parse_module(RECORD_LEN).body])
        if _code(updated) == LAYERS_LOG:
            return statements(REQUESTS_LOG, updated.leading_lines)
        return updated

    def leave_IndentedBlock(self, original, updated):
        # Drop seq_lens/offset; the next statement inherits their blank lines.
        body, carried = [], []
        for stmt in updated.body:
            if m.matches(stmt, SEQ_LENS) or m.matches(stmt, OFFSET):
                carried += stmt.leading_lines
                continue
            if carried:
                stmt = stmt.with_changes(leading_lines=[*carried, *stmt.leading_lines])
                carried = []
            body.append(stmt)
        return updated.with_changes(body=body)

    def leave_For(self, original, updated):
        if m.matches(updated, SUBMIT_LOOP):
            first = cst.parse_statement(PROMPT_LENS).with_changes(leading_lines=updated.leading_lines)
            return cst.FlattenSentinel([first, updated.with_changes(leading_lines=[])])
        if m.matches(original, ABORT_LOOP):
            return statements(FINISH_DONE, updated.leading_lines)
        if m.matches(original, RESULTS_LOOP):
            body = []
            for stmt in updated.body.body:
                if m.matches(stmt, SLICE_STATES):
                    body += statements(CHECKED_STATES, stmt.leading_lines).nodes
                elif not m.matches(stmt, OFFSET_STEP):
                    body.append(stmt)
            comments = [cst.EmptyLine(comment=cst.Comment(c)) for c in RESULTS_COMMENT]
            return updated.with_changes(
                target=cst.parse_expression(RESULTS_TARGET),
                iter=cst.parse_expression(RESULTS_ITER),
                body=updated.body.with_changes(body=body),
                leading_lines=[*updated.leading_lines, *comments],
            )
        return updated

    def leave_While(self, original, updated):
        if not m.matches(original, STEP_LOOP):
            return updated
        before = cst.parse_statement(COMPUTED).with_changes(leading_lines=updated.leading_lines)
        after = statements(ABORT_REST, [cst.EmptyLine(indent=False)]).nodes
        return cst.FlattenSentinel([before, updated.with_changes(leading_lines=[]), *after])

    def leave_Call(self, original, updated):
        if not m.matches(updated, RPC):
            return updated
        if len(updated.args) == 1 and isinstance(updated.whitespace_before_args, cst.ParenthesizedWhitespace):
            # One argument on its own line (0.3.0's layout once SP006 ran): same for the new one.
            first = updated.args[0].with_changes(comma=cst.Comma(whitespace_after=updated.whitespace_before_args))
            new = cst.Arg(
                keyword=cst.Name("kwargs"),
                value=cst.parse_expression(PER_REQUEST),
                equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")),
                comma=updated.args[0].comma,
            )
            return updated.with_changes(args=[first, new])
        return append_keyword(updated, "kwargs", PER_REQUEST)


PATCH = Patch(
    id="SP012",
    name="prefill-to-completion",
    version=1,
    title="Generator: finish each prompt across chunked steps, results per request or an error",
    risk="prompts split across steps are aborted half-way: hidden states can be attributed to the wrong request",
    file="speculators/data_generation/vllm_hidden_states_generator.py",
    codemod=PrefillToCompletion,
    order=120,
    portable=True,
    requires=("SP010",),  # calls _get_captured_states(per_request=True), which SP010 adds
    checks=CheckHooks(attribution=True),
)
