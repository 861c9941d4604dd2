"""SP034 (the EAGLE-3 draft finds a wrapped verifier's text config and weights): its fact on the
real transformers wheels, the rewrite of the real speculators 0.3.0, 0.4.0 and 0.4.0.1 files,
the no-op once applied, and the refusal of code it was not written for.

That the rewritten draft really builds from a Kimi-K2.5-layout verifier, gives the loss of the
same draft built from a plain one, saves and reloads is the engine tier's
(tests/e2e/test_training.py) and selftest's job; here the static side."""

from __future__ import annotations

import importlib
import zipfile

import pytest
from codemods import noop_test, refusal_test, rewrite_test, transformers_evidence
from sandbox import wheel

from patcher.engine import run_codemod
from patcher.fixes.registry import loaded

PATCH = loaded().by_id()["SP034"]
CORE = "speculators/models/eagle3/core.py"
CONFIGURATION = "transformers/configuration_utils.py"


SOURCE = importlib.import_module(PATCH.codemod.__module__)

# --- String pairs (tests/codemods.py) ------------------------------------------------------

DRAFT_030 = """\
import torch
from transformers import AutoConfig


class Eagle3DraftModel:
    def _setup_embeddings_and_lm_heads(self, config, t2d):
        verifier_model_config = AutoConfig.from_pretrained(config.name_or_path)
        verifier_weights = load_model_layers(
            ["model.embed_tokens.weight", "lm_head.weight"], config.name_or_path
        )
        self.embed_tokens = torch.nn.Embedding(
            verifier_model_config.vocab_size,
            self.hidden_size,
            padding_idx=verifier_model_config.pad_token_id,
        )
"""
DRAFT_04 = DRAFT_030.replace('"model.embed_tokens.weight", "lm_head.weight"', '"embed_tokens.weight", "lm_head.weight"')


def patched(source: str, helpers: str) -> str:
    """``source`` as SP034 leaves it: ``helpers`` above the class, the three reads rewritten."""
    head, cls = source.split("class Eagle3DraftModel:")
    cls = cls.replace("AutoConfig.from_pretrained(config.name_or_path)", "_verifier_text_config(config.name_or_path)")
    cls = cls.replace("verifier_model_config.pad_token_id", 'getattr(verifier_model_config, "pad_token_id", None)')
    if SOURCE.WEIGHTS in helpers:
        cls = cls.replace("load_model_layers(", "_load_verifier_weights(")
    return head + helpers + "\n\nclass Eagle3DraftModel:" + cls


PATCHED_030 = patched(DRAFT_030, SOURCE.TEXT_CONFIG + "\n\n" + SOURCE.WEIGHTS)
PATCHED_04 = patched(DRAFT_04, SOURCE.TEXT_CONFIG)

REWRITES = [
    pytest.param("SP034", DRAFT_030, PATCHED_030, id="SP034 0.3.0: text config, weights by layout, pad default"),
    pytest.param("SP034", DRAFT_04, PATCHED_04, id="SP034 0.4: text config and pad default, suffix match kept"),
]
NOOPS = [
    pytest.param("SP034", PATCHED_030, id="SP034 0.3.0 already reads the wrapped verifier"),
    pytest.param("SP034", PATCHED_04, id="SP034 0.4 already reads the text config"),
]
REFUSALS = [
    pytest.param(
        "SP034",
        DRAFT_030.replace('"model.embed_tokens.weight"', '"embed.weight"'),
        'load_model_layers(["model.embed_tokens.weight", ...]) (0.3.0) or (["embed_tokens.weight", ...]) (0.4)',
        id="SP034 another tensor name",
    ),
    pytest.param(
        "SP034",
        DRAFT_030.replace(
            "class Eagle3DraftModel:", "def _verifier_text_config(path):\n    return None\n\n\nclass Eagle3DraftModel:"
        ),
        "no module-level _verifier_text_config of its own",
        id="SP034 a helper of the same name",
    ),
    pytest.param(
        "SP034",
        PATCHED_030.replace("return config.get_text_config()", "return config"),
        "this patch's _verifier_text_config next to Eagle3DraftModel",
        id="SP034 its helper edited by hand",
    ),
]


test_wrapped_verifier = rewrite_test(REWRITES)


test_wrapped_verifier_noop = noop_test(NOOPS)


test_wrapped_verifier_refuses_unknown_code = refusal_test(REFUSALS)


def evidence(release: str | None) -> tuple[bool, str, str]:
    return transformers_evidence(PATCH, CONFIGURATION, release)


def core(release: str) -> str:
    with zipfile.ZipFile(wheel("speculators", release)) as z:
        return z.read(CORE).decode()


