"""SP036 (the EAGLE draft reads ``pad_token_id`` with ``None`` as default): its fact on the real
transformers wheels (4.57.6 sets it on every config, 5.0.0 and 5.22.2 do not) and its codemod on
the real ``speculators/models/eagle.py`` of 0.3.0, 0.4.0 and 0.4.0.1."""

from __future__ import annotations

import zipfile

import pytest
from codemods import noop_test, refusal_test, rewrite_test, transformers_evidence
from sandbox import wheel

from patcher.engine import run_codemod
from patcher.fixes.registry import loaded

PATCH = loaded().by_id()["SP036"]
EAGLE = "speculators/models/eagle.py"
CONFIGURATION = "transformers/configuration_utils.py"

INIT = "class EagleSpeculator:\n    def __init__(self, config):\n        self.padding_idx = {}\n"
READ = "config.transformer_layer_config.pad_token_id"
DEFAULTED = 'getattr(config.transformer_layer_config, "pad_token_id", None)'

REWRITES = [pytest.param("SP036", INIT.format(READ), INIT.format(DEFAULTED), id="speculators 0.3.0/0.4 read")]

NOOPS = [pytest.param("SP036", INIT.format(DEFAULTED), id="already defaulted")]

REFUSALS = [
    pytest.param("SP036", INIT.format("None"), "'config.transformer_layer_config.pad_token_id'", id="no such read"),
    pytest.param(
        "SP036",
        INIT.format("self.config.pad_token_id"),
        "'config.transformer_layer_config.pad_token_id'",
        id="pad_token_id read from another config",
    ),
]


test_pad_token_id = rewrite_test(REWRITES)


test_pad_token_id_noop = noop_test(NOOPS)


test_pad_token_id_refuses_unknown_code = refusal_test(REFUSALS)


def evidence(release: str | None) -> tuple[bool, str, str]:
    return transformers_evidence(PATCH, CONFIGURATION, release)


def test_transformers_4_sets_pad_token_id_on_every_config():
    assert evidence("4.57.6") == (
        False,
        f"{CONFIGURATION}:313",
        "PretrainedConfig.__init__: self.pad_token_id = pad_token_id",
    )


@pytest.mark.parametrize(("release", "line"), [("5.0.0", 57), ("5.22.2", 299)])
def test_transformers_5_sets_none(release, line):
    assert evidence(release) == (
        True,
        f"{CONFIGURATION}:{line}",
        "class PreTrainedConfig sets no pad_token_id (each model's config declares its own)",
    )


def test_not_needed_without_transformers():
    assert evidence(None)[0] is False


@pytest.mark.parametrize(("release", "line"), [("0.3.0", 280), ("0.4.0", 336), ("0.4.0.1", 336)])
def test_on_the_real_eagle_py(release, line):
    with zipfile.ZipFile(wheel("speculators", release)) as z:
        before = z.read(EAGLE).decode()
    assert before.splitlines()[line - 1] == f"        self.padding_idx = {READ}"
    verdict, after, _ = run_codemod(PATCH, before.encode())
    assert verdict == "changed"
    assert after.decode().splitlines()[line - 1] == f"        self.padding_idx = {DEFAULTED}"
    assert run_codemod(PATCH, after)[0] == "satisfied"
