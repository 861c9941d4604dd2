"""SP029: collect each step's captures from shared host memory while the GPU runs the next (generator).

The generator side of SP028. At the end of set-up the generator asks rank 0's worker for the
shared ring (``_share_captures``) and maps it. In ``generate()``, after each
``execute_model``, it asks for the steps whose copies are done (``_staged_captures``: a few
hundred bytes of layout, no tensor data) and a thread of its own copies their rows into one
CPU tensor per request and layer, allocated at the prompt's length in the model's dtype,
while the GPU computes the step just launched and the next one is scheduled (torch's copies
release the GIL; the ring has three slots, so the slot being read is never the one being
written). After the last step it collects the rest. Each request then has what
speculators 0.3.0 returned for it: ``hidden_states`` is a list of contiguous CPU tensors of
shape (prompt length, hidden size), one storage each, in the model's dtype; nothing of it is
moved to or from a GPU in this process, which no longer creates a CUDA context of its own.
SP012's checks still refuse to return a request whose rows do not cover its prompt (a request
short of rows gets tensors cut at the rows it has).

Host memory: the results of one ``generate()`` call plus the ring (3 steps x layers x
``max_num_batched_tokens`` rows), both reported at set-up in the log. Where the worker cannot
share memory (no memfd or /proc), the generator logs why and falls back to the
per-request RPC of SP010/SP012.
"""

import libcst as cst
import libcst.matchers as m

from patcher.fixes.cst_helpers import statements
from patcher.fixes.patch import Patch, PatchCodemod


def _self_call(owner: str, method: str, *args) -> m.Call:
    return m.Call(
        func=m.Attribute(value=m.Attribute(m.Name("self"), m.Name(owner)), attr=m.Name(method)),
        args=list(args) if args else m.DoNotCare(),
    )


def _line(expr) -> m.SimpleStatementLine:
    return m.SimpleStatementLine(body=[expr])


GENERATOR = m.ClassDef(name=m.Name("VllmHiddenStatesGenerator"))
HELPER = m.ClassDef(name=m.Name("_HostCaptures"))
INITIALIZED = _line(m.Expr(_self_call("executor", "initialize_from_config")))
RESET = _line(m.Expr(_self_call("executor", "collective_rpc", m.Arg(m.SimpleString('"_reset_capture"')))))
# The step in generate()'s loop: SP005's 'model_output = ...' form, or 0.3.0's own (vLLM 0.11)
STEP_CALL = _self_call("executor", "execute_model", m.Arg(m.Name("scheduler_output")))
STEP = _line(m.Assign(targets=[m.AssignTarget(m.Name("model_output"))], value=STEP_CALL) | m.Expr(STEP_CALL))
STEP_LOOP = m.While(
    test=m.Comparison(
        left=m.Attribute(
            value=m.NamedExpr(target=m.Name("scheduler_output")), attr=m.Name("total_num_scheduled_tokens")
        )
    )
)
# SP012's per-request RPC and the line reading rank 0's reply
ASKED = _line(
    m.Assign(
        targets=[m.AssignTarget(m.Name("captured_states_list"))],
        value=_self_call(
            "executor",
            "collective_rpc",
            m.Arg(m.SimpleString('"_get_captured_states"')),
            m.ZeroOrMore(),
            m.Arg(keyword=m.Name("kwargs")),
            m.ZeroOrMore(),
        ),
    )
)  # SP006 drops a unique_reply_rank= beside it (0.12+)
TAKEN = _line(
    m.Assign(
        targets=[m.AssignTarget(m.Name("aux_hidden_states"))],
        value=m.Subscript(m.Name("captured_states_list"), [m.SubscriptElement(m.Index(m.Integer("0")))]),
    )
)