def run(src: str) -> tuple[str, str, str]:
    verdict, new, detail = run_codemod(PATCH, src.encode())
    return verdict, new.decode(), detail


@pytest.mark.parametrize(
    ("release", "line", "cls"),
    [("4.57.6", 1213, "PretrainedConfig"), ("5.19.0", 1366, "PreTrainedConfig"), ("5.22.2", 1536, "PreTrainedConfig")],
)
def test_get_text_config_looks_up_text_config(release, line, cls):
    assert evidence(release) == (
        True,
        f"{CONFIGURATION}:{line}",
        f"{cls}.get_text_config: decoder_possible_text_config_names = ('decoder', 'generator', 'text_config')",
    )


def test_no_get_text_config_before_4_45():
    holds, where, found = evidence("4.44.0")
    assert (
        not holds
        and where.startswith(f"{CONFIGURATION}:")
        and found == "class PretrainedConfig defines no get_text_config"
    )
    assert evidence(None) == (False, CONFIGURATION, "transformers is not installed")


def test_030_reads_the_text_config_and_finds_the_wrapped_weights():
    before = core("0.3.0")
    verdict, after, _ = run(before)
    assert verdict == "changed"
    method = after[after.index("    def _setup_embeddings_and_lm_heads") :]
    method = method[: method.index("    @torch.compile")]
    assert "verifier_model_config = _verifier_text_config(config.name_or_path)" in method
    assert "verifier_weights = _load_verifier_weights(" in method
    assert 'padding_idx=getattr(verifier_model_config, "pad_token_id", None)' in method
    assert "AutoConfig.from_pretrained" not in method and "load_model_layers" not in method
    helpers = after[: after.index('@SpeculatorModel.register("eagle3")')]
    for name in ("_verifier_text_config", "_verifier_tensor_names", "_load_verifier_weights"):
        assert f"\ndef {name}(" in helpers
    assert '("language_model.model.", "language_model.lm_head.")' in helpers
    assert '("model.language_model.", "lm_head.")' in helpers
    # Only the method and the helpers above the class change: every other line is as it was.
    assert [ln for ln in before.splitlines() if ln not in after.splitlines()] == [
        "        verifier_model_config = AutoConfig.from_pretrained(config.name_or_path)",
        "        verifier_weights = load_model_layers(",
        "            padding_idx=verifier_model_config.pad_token_id,",
    ]
    assert run(after)[0] == "satisfied"
    compile(after, CORE, "exec")


@pytest.mark.parametrize("release", ["0.4.0", "0.4.0.1"])
def test_04_trusts_the_config_and_keeps_its_suffix_match(release):
    verdict, after, _ = run(core(release))
    assert verdict == "changed"
    assert "verifier_model_config = _verifier_text_config(config.name_or_path)" in after
    assert '["embed_tokens.weight", "lm_head.weight", "model.norm.weight"]' in after  # 0.4's own lookup kept
    assert "_load_verifier_weights" not in after and "_TEXT_MODEL_LAYOUTS" not in after
    assert run(after)[0] == "satisfied"
    compile(after, CORE, "exec")


@pytest.mark.parametrize(
    ("edit", "line_of", "expected"),
    [
        pytest.param(
            lambda s: s.replace(
                "def align_for_step(", "def _verifier_text_config(path):\n    return None\n\n\ndef align_for_step("
            ),
            "def _verifier_text_config(path)",
            "no module-level _verifier_text_config of its own",
            id="a helper of the same name",
        ),
        pytest.param(
            lambda s: s.replace('["model.embed_tokens.weight", lm_head_key]', '["embed.weight", lm_head_key]'),
            "verifier_weights = load_model_layers(",
            'load_model_layers(["model.embed_tokens.weight", ...]) (0.3.0) or (["embed_tokens.weight", ...]) (0.4)',
            id="another tensor name",
        ),
    ],
)
def test_refuses_code_it_was_not_written_for(edit, line_of, expected):
    source = edit(core("0.3.0"))
    verdict, _, detail = run(source)
    line = source[: source.index(line_of)].count("\n") + 1
    assert verdict == "refused"
    assert detail == f"{CORE}:{line}: unrecognised code, expected {expected}"


def test_refuses_a_method_that_reads_the_config_twice():
    source = core("0.3.0").replace(
        "        verifier_model_config = AutoConfig.from_pretrained(config.name_or_path)\n",
        "        verifier_model_config = AutoConfig.from_pretrained(config.name_or_path)\n"
        "        again = AutoConfig.from_pretrained(config.name_or_path)\n",
    )
    verdict, _, detail = run(source)
    assert verdict == "refused" and "one AutoConfig.from_pretrained(config.name_or_path)" in detail
