"""What vLLM actually built in each worker: the model runner class and the attention backends.

``collect(executor)`` asks every worker through ``executor.collective_rpc`` with a function
(vLLM's executors accept a callable and call it with the worker:
vllm/v1/executor/multiproc_executor.py, ``collective_rpc``; it travels by cloudpickle). The
runner is V2 when its class lives in ``vllm.v1.worker.gpu`` (vllm/v1/worker/gpu/model_runner.py)
and V1 otherwise (vllm/v1/worker/gpu_model_runner.py, or the CPU worker's subclass of it);
the attention backends are the ``attn_backend.get_name()`` of every attention layer of the
model (``Attention`` and ``MLAAttention`` in vllm/model_executor/layers/attention/).
"""

from __future__ import annotations

import sys


def _keeps_batch_state(runner) -> bool:
    """``execute_model_state`` set in ``__init__`` (V2 from 0.17) or stored by ``execute_model``."""
    import inspect

    if hasattr(runner, "execute_model_state"):
        return True
    code = getattr(inspect.unwrap(getattr(type(runner), "execute_model", None)), "__code__", None)
    return code is not None and "execute_model_state" in code.co_names


def facts(worker) -> dict:
    """Runs in a vLLM worker: ``{"runner": "module.Class", "runner_kind": "v1" | "v2" | "unknown",
    "attention": [backend names], "rank": int | None}``."""
    runner = worker.model_runner
    cls = type(runner)
    model = getattr(runner, "model", None)
    if model is None and hasattr(runner, "get_model"):
        model = runner.get_model()
    names = set()
    for module in model.modules() if model is not None else ():
        backend = getattr(module, "attn_backend", None)
        if backend is not None and hasattr(backend, "get_name"):  # the mm encoder's is an enum
            names.add(backend.get_name())
    # the patched extension's (patches/sp009_layer_hook_capture.py), on this rank
    hooks = getattr(worker, "_capture_hooks", None)
    return {
        "runner": f"{cls.__module__}.{cls.__qualname__}",
        "runner_kind": "v1" if hasattr(runner, "input_batch") else "v2" if _keeps_batch_state(runner) else "unknown",
        "attention": sorted(names),
        "rank": getattr(worker, "rank", None),
        "capture_hooks": None if hooks is None else len(hooks),
    }


def collect(executor) -> dict:
    """Rank 0's ``facts``, with ``ranks`` (how many answered), ``agree`` (every rank built
    the same runner and backends) and ``capturing_ranks`` (the ranks holding capture hooks:
    the generator reads rank 0's captures, and only rank 0 should capture); ``{"error": ...}``
    when the workers could not be asked."""
    try:
        import cloudpickle

        cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers need not import this module
    except Exception:  # older cloudpickle: by reference (the workers share our sys.path)
        pass
    try:
        answers = executor.collective_rpc(facts)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    answers = list(answers) if isinstance(answers, (list, tuple)) else [answers]
    first = dict(answers[0])
    first["ranks"] = len(answers)
    first["agree"] = all((a["runner"], a["attention"]) == (first["runner"], first["attention"]) for a in answers)
    first["capturing_ranks"] = [
        a["rank"] if a["rank"] is not None else i for i, a in enumerate(answers) if a.get("capture_hooks")
    ]
    return first
