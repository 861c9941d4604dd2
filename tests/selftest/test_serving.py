"""selftest's serving stage, the parts that need no engine: vLLM's spec-decode counters turned
into acceptance figures, the auxiliary layer ids a draft is served with, the verdict, the
report. The engine itself: tests/e2e/test_selftest.py (the CPU engine serves the saved draft)."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from patcher.agent.selftest import serve
from patcher.agent.selftest.spec_decode import acceptance
from patcher.cli.reports import render_serving
from patcher.commands.selftest import served_words, summarize, verdict


def counters(drafts, draft_tokens, accepted, per_position):
    return {"drafts": drafts, "draft_tokens": draft_tokens, "accepted": accepted, "per_position": per_position}


def test_acceptance_is_what_one_run_added_to_the_counters():
    """20 draft steps of 3 tokens in the run, 30 accepted: 2.5 tokens per verifier step."""
    found = acceptance(counters(10, 30, 12, [6, 4, 2]), counters(30, 90, 42, [18, 14, 10]))
    assert found["drafts"] == 20 and found["draft_tokens"] == 60 and found["accepted"] == 30
    assert found["acceptance_length"] == 2.5
    assert found["acceptance_rate"] == 0.5
    assert found["per_position"] == [0.6, 0.5, 0.4]
    assert found["accepted_per_position"] == [12, 10, 8]


def test_without_draft_steps_there_is_no_acceptance():
    """The verifier served alone: vLLM reports no spec-decode counters, nothing is invented."""
    found = acceptance(counters(0, 0, 0, []), counters(0, 0, 0, []))
    assert found["acceptance_length"] is None and found["acceptance_rate"] is None and found["per_position"] is None


def draft_dir(tmp_path, ids=None):
    config = {"speculators_model_type": "eagle3", "draft_vocab_size": 256}
    if ids is not None:
        config["eagle_aux_hidden_state_layer_ids"] = ids
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_a_draft_without_ids_is_served_the_layers_it_was_trained_on(tmp_path):
    """speculators 0.3.0 records no ids: selftest serves the captured layers + 1 (vLLM numbers a
    state by the layer it enters), not vLLM's defaults."""
    ids = serve.aux_ids(draft_dir(tmp_path), [1, 4, 6])
    assert ids == {"recorded": None, "trained_on": [1, 4, 6], "served": [1, 4, 6], "match": True}


@pytest.mark.parametrize(("recorded", "match"), [([1, 4, 6], True), ([0, 3, 5], False), ([2, 3, 3], False)])
def test_ids_a_draft_records_are_served_and_checked(tmp_path, recorded, match):
    """Recorded ids are what vLLM will serve; ones other than the trained layers' (in
    speculators' numbering, or vLLM's defaults) are a mismatch."""
    ids = serve.aux_ids(draft_dir(tmp_path, recorded), [1, 4, 6])
    assert ids["served"] == recorded and ids["match"] is match


def test_set_aux_ids_keeps_the_rest_of_the_config(tmp_path):
    serve.set_aux_ids(draft_dir(tmp_path), [1, 4, 6])
    config = json.loads((tmp_path / "config.json").read_text())
    assert config == {
        "speculators_model_type": "eagle3",
        "draft_vocab_size": 256,
        "eagle_aux_hidden_state_layer_ids": [1, 4, 6],
    }


def served(trained=1.2, untrained=1.0, match=True, **extra):
    drafts = {"trained": {"drafts": 100, "acceptance_length": trained}}
    if untrained is not None:
        drafts["untrained"] = {"drafts": 120, "acceptance_length": untrained}
    return {"drafts": drafts, "aux_layer_ids": {"match": match}, **extra}


@pytest.mark.parametrize(
    ("found", "device", "ok"),
    [
        (served(), "cuda", True),
        (served(trained=1.0), "cuda", False),  # training did not raise what vLLM accepts
        (served(match=False), "cuda", False),  # served other layers than trained on
        (served(untrained=None), "cpu", True),  # CPU: the saved draft alone, served
        (
            {"drafts": {"trained": {"drafts": 0, "acceptance_length": None}}, "aux_layer_ids": {"match": True}},
            "cpu",
            False,
        ),
        ({"drafts": {"trained": {"error": "exit 1", "tail": []}}, "aux_layer_ids": {"match": True}}, "cpu", False),
    ],
)
def test_judge(found, device, ok):
    assert serve.judge(found, device) is ok


@pytest.mark.parametrize(
    ("asked", "device", "training", "skipped", "ok"),
    [
        (False, "cuda", {"ok": True}, "not asked (--no-serve)", True),
        (None, "cpu", {"ok": True}, serve.NOT_ON_CPU, True),
        (None, "cuda", {"ok": False}, "no draft to serve: the training stage did not pass", False),
        (True, "cpu", {"skipped": "why", "ok": True}, "no draft to serve: why", True),
    ],
)
def test_when_the_stage_does_not_run(tmp_path, asked, device, training, skipped, ok):
    serving = serve.Serving("llama", tmp_path, device, asked, lambda _: None)
    found = serving.finish({"training": training})
    serving.close()
    assert found == {"skipped": skipped, "ok": ok}


