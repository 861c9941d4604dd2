"""SP028: stage each step's captures in shared host memory, one copy per layer and step (worker).

speculators 0.3.0 keeps every captured layer output on the GPU until ``generate()`` ends, then
returns them through ``collective_rpc``. vLLM's ``MultiprocExecutor`` sends a worker's reply
through its message queue (vllm/distributed/device_communicators/shm_broadcast.py,
``MessageQueue.enqueue``: pickle, large buffers over a zmq socket); a CUDA tensor is pickled
through a host copy, unpickled back onto the generator's GPU, and the generator then copies it
to the host again. On an H200 (vLLM 0.24.0, Llama-3.1-8B shapes, three layers) that transfer
took 72 % of the generator's time: 0.24x vLLM's own prefill (docs/speed.md).

The emitted methods give the generator (SP029) a ring of host memory both processes map: a
``memfd`` of ``slots`` (3) x layers x ``max_num_batched_tokens`` rows x hidden size in the model's
dtype, created by rank 0's worker and opened by the generator through
``/proc/<worker pid>/fd/<fd>`` (no /dev/shm size limit, nothing left behind when both exit).
On a GPU it is registered as pinned memory (``cudaHostRegister``). After each step a wrapper
around the runner's ``execute_model`` (outside SP010's layout recorder) issues one
non-blocking device-to-host copy per captured layer into the step's slot, on a copy stream of
its own that waits for the step's forward, and records an event; the GPU tensors are then
dropped. ``_staged_captures`` hands the generator the steps whose copies are done -- every
step but the newest, or all of them at the end -- with their batch layout (SP010/SP022), so
the generator copies step k-1 out while the GPU computes step k. A slot is written again
three steps later; the generator's copies of it are done by then (SP029), and a step that
would overwrite captures not yet handed out raises instead. On the CPU engine the copy is a
plain one. Nothing is pickled but the layouts.

Requires SP010 (the per-step layouts it records, ``_captured_states``' per-layer lists) and
works with SP009's hooks and 0.3.0's own replacement forward alike.
"""

import libcst as cst
import libcst.matchers as m

from patcher.fixes.patch import Patch, PatchCodemod

CLASS = m.ClassDef(name=m.Name("HiddenStatesWorkerExtension"))
ADDED = m.FunctionDef(name=m.Name("_share_captures"))
SP010_METHOD = m.FunctionDef(name=m.Name("_get_captured_states_per_request"))
ADDED_NAMES = frozenset({"_stage_step", "_new_batch_check", "_staged_captures"})  # beside _share_captures

