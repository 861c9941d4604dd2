"""vLLM serving a verifier, with or without an EAGLE-3 draft: acceptance and decode speed.

Runs under the target's interpreter. One engine per process: ``serve`` is called in a child
(``python serve.py`` reads a request as JSON on stdin and prints its result after ``MARKER``),
and ``serve_all`` starts those children, all at once on a GPU (each with its own fixed KV cache,
so no engine's memory profiling sees another's) or one after another on the CPU. Standard
library and vLLM only, no relative imports: the file runs as a script from selftest's
temporary package and from a checkout (the benchmarks load it by path).

The draft is served in the form the README gives:
``LLM(model=VERIFIER, speculative_config={"method": "eagle3", "model": DRAFT,
"num_speculative_tokens": K})``. Figures come from vLLM's own spec-decode counters
(``LLM.get_metrics()``; vllm/v1/spec_decode/metrics.py: ``vllm:spec_decode_num_drafts``,
``…num_draft_tokens``, ``…num_accepted_tokens``, ``…num_accepted_tokens_per_pos``), read
before and after each run: acceptance length = 1 + accepted / drafts (tokens the verifier
emits per draft step), per position = accepted at that position / drafts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

MARKER = "@@speculators-patch-spec-decode@@"
COUNTERS = {
    "drafts": "vllm:spec_decode_num_drafts",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens",
    "accepted": "vllm:spec_decode_num_accepted_tokens",
    "per_position": "vllm:spec_decode_num_accepted_tokens_per_pos",
}
# Every process this module starts: no NVLink multicast, no progress bars, no tokenizer threads.
ENV = {
    "VLLM_USE_FLASHINFER_SAMPLER": "0",  # its sampler compiles with nvcc at run time
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    "TQDM_DISABLE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
}
KV_CACHE_BYTES = 2 << 30  # GPU: each engine's fixed KV cache (vLLM skips its memory profiling then)
# GPU: with kv_cache_memory_bytes set, gpu_memory_utilization only sets how much of the device
# must be free when an engine starts (vllm/v1/worker/utils.py request_memory): 6.4 GB of 80.
GPU_SHARE = 0.08


def counters(llm) -> dict:
    """vLLM's spec-decode counters now (cumulative since the engine started): drafts,
    draft_tokens, accepted (ints) and per_position (list). All 0 without a draft."""
    found = {key: 0 for key in COUNTERS}
    found["per_position"] = []
    names = {v: k for k, v in COUNTERS.items()}
    for metric in llm.get_metrics():
        key = names.get(metric.name)
        if key is None:
            continue
        value = getattr(metric, "values", None)
        found[key] = list(value) if key == "per_position" and value is not None else getattr(metric, "value", 0)
    return found


def acceptance(before: dict, after: dict) -> dict:
    """The spec-decode figures of one run from the counters before and after it:
    acceptance_length = 1 + accepted / drafts, acceptance_rate = accepted / draft tokens,
    per_position[i] = accepted at position i / drafts. None where no draft step ran."""
    delta = {k: after[k] - before[k] for k in ("drafts", "draft_tokens", "accepted")}
    before_pos = before["per_position"] or [0] * len(after["per_position"])
    per_pos = [a - b for a, b in zip(after["per_position"], before_pos)]
    drafts = delta["drafts"]
    return {
        **delta,
        "accepted_per_position": per_pos,
        "acceptance_length": 1 + delta["accepted"] / drafts if drafts else None,
        "acceptance_rate": delta["accepted"] / delta["draft_tokens"] if delta["draft_tokens"] else None,
        "per_position": [round(x / drafts, 4) for x in per_pos] if drafts else None,
    }


def engine(request: dict):
    """``vllm.LLM`` for ``request``: ``verifier`` (path), ``draft`` (path or None), ``k``
    (speculative tokens), ``device``, ``max_model_len``, ``eager`` (default True)."""
    from vllm import LLM

    kwargs: dict = {
        "model": request["verifier"],
        "max_model_len": request.get("max_model_len", 512),
        "enforce_eager": request.get("eager", True),
        "disable_log_stats": False,  # the spec-decode counters
        "seed": 0,
    }
    if request.get("draft"):
        kwargs["speculative_config"] = {
            "method": "eagle3",
            "model": request["draft"],
            "num_speculative_tokens": request["k"],
        }
    if request.get("device", "cuda") == "cuda":  # no CUDA context here: vLLM's processes make their own
        kwargs["kv_cache_memory_bytes"] = request.get("kv_cache_bytes", KV_CACHE_BYTES)
        kwargs["gpu_memory_utilization"] = GPU_SHARE
    return LLM(**kwargs)


def generate(llm, prompts: list[list[int]], max_tokens: int) -> tuple[list[list[int]], float]:
    """Greedy continuations of token-id ``prompts`` (``max_tokens`` each, end-of-sequence
    ignored) and the seconds ``generate`` took."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    t = time.perf_counter()
    # use_tqdm=False: vLLM 0.34 divides by the progress bar's elapsed time, 0 under TQDM_DISABLE.
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    seconds = time.perf_counter() - t
    return [list(o.outputs[0].token_ids) for o in outs], seconds