HELPER_CODE = '''\
class _HostCaptures:
    """Hidden states collected from the shared host memory the worker stages each step's
    captures in (speculators-patch SP028/SP029): one CPU tensor per request and layer, filled
    step by step on a thread of its own while the next steps run. Without that memory
    (``ring`` None) the per-request RPC answers instead."""

    def __init__(self, executor):
        from concurrent.futures import ThreadPoolExecutor

        self.executor, self.ring, self.pending = executor, None, None
        try:
            self.shared = shared = executor.collective_rpc("_share_captures")[0]
            data = torch.from_file(shared["path"], shared=True, size=shared["bytes"], dtype=torch.uint8)
            self.ring = data.view(getattr(torch, shared["dtype"])).view(*shared["shape"])
        except Exception as e:  # e.g. no memfd or /proc on this system
            log.warning(f"hidden states go through the RPC, not shared memory ({type(e).__name__}: {e})")
            return
        self.copier = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hidden-state-copy")
        slots, layers, rows, hidden = shared["shape"]
        log.info(
            f"hidden-state transfer: {shared['bytes'] / 2**20:.0f} MiB of shared host memory "
            f"({'pinned' if shared['pinned'] else 'not pinned'}): {slots} steps x {layers} layers x "
            f"{rows} tokens x {hidden} ({shared['dtype']})"
        )

    def start(self, prompt_lens):
        """Begin a batch: ``prompt_lens`` maps each request id to its prompt's length."""
        self._wait(raise_error=False)  # an earlier batch that failed half-way
        self.prompt_lens, self.filled, self.states = prompt_lens, dict.fromkeys(prompt_lens, 0), {}

    def collect(self, final=False):
        """Take the steps the worker has staged (every step but the one running; all of them
        when ``final``) and copy them out: on the copy thread, or here when ``final``. The
        worker writes a step's slot again three steps later; the copies of the step before
        are done by then, since each call first waits for them."""
        if self.ring is None:
            return
        self._wait()
        steps = self.executor.collective_rpc("_staged_captures", kwargs={"final": final})[0]
        if final:
            self._copy_out(steps)
        elif steps:
            self.pending = self.copier.submit(self._copy_out, steps)

    def _wait(self, raise_error=True):
        pending, self.pending = self.pending, None
        if pending is not None:
            try:
                pending.result()
            except Exception:
                if raise_error:
                    raise

    def _copy_out(self, steps):
        _, layers, _, hidden = self.ring.shape
        for step, slot, layout in steps:
            offset = 0
            for req_id, n in layout:
                if req_id not in self.prompt_lens or self.filled[req_id] + n > self.prompt_lens[req_id]:
                    raise RuntimeError(f"Step {step} scheduled {n} tokens of request {req_id} beyond its prompt")
                states = self.states.get(req_id)
                if states is None:
                    shape = (self.prompt_lens[req_id], hidden)
                    states = self.states[req_id] = [torch.empty(shape, dtype=self.ring.dtype) for _ in range(layers)]
                start = self.filled[req_id]
                for layer, state in enumerate(states):
                    state[start : start + n].copy_(self.ring[slot, layer, offset : offset + n])
                self.filled[req_id] += n
                offset += n

    def finish(self):
        """{request id: [tensor per layer]} of the batch, cut at the rows each request got."""
        if self.ring is None:
            return self.executor.collective_rpc("_get_captured_states", kwargs={"per_request": True})[0]
        self.collect(final=True)
        return {
            req_id: [s if self.filled[req_id] == s.shape[0] else s[: self.filled[req_id]] for s in states]
            for req_id, states in self.states.items()
        }
'''
SHARE = """\
# Captures reach this process through shared host memory, step by step (speculators-patch SP029).
self._host_captures = _HostCaptures(self.executor)
"""
START = "self._host_captures.start(prompt_lens)\n"
COLLECT = "self._host_captures.collect()  # the previous step's rows, copied while the GPU runs this one\n"
FINISH = "aux_hidden_states = self._host_captures.finish()\n"


class CollectCapturesPerStep(PatchCodemod):
    DESCRIPTION = "generator: map the worker's capture ring, copy each step's rows out during the next step"

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        if m.findall(tree, HELPER):
            self.already_satisfied("captures are collected from shared host memory")
        loops = m.findall(tree, STEP_LOOP)
        anchors = {
            "self.executor.initialize_from_config(...)": (tree, INITIALIZED),
            'self.executor.collective_rpc("_reset_capture")': (tree, RESET),
            "self.executor.execute_model(scheduler_output) in the step loop": (loops[0] if loops else tree, STEP),
            'captured_states_list = self.executor.collective_rpc("_get_captured_states", kwargs=...)': (tree, ASKED),
            "aux_hidden_states = captured_states_list[0]": (tree, TAKEN),
        }
        if len(loops) != 1:
            self.refuse(
                None, "one 'while (scheduler_output := self.scheduler.schedule()).total_num_scheduled_tokens' loop"
            )
        for shown, (where, matcher) in anchors.items():
            found = m.findall(where, matcher)
            if len(found) != 1:
                self.refuse(found[1] if found else None, f"one '{shown}' in the generator (SP029 applies after SP012)")
        if len(m.findall(tree, GENERATOR)) != 1:
            self.refuse(None, "one class VllmHiddenStatesGenerator")
        newline = tree.default_newline
        return tree.visit(_Rewrite(statements(HELPER_CODE.replace("\n", newline)).nodes))


class _Rewrite(cst.CSTTransformer):
    def __init__(self, helper) -> None:
        super().__init__()
        self.helper = helper

    def visit_While(self, node):
        self.in_loop = getattr(self, "in_loop", 0) + m.matches(node, STEP_LOOP)

    def leave_While(self, original, updated):
        self.in_loop -= m.matches(original, STEP_LOOP)
        return updated

    def leave_SimpleStatementLine(self, original, updated):
        if m.matches(updated, STEP) and getattr(self, "in_loop", 0):
            return cst.FlattenSentinel([updated, *statements(COLLECT).nodes])
        if m.matches(updated, INITIALIZED):
            return cst.FlattenSentinel([updated, *statements(SHARE).nodes])
        if m.matches(updated, RESET):
            return cst.FlattenSentinel([updated, *statements(START).nodes])
        if m.matches(updated, ASKED):
            return statements(FINISH, leading_lines=updated.leading_lines)
        if m.matches(updated, TAKEN):
            return cst.RemoveFromParent()
        return updated

    def leave_ClassDef(self, original, updated):
        if not m.matches(updated, GENERATOR):
            return updated
        # The helper goes right above the generator, which keeps its two blank lines.
        first = self.helper[0].with_changes(leading_lines=updated.leading_lines)
        return cst.FlattenSentinel(
            [first, *self.helper[1:], updated.with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()])]
        )


PATCH = Patch(
    id="SP029",
    name="collect-captures-per-step",
    version=1,
    title="Generator: copy each step's captures out of shared host memory while the GPU runs the next",
    file="speculators/data_generation/vllm_hidden_states_generator.py",
    codemod=CollectCapturesPerStep,
    order=175,
    portable=True,
    risk="hidden states come back as pickled CUDA tensors through the RPC: about 4x slower extraction on a GPU",
    requires=("SP012", "SP028"),  # rewrites SP012's collection; SP028's worker RPCs
    depends_on="at run time: MultiprocExecutor.collective_rpc (vllm/v1/executor/multiproc_executor.py) "
    "and torch.from_file on the worker's memfd (/proc/<pid>/fd)",
)
