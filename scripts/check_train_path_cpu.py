"""The GPU training path of benchmarks/real_text_pipeline.py, run on a CPU before device minutes are spent on it.

speculators 0.3.0's ``Trainer`` runs on ``cuda:0`` only (``TrainerConfig.local_rank``, the checkpointer's
``map_location="cuda:0"``) and FlexAttention has no backward on a CPU, so the pipeline's ``--tiny`` CPU run stops at
the forward. This check runs the rest, in this process only: ``cuda`` is mapped to the CPU, FlexAttention is replaced
by the same mask made dense (``create_mask`` of the block mask's ``mask_mod``) through PyTorch's
``scaled_dot_product_attention``, and torch.compile is off. What it exercises: the epochs fitted to a deadline
(``planned_epochs``, ``plan.json``), the Trainer with its validation loader, the step log, a run killed mid-way and
resumed to the planned epoch. Nothing here is a speed figure.

    ENV/bin/python scripts/check_train_path_cpu.py WORKDIR [--seconds 90] [--kill-after 30]

WORKDIR: a ``--tiny`` pipeline work directory whose ``capture`` step is done. Exit 0 when the resumed draft has every
planned epoch, one step log entry per optimizer step, and a validation entry per epoch.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def stand_ins() -> None:
    """Map cuda to the CPU and FlexAttention to a dense equivalent, in this process."""
    import speculators.models.eagle3.attention as attention
    import speculators.train.checkpointer as checkpointer
    import torch
    from torch.nn.attention import flex_attention as fa

    torch.compiler.set_stance("force_eager")

    def dense(q, k, v, block_mask=None, scale=None, enable_gqa=False, **_):
        mask = fa.create_mask(block_mask.mask_mod, None, None, q.shape[-2], k.shape[-2], device=q.device)
        if enable_gqa and k.shape[1] != q.shape[1]:
            k, v = (x.repeat_interleave(q.shape[1] // k.shape[1], 1) for x in (k, v))
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)

    def cpu(x):
        gpu = (isinstance(x, int) and not isinstance(x, bool)) or (isinstance(x, str) and x.startswith("cuda"))
        return "cpu" if gpu or (isinstance(x, torch.device) and x.type == "cuda") else x

    module_to, tensor_to, load = torch.nn.Module.to, torch.Tensor.to, torch.load
    load_safetensors = checkpointer.load_safetensors_state_dict
    attention.flex_attention = dense
    torch.cuda.synchronize = lambda *a, **k: None
    torch.nn.Module.to = lambda self, *a, **k: module_to(self, *map(cpu, a), **k)
    torch.Tensor.to = lambda self, *a, **k: tensor_to(self, *map(cpu, a), **k)
    torch.load = lambda *a, **k: load(*a, **(k | {"map_location": "cpu"} if "map_location" in k else k))
    checkpointer.load_safetensors_state_dict = lambda path, device: load_safetensors(path, "cpu")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--seconds", type=float, default=90, help="the time budget the epochs are fitted to")
    parser.add_argument("--kill-after", type=float, default=30, help="the first run is killed after this long")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import real_text_pipeline

    if not (args.workdir / "capture.json").is_file():
        print(f"error: {args.workdir} has no capture step done (run the pipeline with --tiny first)", file=sys.stderr)
        return 2
    name = "cpu-train-check"
    draft = args.workdir / "drafts" / name
    settings = dict(real_text_pipeline.SETTINGS["tiny"]) | {"epochs": 20}
    spec = {"workdir": str(args.workdir), "size": "tiny", "device": "cuda", "name": name, "settings": settings}
    shutil.rmtree(draft, ignore_errors=True)
    for attempt, limit in (("first (killed)", args.kill_after), ("resumed", None)):
        spec |= {"deadline": time.time() + args.seconds, "workers": 2}
        try:
            proc = subprocess.run(
                [sys.executable, "-c", _runner(name), json.dumps(spec)], timeout=limit, capture_output=True, text=True
            )
            if proc.returncode:
                print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n")
                print(f"error: the {attempt} run exited {proc.returncode}", file=sys.stderr)
                return 1
        except subprocess.TimeoutExpired:
            pass
        saved = real_text_pipeline.saved_epochs(draft)
        print(f"{attempt}: epochs saved {saved}")
    plan = json.loads((draft / "plan.json").read_text())
    entries = real_text_pipeline.StepLog(draft / "steps.jsonl").entries()
    steps = [e for e in entries if "epoch" in e]
    vals = [e["val"] for e in entries if "val" in e]
    result = json.loads((draft / "result.json").read_text())
    ok = (
        result["epochs_done"] == plan["epochs"]
        and len(steps) == plan["epochs"] * plan["steps_per_epoch"]
        and vals == list(range(plan["epochs"]))
    )
    print(
        f"plan {plan}; {len(steps)} steps logged, validation epochs {vals}; accuracy {result['accuracy']}, "
        f"validation {result['val_accuracy']}: {'ok' if ok else 'WRONG'}"
    )
    return 0 if ok else 1


def _runner(name: str) -> str:
    """The child's code: the stand-ins, then the pipeline's ``train_one`` for draft ``name``."""
    return (
        f"import sys, json; sys.path.insert(0, {str(ROOT / 'scripts')!r}); sys.path.insert(0, {str(ROOT / 'benchmarks')!r}); "
        "import check_train_path_cpu as check; check.stand_ins(); import real_text_pipeline as p; "
        f"p.DRAFTS.setdefault({name!r}, ('vllm', False)); p.train_one(json.loads(sys.argv[1]))"
    )


if __name__ == "__main__":
    sys.exit(main())