METHODS = '''\
class HiddenStatesWorkerExtension:

    def _share_captures(self, slots=3):
        """Create the shared host memory the generator collects captures from, and stage each
        step's captures there (speculators-patch SP028). Rank 0 only (it alone captures):
        other ranks return None. Returns {"path", "shape": [slots, layers, rows, hidden],
        "dtype", "bytes", "pinned"}; raises OSError where memfd or /proc is missing.
        """
        import os

        if get_tp_group().rank_in_group != 0:
            return None
        config = self.vllm_config  # type: ignore[attr-defined]
        rows = config.scheduler_config.max_num_batched_tokens
        dtype = config.model_config.dtype
        shape = [slots, len(self._layer_ids), rows, config.model_config.get_hidden_size()]
        size = torch.empty((), dtype=dtype).element_size()
        for n in shape:
            size *= n
        fd = os.memfd_create("speculators-hidden-states")
        os.ftruncate(fd, size)
        ring = torch.from_file(f"/proc/self/fd/{fd}", shared=True, size=size, dtype=torch.uint8)
        pinned = False
        device = getattr(self, "device", None)
        if getattr(device, "type", None) == "cuda":
            self._copy_stream = torch.cuda.Stream(device)
            try:  # pinned: the copies run on the copy engine, not through a staging buffer
                torch.cuda.cudart().cudaHostRegister(ring.data_ptr(), size, 0)
                pinned = ring.is_pinned()
            except Exception:
                pinned = False
        self._capture_ring = ring.view(dtype).view(*shape)
        self._capture_ring_fd = fd
        self._new_batch_check(None)
        execute_model = self.model_runner.execute_model  # type: ignore[attr-defined]

        def execute_model_staging_captures(scheduler_output, *args, **kwargs):
            output = execute_model(scheduler_output, *args, **kwargs)
            self._stage_step()
            return output

        self.model_runner.execute_model = execute_model_staging_captures  # type: ignore[attr-defined]
        return {"path": f"/proc/{os.getpid()}/fd/{fd}", "shape": shape, "dtype": str(dtype).split(".")[-1],
                "bytes": size, "pinned": pinned}

    def _stage_step(self):
        """Copy the step just executed out of the GPU into its slot of the ring (one copy per
        layer, non-blocking on the copy stream), then drop the GPU tensors. Forwards without
        a recorded step (vLLM's warm-up, profiling) are dropped."""
        captured, self._captured_states = self._captured_states, None
        self._new_batch_check()
        step = len(self._batch_layouts) - 1
        if captured is None or step < self._next_step:  # no step recorded by this call
            return
        self._next_step = step + 1
        ring = self._capture_ring
        if step - ring.shape[0] >= self._handed:
            raise RuntimeError(
                f"speculators-patch: step {step} would overwrite the captures of step "
                f"{step - ring.shape[0]}, which the generator has not collected"
            )
        copies = []
        for layer, passes in enumerate(captured):
            if len(passes) != 1:
                raise RuntimeError(
                    f"Captured {len(passes)} forward passes of layer {sorted(self._layer_ids)[layer]} in step {step}"
                )
            rows = passes[0][: ring.shape[2]]
            target = ring[step % ring.shape[0], layer, : rows.shape[0]]
            if rows.is_cuda:
                stream = self._copy_stream
                stream.wait_stream(torch.cuda.current_stream(rows.device))
                with torch.cuda.stream(stream):
                    target.copy_(rows, non_blocking=True)
                    done = torch.cuda.Event()
                    done.record(stream)
                rows.record_stream(stream)
            else:
                target.copy_(rows)
                done = None
            copies.append((passes[0].shape[0], done))
        self._staged[step] = copies

    def _new_batch_check(self, layouts=()):
        """_reset_capture (SP010) starts each batch with a new list of layouts: start staging afresh."""
        layouts = self._batch_layouts if layouts == () else layouts
        if getattr(self, "_staged_for", ()) is not layouts:
            self._staged_for = layouts
            self._staged = {}  # step -> [(rows, copy-done event)] per layer
            self._handed = 0  # steps handed to the generator
            self._next_step = 0  # the first step not staged yet

    def _staged_captures(self, final=False):
        """[(step, slot, layout)] of the steps whose captures are in the ring and not yet
        handed out: all but the newest (its copies may still run), or all when ``final``.
        None on ranks that do not capture. Raises when a step's rows or layers are missing."""
        if getattr(self, "_capture_ring", None) is None:
            return None
        self._new_batch_check()
        layouts, ring = self._batch_layouts, self._capture_ring
        ready = []
        for step in range(self._handed, len(layouts) if final else len(layouts) - 1):
            copies = self._staged.pop(step, [])
            total = sum(n for _, n in layouts[step])
            if len(copies) != ring.shape[1] or any(rows < total for rows, _ in copies) or total > ring.shape[2]:
                raise RuntimeError(
                    f"Captured {[rows for rows, _ in copies]} rows for {ring.shape[1]} layers in a "
                    f"step of {total} tokens"
                )
            for _, done in copies:
                if done is not None:
                    done.synchronize()
            ready.append((step, step % ring.shape[0], layouts[step]))
        self._handed += len(ready)
        return ready
'''


class StageCapturesInSharedMemory(PatchCodemod):
    DESCRIPTION = "worker: _share_captures / _stage_step / _staged_captures (host ring, one copy per layer and step)"

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        if m.findall(tree, ADDED):
            self.already_satisfied("captures are staged in shared host memory")
        if len(m.findall(tree, CLASS)) != 1 or len(m.findall(tree, SP010_METHOD)) != 1:
            self.refuse(
                None,
                "class HiddenStatesWorkerExtension with SP010's _get_captured_states_per_request "
                "(SP028 applies after SP010)",
            )
        own = [
            f for f in m.findall(tree, m.FunctionDef(name=m.Name() & m.MatchIfTrue(lambda n: n.value in ADDED_NAMES)))
        ]
        if own:  # a method of the user's by one of those names would be shadowed
            self.refuse(own[0], f"no methods named {', '.join(sorted(ADDED_NAMES))} of its own")
        code = METHODS.replace("\n", tree.default_newline)
        methods = cst.ensure_type(cst.parse_module(code).body[0], cst.ClassDef).body.body
        return tree.visit(_AddMethods(methods))


class _AddMethods(cst.CSTTransformer):
    def __init__(self, methods) -> None:
        super().__init__()
        self.methods = methods

    def leave_ClassDef(self, original, updated):
        if not m.matches(updated, CLASS):
            return updated
        return updated.with_changes(body=updated.body.with_changes(body=[*updated.body.body, *self.methods]))


PATCH = Patch(
    id="SP028",
    name="stage-captures-in-shared-memory",
    version=1,
    title="Worker: copy each step's captures to shared host memory as it runs (no tensors through the RPC)",
    file="speculators/data_generation/custom_worker.py",
    codemod=StageCapturesInSharedMemory,
    order=130,
    portable=True,
    risk="hidden states come back as pickled CUDA tensors through the RPC: about 4x slower extraction on a GPU",
    requires=("SP010",),  # the per-step layouts and per-layer capture lists SP010 keeps
    depends_on="at run time: MultiprocExecutor.collective_rpc and the runner's execute_model "
    "(vllm/v1/executor/multiproc_executor.py), Linux memfd and /proc, and on GPUs "
    "torch.cuda.cudart().cudaHostRegister",
)