def report(serving: dict, device: str = "cuda") -> dict:
    arch = {"arch": "llama", "ok": True, "cases": [], "layers": [0, 3, 5], "training": {"ok": True}, "serving": serving}
    return {"ok": True, "archs": [arch], "device": device, "bound": 0.999, "versions": {"speculators": "0.3.0"}}


class NoPatches:
    patches: list = []

    def written_for(self, _release):
        return []


def test_the_verdict_says_what_vllm_accepted_trained_against_untrained():
    judged = summarize(report(served(trained=1.0523, untrained=1.0006) | {"ok": True}), NoPatches())
    assert (judged["served_ok"], judged["served"]) == (1, 1)
    assert served_words(judged) == "1 of 1 served by vLLM as EAGLE-3 (acceptance length 1.0523 vs 1.0006 untrained)"
    assert verdict(judged).endswith("; 1 of 1 served by vLLM as EAGLE-3 (acceptance length 1.0523 vs 1.0006 untrained)")


def test_the_verdict_says_when_nothing_was_served_on_the_cpu():
    judged = summarize(report({"skipped": serve.NOT_ON_CPU, "ok": True}, "cpu"), NoPatches())
    assert served_words(judged) == "no draft served by vLLM (on the CPU only with --serve)"


def rendered(serving: dict) -> str:
    out = io.StringIO()
    render_serving(serving, Console(file=out, width=200, color_system=None))
    return out.getvalue()


def test_the_report_shows_each_draft_and_the_layers_served():
    drafts = {
        name: {
            "engine_start_s": 41.0,
            "drafts": n,
            "draft_tokens": 3 * n,
            "accepted": acc,
            "acceptance_length": length,
            "per_position": pos,
            "output_tokens": 1536,
        }
        for name, n, acc, length, pos in (
            ("untrained", 510, 1, 1.002, [0.002, 0.0, 0.0]),
            ("trained", 480, 40, 1.0833, [0.06, 0.02, 0.0033]),
        )
    }
    text = rendered(
        {
            "speculative_tokens": 3,
            "aux_layer_ids": {"recorded": None, "trained_on": [1, 4, 6], "served": [1, 4, 6], "match": True},
            "drafts": drafts,
            "same_greedy_output": "32/32",
            "ok": True,
        }
    )
    assert text.splitlines() == [
        "  served by vLLM as EAGLE-3, 3 speculative tokens, auxiliary layers [1, 4, 6] (written by selftest)",
        "    untrained draft: acceptance length 1.002 (per position [0.002, 0.0, 0.0]), 510 draft steps, 1 of 1530 "
        "draft tokens accepted; engine up in 41.0 s",
        "    trained draft: acceptance length 1.0833 (per position [0.06, 0.02, 0.0033]), 480 draft steps, 40 of 1440 "
        "draft tokens accepted; engine up in 41.0 s",
        "    same greedy output with either draft: 32/32",
    ]


def test_the_report_names_a_failed_engine():
    text = rendered(
        {
            "speculative_tokens": 3,
            "aux_layer_ids": {"recorded": [0, 3, 5], "trained_on": [1, 4, 6], "served": [0, 3, 5], "match": False},
            "drafts": {"trained": {"error": "exit 1", "tail": ["ValueError: boom"]}},
            "error": {"stage": "serving the trained draft", "type": "EngineFailed", "message": "ValueError: boom"},
            "ok": False,
        }
    )
    assert "auxiliary layers [0, 3, 5] (recorded in the draft: [0, 3, 5]) trained on [1, 4, 6]" in text
    assert "trained draft: exit 1" in text
    assert "serving failed at serving the trained draft:\n    EngineFailed: ValueError: boom" in text


