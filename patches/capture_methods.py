"""The worker methods that two capture patches share, each written out once.

SP010 writes ``PER_REQUEST`` into ``HiddenStatesWorkerExtension``; SP022 accepts the worker
only with SP010's ``_track_batch_layout`` as written there (a hand-edited copy is refused) and
writes ``EITHER_RUNNER`` in its place; SP027 accepts only SP022's two methods as written there.
Each text is the class as it appears in the file (parsed inside it, so docstrings keep their
indent); the emitted bytes are pinned by tests/patches/test_codemod_audit.py. Not a patch: it
defines no ``PATCH``.
"""

import libcst as cst

# SP010: each step's requests and token counts in vLLM's batch order, and the per-request split.
PER_REQUEST = '''\
class HiddenStatesWorkerExtension:

    def _track_batch_layout(self):
        """Record each executed step's requests and token counts in vLLM's batch order.

        A step's tokens are laid out in the model runner's batch order
        (input_batch.req_id_to_index), not in submission order, and a prompt may be split
        across steps (chunked prefill).
        """
        runner = self.model_runner  # type: ignore[attr-defined]
        if not hasattr(runner, "input_batch"):
            raise RuntimeError(
                "speculators-patch: hidden-state capture needs vLLM's V1 GPU model runner "
                f"(input_batch); {type(runner).__name__} has none: set "
                "VLLM_USE_V2_MODEL_RUNNER=0 (Model Runner V2 is built when it is 1, and "
                "by default for some models from vLLM 0.22)"
            )
        execute_model = runner.execute_model
        if getattr(execute_model, "_records_batch_layout", False):
            return

        def execute_model_recording_layout(scheduler_output, *args, **kwargs):
            output = execute_model(scheduler_output, *args, **kwargs)
            scheduled = scheduler_output.num_scheduled_tokens
            if scheduled:
                index = runner.input_batch.req_id_to_index
                missing = [req_id for req_id in scheduled if req_id not in index]
                if missing:
                    raise RuntimeError(f"Scheduled requests not in the batch: {missing}")
                layout = sorted(scheduled.items(), key=lambda item: index[item[0]])
                self._batch_layouts.append(layout)
            return output

        execute_model_recording_layout._records_batch_layout = True
        runner.execute_model = execute_model_recording_layout

    def _get_captured_states_per_request(self):
        """Get the captured hidden states per request, assembled across steps.

        Returns:
            Dict mapping request id to a list of tensors, one per target layer, or None
            if no states captured. Raises when captures and executed steps disagree.
        """
        captured, self._captured_states = self._captured_states, None
        layouts, self._batch_layouts = self._batch_layouts, []
        if captured is None:
            return None
        per_request = {}
        for layer_index, passes in enumerate(captured):
            if len(passes) != len(layouts):
                raise RuntimeError(
                    f"Captured {len(passes)} forward passes for {len(layouts)} steps"
                )
            for rows, layout in zip(passes, layouts):
                total = sum(num_tokens for _, num_tokens in layout)
                # vLLM may pad a step's tail (e.g. for CUDA graphs), never its head.
                if rows.shape[0] < total:
                    raise RuntimeError(
                        f"Captured {rows.shape[0]} rows for a step of {total} tokens"
                    )
                offset = 0
                for req_id, num_tokens in layout:
                    chunks = per_request.setdefault(req_id, [[] for _ in captured])
                    chunks[layer_index].append(rows[offset : offset + num_tokens])
                    offset += num_tokens
        return {
            req_id: [torch.cat(chunks, dim=0) for chunks in layers]
            for req_id, layers in per_request.items()
        }
'''

# SP022: the batch layout read from either of vLLM's GPU model runners.
EITHER_RUNNER = '''\
class HiddenStatesWorkerExtension:

    def _track_batch_layout(self):
        """Record each executed step's requests and token counts in the order of its tokens.

        A step's tokens are laid out in the model runner's batch order, not in submission
        order, and a prompt may be split across steps (chunked prefill). Both of vLLM's GPU
        model runners are read (``_step_layout``).
        """
        runner = self.model_runner  # type: ignore[attr-defined]
        v2 = type(runner).__module__.startswith("vllm.v1.worker.gpu.")
        if not hasattr(runner, "input_batch") and not v2:
            raise RuntimeError(
                "speculators-patch: hidden-state capture cannot read the batch layout of "
                f"{type(runner).__module__}.{type(runner).__name__} (neither V1's input_batch "
                "nor Model Runner V2's execute_model_state): set VLLM_USE_V2_MODEL_RUNNER=0"
            )
        execute_model = runner.execute_model
        if getattr(execute_model, "_records_batch_layout", False):
            return

        def execute_model_recording_layout(scheduler_output, *args, **kwargs):
            output = execute_model(scheduler_output, *args, **kwargs)
            # V2's _dummy_run (memory profiling, warm-up) calls it with made-up requests.
            if scheduler_output.num_scheduled_tokens and not kwargs.get("dummy_run"):
                self._batch_layouts.append(self._step_layout(scheduler_output))
            return output

        execute_model_recording_layout._records_batch_layout = True
        runner.execute_model = execute_model_recording_layout

    def _step_layout(self, scheduler_output):
        """[(request id, scheduled tokens)] of the step just executed, in token order.

        V1 (vllm/v1/worker/gpu_model_runner.py) keeps one persistent batch: tokens follow
        input_batch.req_id_to_index. Model Runner V2 (vllm/v1/worker/gpu/model_runner.py)
        builds an InputBatch per step (req_ids, num_scheduled_tokens) and keeps it in
        execute_model_state until sample_tokens: a tuple holding it before vLLM 0.18.
        """
        runner = self.model_runner  # type: ignore[attr-defined]
        scheduled = scheduler_output.num_scheduled_tokens
        if hasattr(runner, "input_batch"):
            index = runner.input_batch.req_id_to_index
            missing = [req_id for req_id in scheduled if req_id not in index]
            if missing:
                raise RuntimeError(f"Scheduled requests not in the batch: {missing}")
            return sorted(scheduled.items(), key=lambda item: index[item[0]])
        state = getattr(runner, "execute_model_state", None)
        batch = getattr(state, "input_batch", None)
        if batch is None and isinstance(state, tuple):
            batch = next((item for item in state if hasattr(item, "req_ids")
                          and hasattr(item, "num_scheduled_tokens")), None)
        if batch is None:
            raise RuntimeError(
                f"speculators-patch: {type(runner).__name__} kept no input batch for this step "
                "(execute_model_state): set VLLM_USE_V2_MODEL_RUNNER=0"
            )
        layout = [(req_id, int(n)) for req_id, n in zip(batch.req_ids, batch.num_scheduled_tokens)]
        if dict(layout) != dict(scheduled):
            raise RuntimeError(
                f"Model Runner V2's batch {dict(layout)} differs from the scheduled tokens {dict(scheduled)}"
            )
        return layout
'''


def class_body(code: str, newline: str) -> list[cst.BaseStatement]:
    """The statements of the one class ``code`` defines, with ``newline`` line endings."""
    cls = cst.ensure_type(cst.parse_module(code.replace("\n", newline)).body[0], cst.ClassDef)
    return list(cls.body.body)
