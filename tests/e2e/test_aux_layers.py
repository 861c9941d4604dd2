"""A draft trained on the patched install is served the hidden states it was trained on (SP035),
on speculators 0.3.0's default path and with ``--layer-ids`` picked, on the real vLLM 0.16 CPU engine.

``aux_layers_worker.py`` runs speculators' generator on an 8-layer Llama, saves its data and
``data_config.json`` as speculators' ``scripts/data_generation_offline.py`` does, builds the draft
as ``scripts/train.py`` does and saves it through speculators' ``Trainer`` and checkpointer; then
it compares each hidden state the data holds with transformers' ``hidden_states[k]``, the state
entering layer ``k``, which is what vLLM hands an EAGLE-3 draft as auxiliary layer ``k``. Which
layers vLLM will hand this draft is ``check-draft``'s reading of the engine's own vLLM source.
The claim: those layers are exactly the data's (per-token cosine >= 0.999 to transformers'),
and without SP035 they are one layer off (well below)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from targets import cli, engine_environ, ensure_models, patched_target

pytestmark = [pytest.mark.engine, pytest.mark.timeout(1800)]

WORKER = Path(__file__).with_name("aux_layers_worker.py")
SAME = 0.999  # the same tensor, bf16 on both sides (measured: 0.99994 worst)
OTHER = 0.9  # a neighbouring layer's state (measured: 0.53-0.83 on this verifier)


def run(target: Path, workdir: Path, *layer_ids: int, env: dict | None = None) -> dict:
    out = workdir / "report.json"
    model = ensure_models() / "llama8"
    proc = subprocess.run(
        [str(target / "bin" / "python"), str(WORKER), str(model), str(workdir), str(out), *map(str, layer_ids)],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, **(env or {})},
    )
    assert proc.returncode == 0 and out.is_file(), proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert "error" not in report, report.get("traceback")
    return report


def served(target: Path, report: dict, workdir: Path) -> dict:
    """``check-draft --json`` on the saved draft with its data's config: (exit code, data)."""
    proc = cli(
        "check-draft", report["draft"], "--data-config", str(workdir / "data"), "--target", str(target), "--json"
    )
    assert proc.stdout.strip(), proc.stderr
    return {"exit_code": proc.returncode, **json.loads(proc.stdout)}


def assert_data_is(report: dict, layers: list[int], bound: float = SAME) -> None:
    """The data's auxiliary state j is transformers' hidden_states[layers[j]] (or, with
    ``bound`` OTHER, is not: every such cosine below it)."""
    worst = [report["cosine"][j][k] for j, k in enumerate(layers)]
    if bound == SAME:
        assert min(worst) >= SAME, (layers, worst)
    else:
        assert max(worst) < OTHER, (layers, worst)


@pytest.fixture(scope="module")
def patched(tmp_path_factory) -> Path:
    return patched_target(tmp_path_factory, "0.16.0")


def test_default_layers_are_recorded_in_vllms_numbering(patched, tmp_path):
    report = run(patched, tmp_path)
    assert report["generator_layer_ids"] == report["data_config_layer_ids"] == [2, 4, 5, 7]
    assert report["saved_ids"] == [3, 5, 6]
    assert_data_is(report, [3, 5, 6])
    check = served(patched, report, tmp_path)
    assert check["exit_code"] == 0, check["summary"]
    assert check["served"]["aux_layers"] == [3, 5, 6] and check["served"]["from"] == "the draft's config"


def test_picked_layers_travel_with_the_data(patched, tmp_path):
    """``--layer-ids 1 3 6 7``, unsorted as a user may write them: the last is the verifier's
    last hidden state, the others are vLLM's 2, 4, 7."""
    report = run(patched, tmp_path, 6, 1, 7, 3)
    assert report["data_config_layer_ids"] == [6, 1, 7, 3]
    assert report["saved_ids"] == [2, 4, 7]
    assert_data_is(report, [2, 4, 7])
    check = served(patched, report, tmp_path)
    assert check["exit_code"] == 0 and check["served"]["aux_layers"] == [2, 4, 7], check["summary"]


def test_without_sp035_the_draft_is_served_one_layer_off(tmp_path_factory, tmp_path):
    target = patched_target(tmp_path_factory, "0.16.0", "--skip", "SP035")
    report = run(target, tmp_path)
    assert report["saved_ids"] is None
    assert_data_is(report, [3, 5, 6])  # the data is right: only the record is missing
    check = served(target, report, tmp_path)
    assert check["exit_code"] == 1 and check["served"]["aux_layers"] == [2, 4, 5], check["summary"]
    assert_data_is(report, check["served"]["aux_layers"], bound=OTHER)
    aux = next(c for c in check["checks"] if c["name"] == "auxiliary layers")
    assert aux["verdict"] == "problem" and "set eagle_aux_hidden_state_layer_ids to [3, 5, 6]" in aux["detail"]


def test_vllm_serves_the_layers_check_draft_names(tmp_path_factory, tmp_path):
    """vLLM itself serves the trained draft (the 0.32.0 CPU engine, which runs EAGLE-3): the
    layers its log names ("Using auxiliary layers from speculative config: (3, 5, 6)") are
    those check-draft said, read from the same vLLM's source."""
    env = engine_environ("0.32.0")
    target = patched_target(tmp_path_factory, "0.32.0")
    report = run(target, tmp_path, env=env)
    check = served(target, report, tmp_path)
    assert check["exit_code"] == 0 and check["served"]["aux_layers"] == [3, 5, 6], check["summary"]
    verifier = str(ensure_models() / "llama8")
    proc = subprocess.run(
        [str(target / "bin" / "python"), str(WORKER), "--serve", verifier, report["draft"]],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, **env},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"layers": [3, 5, 6], "from": "config", "tokens": 16}