# vLLM 0.16.0's CPU engine asked for an EAGLE-3 draft: its engine process logs the cause, the
# front end only says that the engine did not start.
ENGINE_LOG = """\
(EngineCore_DP0 pid=5) ERROR 12-07 01:30:09 [core.py:1010] EngineCore failed to start.
(EngineCore_DP0 pid=5) ERROR 12-07 01:30:09 [core.py:1010] Traceback (most recent call last):
(EngineCore_DP0 pid=5) ERROR 12-07 01:30:09 [core.py:1010]   File "/env/vllm/v1/engine/core.py", line 1000, in run_engine_core
(EngineCore_DP0 pid=5) ERROR 12-07 01:30:09 [core.py:1010]     engine_core = EngineCoreProc(*args, **kwargs)
(EngineCore_DP0 pid=5) ERROR 12-07 01:30:09 [core.py:1010]   File "/env/vllm/v1/worker/cpu_model_runner.py", line 25, in __init__
(EngineCore_DP0 pid=5) ERROR 12-07 01:30:09 [core.py:1010]     assert self.speculative_config is None, "spec decode is not supported."
(EngineCore_DP0 pid=5) ERROR 12-07 01:30:09 [core.py:1010] AssertionError: spec decode is not supported.
Traceback (most recent call last):
  File "/env/vllm/v1/engine/core_client.py", line 700, in __init__
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""


def test_an_engine_that_did_not_start_is_reported_with_the_cause_its_engine_logged(tmp_path):
    log = tmp_path / "trained.log"
    log.write_text(ENGINE_LOG)
    tail = ENGINE_LOG.splitlines()[-3:]
    error = serve.engine_error({"name": "trained", "error": "exit 1", "tail": tail, "log": str(log)})
    assert error["stage"] == "serving the trained draft"
    assert error["message"].startswith("RuntimeError: Engine core initialization failed")
    worker = error["worker"]
    assert (worker["process"], worker["type"], worker["message"]) == (
        "EngineCore_DP0 pid=5",
        "AssertionError",
        "spec decode is not supported.",
    )
    text = rendered({"speculative_tokens": 3, "drafts": {}, "error": error, "ok": False})
    assert text.splitlines()[-4:] == [
        "  serving failed at serving the trained draft:",
        "    EngineCore_DP0 pid=5: AssertionError: spec decode is not supported.",
        "      at /env/vllm/v1/engine/core.py:1000 in run_engine_core",
        "      at /env/vllm/v1/worker/cpu_model_runner.py:25 in __init__",
    ]


@pytest.mark.parametrize(
    "config",
    [{"vocab_size": 1000}, {"architectures": ["KimiK25ForConditionalGeneration"], "text_config": {"vocab_size": 1000}}],
    ids=["plain", "wrapped"],
)
def test_the_prompts_use_the_verifiers_vocabulary_wherever_its_config_keeps_it(tmp_path, config):
    """Kimi-K2.5 keeps its vocabulary in text_config: serving read it at the top and failed on the
    H100 before any engine started (KeyError 'vocab_size')."""
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert serve.verifier_vocab(tmp_path) == 1000


def test_on_a_gpu_the_untrained_engine_starts_before_training_and_both_are_collected(tmp_path):
    """The order selftest serves in on a GPU: the untrained draft's engine is launched when training
    saves it, the trained one's after training, and finish collects both, the untrained first. Real
    child processes of spec_decode.py; this interpreter has no vLLM, so each engine fails at its
    import, which the stage reports as the untrained draft's failure (the first collected)."""
    model_dir = tmp_path / "llama"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps({"vocab_size": 64}))
    untrained = tmp_path / "llama-training" / "untrained" / "0"
    trained = tmp_path / "llama-training" / "draft" / "2"
    for draft in (untrained, trained):
        draft.mkdir(parents=True)
        (draft / "config.json").write_text(json.dumps({"eagle_aux_hidden_state_layer_ids": None, "keep": 1}))
    said: list = []
    serving = serve.Serving("llama", model_dir, "cuda", None, said.append)
    serving.untrained_saved(untrained, [0, 3, 5])
    assert [name for name, _, _ in serving.children] == ["untrained"]  # launched before training ran
    assert json.loads((untrained / "config.json").read_text())["eagle_aux_hidden_state_layer_ids"] == [1, 4, 6]
    found = serving.finish({"layers": [0, 3, 5], "training": {"ok": True}})
    serving.close()
    assert list(found["drafts"]) == ["untrained", "trained"] and serving.children == []
    assert all("error" in d for d in found["drafts"].values()) and not found["ok"]
    assert found["error"]["stage"] == "serving the untrained draft"
    assert (
        "ModuleNotFoundError: No module named 'vllm'"
        in (tmp_path / "llama-training" / "serve-logs" / "trained.log").read_text()
    )
    assert said[-1].startswith("llama: serving: FAILED in ")


def test_close_ends_an_engine_that_training_outlived(tmp_path):
    """Training failed after the untrained draft's engine started: close() ends its process group."""
    (tmp_path / "llama").mkdir()
    (tmp_path / "llama" / "config.json").write_text(json.dumps({"vocab_size": 64}))
    draft = tmp_path / "llama-training" / "untrained" / "0"
    draft.mkdir(parents=True)
    (draft / "config.json").write_text("{}")
    serving = serve.Serving("llama", tmp_path / "llama", "cuda", True, lambda _: None)
    serving.untrained_saved(draft, [0, 3, 5])
    [(_, proc, _)] = serving.children
    found = serving.finish({"layers": [0, 3, 5], "training": {"ok": False}})
    serving.close()
    assert found == {"skipped": "no draft to serve: the training stage did not pass", "ok": False}
    assert proc.returncode is not None and serving.children == []


def test_nothing_starts_early_where_serving_will_not_run(tmp_path):
    draft = tmp_path / "untrained"
    draft.mkdir()
    (draft / "config.json").write_text("{}")
    for device, asked in (("cpu", None), ("cuda", False)):
        serving = serve.Serving("llama", tmp_path, device, asked, lambda _: None)
        serving.untrained_saved(draft, [0, 3, 5])
        assert serving.children == [] and serving.early is None
