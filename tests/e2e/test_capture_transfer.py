"""SP028/SP029's capture transfer on CPU tensors, without vLLM (the real engine runs it in every
other test of this tier): steps in vLLM's batch order, prompts split across steps, the ring's
three slots, a generator that does not collect, a missing layer, and no shared memory at all.

The emitted code comes from the real speculators 0.3.0 wheel patched by the codemods; it runs
under the engine environment's interpreter (torch), in ``transfer_worker.py``."""

from __future__ import annotations

import json
import subprocess
import zipfile
from pathlib import Path

import pytest
from sandbox import wheel
from targets import engine_python, ensure_engine_env

from patcher.engine import run_codemod
from patcher.fixes.registry import loaded

pytestmark = [pytest.mark.engine, pytest.mark.timeout(600)]

FILES = ("speculators/data_generation/custom_worker.py", "speculators/data_generation/vllm_hidden_states_generator.py")


@pytest.fixture(scope="module")
def patched(tmp_path_factory) -> list[Path]:
    """The worker and the generator with every patch written for 0.3.0 that vLLM 0.16 needs, in order."""
    ensure_engine_env()
    out = tmp_path_factory.mktemp("transfer")
    with zipfile.ZipFile(wheel("speculators", "0.3.0")) as z:
        sources = {f: z.read(f) for f in FILES}
    for patch in sorted(loaded().patches, key=lambda p: p.order):
        if (
            patch.file in sources
            and patch.speculators == "==0.3.0"
            and patch.id not in ("SP023", "SP024", "SP026", "SP027")
        ):
            verdict, new, detail = run_codemod(patch, sources[patch.file])
            assert verdict in ("changed", "satisfied"), (patch.id, detail)
            sources[patch.file] = new
    paths = []
    for f in FILES:
        (out / Path(f).name).write_bytes(sources[f])
        paths.append(out / Path(f).name)
    return paths


def run(patched: list[Path], case: str) -> dict:
    proc = subprocess.run(
        [str(engine_python()), str(Path(__file__).with_name("transfer_worker.py")), *map(str, patched), case],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "stderr": proc.stderr}


def test_each_request_gets_its_rows_in_tensors_of_its_own(patched):
    report = run(patched, "normal")
    assert report["ring"] is True
    for req, n in {"req_0": 10, "req_1": 5, "req_2": 20, "req_3": 3}.items():
        got = report["result"][req]
        assert got == {"shapes": [[n, 8], [n, 8]], "dtype": "torch.bfloat16", "own_storage": True, "exact": True}, req


def test_without_shared_memory_the_rpc_answers(patched):
    report = run(patched, "no-shared-memory")
    assert (
        report["ring"] is False
        and "hidden states go through the RPC, not shared memory (OSError: no memfd here)" in report["stderr"]
    )
    assert all(r["exact"] and r["own_storage"] for r in report["result"].values())


def test_a_step_never_overwrites_captures_not_collected(patched):
    assert run(patched, "overrun")["error"] == (
        "speculators-patch: step 3 would overwrite the captures of step 0, which the generator has not collected"
    )


def test_a_missing_layer_is_an_error_not_a_short_result(patched):
    assert run(patched, "missing-layer")["error"] == "Captured 0 forward passes of layer 3 in step 0"
