"""The capture transfer of SP028/SP029 on CPU tensors, without vLLM: run by test_capture_transfer.py
under the engine environment's interpreter (torch), with the patched worker and generator files.

    python transfer_worker.py PATCHED_WORKER PATCHED_GENERATOR CASE

The worker extension is the patched class itself; the model runner, the executor (an in-process
``collective_rpc``) and the layer outputs are stand-ins. Each step's tokens are laid out in a
batch order that is not submission order, and prompts are split across steps, as vLLM does.
Prints one JSON line: what the generator side returned, or the error it raised.
"""

from __future__ import annotations

import ast
import json
import sys
import types

import torch

HIDDEN, LAYERS, ROWS = 8, [1, 3], 16


def load_worker(path: str):
    sys.modules["vllm"] = types.ModuleType("vllm")
    distributed = sys.modules["vllm.distributed"] = types.ModuleType("vllm.distributed")
    distributed.get_tp_group = lambda: types.SimpleNamespace(rank_in_group=0)
    namespace: dict = {"__name__": "patched_worker"}
    exec(compile(open(path).read(), path, "exec"), namespace)
    return namespace["HiddenStatesWorkerExtension"]


def load_host_captures(path: str):
    source = open(path).read()
    node = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "_HostCaptures")
    log = types.SimpleNamespace(info=lambda m: None, warning=lambda m: print("WARNING " + m, file=sys.stderr))
    namespace: dict = {"torch": torch, "log": log}
    exec(compile(ast.get_source_segment(source, node), path, "exec"), namespace)
    return namespace["_HostCaptures"]


def rows_of(req: str, start: int, n: int, layer: int) -> torch.Tensor:
    """The rows a layer 'computes' for a request's tokens start..start+n: distinct per position."""
    base = int(req.split("_")[1]) * 1000 + layer * 100000
    return (
        torch.arange(start, start + n, dtype=torch.float32)[:, None]
        + base
        + torch.arange(HIDDEN, dtype=torch.float32)[None, :] / 10
    ).to(torch.bfloat16)


class Runner:
    """A V1-like runner: ``input_batch.req_id_to_index`` orders each step's tokens; its
    ``execute_model`` runs the capture hooks with each layer's output for the step."""

    def __init__(self, extension):
        self.extension, self.done = extension, {}
        self.input_batch = types.SimpleNamespace(req_id_to_index={})

    def execute_model(self, scheduler_output):
        order = scheduler_output.order
        self.input_batch.req_id_to_index = {r: i for i, r in enumerate(order)}
        for layer in LAYERS:
            parts = []
            for req in order:
                n = scheduler_output.num_scheduled_tokens[req]
                parts.append(rows_of(req, self.done.get(req, 0), n, layer))
            out = torch.cat(parts)
            self.extension._capture_layer_output(layer, (out, torch.zeros_like(out)))  # hidden + residual
        for req in order:
            self.done[req] = self.done.get(req, 0) + scheduler_output.num_scheduled_tokens[req]
        return None


def main() -> None:
    worker_path, generator_path, case = sys.argv[1:4]
    Extension, HostCaptures = load_worker(worker_path), load_host_captures(generator_path)
    ext = Extension()
    ext.vllm_config = types.SimpleNamespace(
        scheduler_config=types.SimpleNamespace(max_num_batched_tokens=ROWS),
        model_config=types.SimpleNamespace(dtype=torch.bfloat16, get_hidden_size=lambda: HIDDEN),
    )
    ext.device = torch.device("cpu")
    ext.model_runner = Runner(ext)
    ext._layer_ids, ext._captured_states, ext._batch_layouts = frozenset(LAYERS), None, []
    ext._track_batch_layout()
    executor = types.SimpleNamespace(
        collective_rpc=lambda method, args=(), kwargs=None: [getattr(ext, method)(*args, **(kwargs or {}))]
    )
    if case == "no-shared-memory":
        ext._share_captures = lambda: (_ for _ in ()).throw(OSError("no memfd here"))
    host = HostCaptures(executor)
    prompts = {"req_0": 10, "req_1": 5, "req_2": 20, "req_3": 3}
    # Steps of at most ROWS tokens, batch order != submission order, req_2 split over three steps.
    steps = [
        ({"req_1": 5, "req_0": 10}, ["req_1", "req_0"]),
        ({"req_2": 12, "req_3": 3}, ["req_3", "req_2"]),
        ({"req_2": 5}, ["req_2"]),
        ({"req_2": 3}, ["req_2"]),
    ]
    if case == "missing-layer":
        LAYERS.pop()  # the model stops returning a captured layer: the ring expects two
    ext._reset_capture()
    host.start(prompts)
    try:
        for i, (scheduled, order) in enumerate(steps):
            output = types.SimpleNamespace(num_scheduled_tokens=scheduled, order=order)
            ext.model_runner.execute_model(output)
            if case == "overrun" and i < len(steps) - 1:
                continue  # a generator that never collects: the ring must refuse to overwrite
            host.collect()
        states = host.finish()
    except RuntimeError as e:
        print(json.dumps({"error": str(e)}))
        return
    want_layers = [1, 3]  # the captured layers, in order
    result = {
        req: {
            "shapes": [list(t.shape) for t in states[req]],
            "dtype": str(states[req][0].dtype),
            "own_storage": all(t.untyped_storage().nbytes() == t.numel() * t.element_size() for t in states[req]),
            "exact": all(
                torch.equal(t, rows_of(req, 0, n, layer)) for t, layer in zip(states[req], want_layers, strict=False)
            ),
        }
        for req, n in prompts.items()
    }
    print(json.dumps({"result": result, "ring": host.ring is not None}))


if __name__ == "__main__":
    main()