def run(llm, spec: dict) -> dict:
    """One run of ``spec`` ({"name", "prompts", "max_tokens", "single_stream": n}): all prompts
    in one batch (their greedy outputs, output tokens per second, the spec-decode figures),
    then the first ``n`` prompts one at a time (tokens per second of a single stream)."""
    before = counters(llm)
    outputs, seconds = generate(llm, spec["prompts"], spec["max_tokens"])
    result = {
        "name": spec["name"],
        "prompts": len(outputs),
        "output_tokens": sum(map(len, outputs)),
        "seconds": round(seconds, 3),
        "tokens_per_s": round(sum(map(len, outputs)) / seconds, 1),
        "spec_decode": acceptance(before, counters(llm)),
        "outputs": outputs,
    }
    single = spec["prompts"][: spec.get("single_stream", 0)]
    if single:
        tokens = elapsed = 0.0
        for prompt in single:
            out, s = generate(llm, [prompt], spec["max_tokens"])
            tokens, elapsed = tokens + len(out[0]), elapsed + s
        result["single_stream"] = {"prompts": len(single), "tokens_per_s": round(tokens / elapsed, 1)}
    return result


class _Turn:
    """Timed runs one engine at a time: every engine of the group waits until all have
    started (a file per engine under ``folder``), then takes an exclusive lock for its timed
    runs, so that no other engine's start or runs share the GPU meanwhile. A no-op without
    ``folder``."""

    def __init__(self, folder: str | None, name: str, group: int, timeout: float = 600) -> None:
        self.folder, self.name, self.group, self.timeout = folder, name, group, timeout

    def mark(self, state: str) -> None:
        if self.folder:
            Path(self.folder, f"{self.name}.{state}").write_text(str(os.getpid()))

    def __enter__(self) -> _Turn:
        if not self.folder:
            return self
        import fcntl

        self.mark("ready")
        deadline = time.time() + self.timeout
        while len(list(Path(self.folder).glob("*.ready")) + list(Path(self.folder).glob("*.failed"))) < self.group:
            if time.time() > deadline:
                break  # an engine that never reported: time the runs anyway
            time.sleep(0.5)
        self.lock = open(Path(self.folder, "timing.lock"), "w")  # noqa: SIM115 (held until __exit__)
        fcntl.flock(self.lock, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc) -> None:
        if self.folder:
            self.lock.close()  # releases the lock


def serve(request: dict) -> dict:
    """Start one engine for ``request`` (``engine``), warm it up, and do its ``runs`` (a list
    of ``run`` specs), timed in turn with the rest of its group when ``request["turns"]``
    names a folder (``_Turn``; ``group``: how many engines). Returns the engine's start
    seconds and each run's result; raises whatever vLLM raises."""
    t = time.time()
    turn = _Turn(request.get("turns"), request["name"], request.get("group", 1))
    try:
        llm = engine(request)
        started = round(time.time() - t, 1)
        generate(llm, request["runs"][0]["prompts"][:4], 8)  # warm-up: first-call costs out of the timings
    except BaseException:
        turn.mark("failed")  # the others stop waiting for this one
        raise
    with turn:
        results = [run(llm, spec) for spec in request["runs"]]
    return {"name": request["name"], "engine_start_s": started, "runs": results}


def serve_all(requests: list[dict], parallel: bool, log: Path, timeout: float = 900) -> list[dict]:
    """Each request served by its own child process (``launch``); all at once when
    ``parallel`` (each GPU engine with a fixed KV cache), else one after the other. Returns,
    per request in order, its result or {"name", "error", "tail": the child's last output
    lines, "log": its output's file}. ``log``: the folder for each child's output (``<name>.log``); ``timeout``: seconds
    for them all, after which the children left are killed."""
    deadline = time.time() + timeout
    pending: list = []
    results: list[dict] = []
    try:
        for request in requests:
            pending.append(launch(request, log))
            if not parallel:
                results.append(collect(pending.pop(0), deadline))
        while pending:
            results.append(collect(pending.pop(0), deadline))
    finally:
        for child in pending:  # left by an exception (SIGTERM, SIGINT): no engine outlives us
            kill(child[1])
    return results


def launch(request: dict, log: Path) -> tuple[str, subprocess.Popen, Path]:
    """Start serving ``request`` in a child process (this file as a script, in a session of its
    own so that ``collect`` or ``kill`` ends its engine's processes too), its output in
    ``log/<name>.log``; returns (name, process, log file) for ``collect``."""
    folder = Path(log)
    folder.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **{k: v for k, v in ENV.items() if k not in os.environ}}
    path = folder / f"{request['name']}.log"
    with open(path, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, __file__],
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            start_new_session=True,
        )
    proc.stdin.write(json.dumps(request))
    proc.stdin.close()
    return request["name"], proc, path


def kill(proc: subprocess.Popen) -> None:
    """The child and every process of its session (vLLM's engine core, its workers)."""
    import signal

    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def collect(child: tuple[str, subprocess.Popen, Path], deadline: float) -> dict:
    """The result a ``launch``ed child printed after ``MARKER``, once it ended (killed at
    ``deadline``, seconds since the epoch), or {"name", "error", "tail", "log"}."""
    name, proc, path = child
    try:
        proc.wait(timeout=max(1.0, deadline - time.time()))
    except subprocess.TimeoutExpired:
        pass
    kill(proc)  # a child past the deadline, or what a finished one left behind
    text = path.read_text(errors="replace")
    for line in reversed(text.splitlines()):
        if line.startswith(MARKER):
            return json.loads(line[len(MARKER) :])
    tail = [line for line in text.splitlines() if line.strip()][-25:]
    return {"name": name, "error": f"exit {proc.returncode}", "tail": tail, "log": str(path)}


def _main() -> int:
    request = json.loads(sys.stdin.read())
    if request.get("turns"):
        Path(request["turns"]).mkdir(parents=True, exist_ok=True)
    result = serve(request)
    print("\n" + MARKER + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_main())
