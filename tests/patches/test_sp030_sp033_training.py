"""SP030-SP032 (speculators' draft config on transformers 5.4+) and SP033 (preprocessing counts
the conversations it drops): their facts on the real transformers wheels, the rewrite of the real
speculators 0.3.0 and 0.4.0 files, the no-op once applied, the refusal of a hand-written variant,
and the CLI's verdicts on a sandbox of the vLLM 0.34 stack.

That the rewritten config really builds, trains, saves and reloads a draft is the engine tier's
(tests/e2e/test_training.py) and selftest's job; here the static side."""

from __future__ import annotations

import zipfile

import pytest
from codemods import codemod, noop_test, refusal_test, rewrite_test
from sandbox import make_sandbox, wheel
from support import run_cli, run_json

from patcher.fixes.library_source import LibrarySource
from patcher.fixes.registry import loaded

PATCHES = {p.id: p for p in loaded().patches}
CONFIG = "speculators/config.py"
PREPROCESSING = "speculators/data_generation/preprocessing.py"
CONFIG_PATCHES = ("SP030", "SP031", "SP032")


def transformers_files(release: str, paths) -> dict[str, bytes | None]:
    with zipfile.ZipFile(wheel("transformers", release)) as z:
        names = set(z.namelist())
        return {p: z.read(p) if p in names else None for p in paths}


def speculators_file(release: str, path: str) -> str:
    with zipfile.ZipFile(wheel("speculators", release)) as z:
        return z.read(path).decode()


def evidence(patch_id: str, release: str | None) -> list[tuple[bool, str, str]]:
    patch = PATCHES[patch_id]
    paths = {m for f in patch.facts for m in f.modules}
    files = transformers_files(release, paths) if release else dict.fromkeys(paths)
    src = LibrarySource(files, "0.34.0", {"transformers": release})
    return [(e.holds, e.where, e.found) for e in (f.probe(src) for f in patch.facts)]


# -- the rewrites and refusals, string to string --------------------------------------------

# speculators' draft config base class, cut down (config.py; 0.3.0 and 0.4.0 alike).
CONFIG_CLASS = """\
class SpeculatorModelConfig(PydanticClassRegistryMixin, PretrainedConfig):
    \"\"\"The base config of every speculator model.\"\"\"

    speculators_model_type: str = "speculator_model"

    def __init__(self, **kwargs):
        PydanticClassRegistryMixin.__init__(self, **kwargs)
        PretrainedConfig.__init__(self, **kwargs)

    def to_dict(self):
        return self.model_dump()
"""
INIT = "    def __init__(self, **kwargs):\n"

# build_eagle3_dataset, cut down (data_generation/preprocessing.py; 0.3.0 and 0.4.0 alike).
BUILD_DATASET = """\
def build_eagle3_dataset(dataset, tokenizer, max_length=2048, num_proc=8):
    \"\"\"Build EAGLE3 dataset by tokenizing conversations and creating loss masks.\"\"\"
    original_cols = dataset.column_names

    dataset = dataset.map(
        lambda examples: _preprocess_batch(examples, tokenizer, max_length),
        batched=True,
        num_proc=num_proc,
        remove_columns=original_cols,
    )

    dataset.set_format(type="torch")
    return dataset
"""

REWRITES = [
    pytest.param(
        "SP030",
        CONFIG_CLASS,
        CONFIG_CLASS.replace(
            INIT,
            """\
    def __init_subclass__(cls, **kwargs):
        # transformers >= 5.4 replaces the __init__ of a config subclass that defines none
        # (PretrainedConfig.__init_subclass__): take it off, so this class's is inherited.
        defines_init = "__init__" in cls.__dict__
        super().__init_subclass__(**kwargs)
        if not defines_init and "__init__" in cls.__dict__:
            del cls.__init__

"""
            + INIT,
        ),
        id="SP030 __init_subclass__ added above __init__",
    ),
    pytest.param(
        "SP031",
        CONFIG_CLASS,
        CONFIG_CLASS.replace(
            INIT,
            """\
    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs):
        # transformers >= 5.4 annotates PretrainedConfig's fields with torch types; pydantic
        # resolves them in the caller's frame of model_rebuild: this one, with torch in it.
        super().__pydantic_init_subclass__(**kwargs)
        import torch  # noqa: F401

        cls.model_rebuild(force=True, raise_errors=False)

"""
            + INIT,
        ),
        id="SP031 each subclass rebuilt with torch in scope",
    ),
    pytest.param(
        "SP032",
        CONFIG_CLASS,
        CONFIG_CLASS.replace(
            INIT,
            """\
    def validate(self):
        # transformers >= 5.4's save_pretrained calls self.validate(), its own checks of the
        # config; pydantic's deprecated BaseModel.validate(value) comes first in this MRO.
        checks = getattr(PretrainedConfig, "validate", None)
        if checks is not None:
            checks(self)

"""
            + INIT,
        ),
        id="SP032 transformers' validate, not pydantic's",
    ),
    pytest.param(
        "SP033",
        BUILD_DATASET,
        """\
        def build_eagle3_dataset(dataset, tokenizer, max_length=2048, num_proc=8):
            \"\"\"Build EAGLE3 dataset by tokenizing conversations and creating loss masks.\"\"\"
            original_cols = dataset.column_names

            conversations_in = len(dataset)
            dataset = dataset.map(
                lambda examples: _preprocess_batch(examples, tokenizer, max_length),
                batched=True,
                num_proc=num_proc,
                remove_columns=original_cols,
            )
            # A conversation _preprocess_batch cannot use leaves no row: say how many are gone.
            if len(dataset) < conversations_in:
                log.warning(
                    f"preprocessing dropped {conversations_in - len(dataset)} of {conversations_in} conversations "
                    "(empty, without usable turns, or failed: see the warnings above); "
                    "they are not in the training data"
                )

            dataset.set_format(type="torch")
            return dataset
        """,
        id="SP033 counted before the map, the drop logged after it",
    ),
]

NOOPS = [
    pytest.param(
        "SP033",
        BUILD_DATASET.replace(
            "    dataset = dataset.map(", "    conversations_in = len(dataset)\n    dataset = dataset.map("
        ),
        id="SP033 already counts what it maps",
    ),
]

REFUSALS = [
    pytest.param(
        "SP030",
        CONFIG_CLASS.replace(INIT, "    def __init_subclass__(cls, **kwargs):\n        pass\n\n" + INIT),
        "no __init_subclass__ of its own in class SpeculatorModelConfig",
        id="SP030 an __init_subclass__ of the user's",
    ),
    pytest.param(
        "SP031",
        CONFIG_CLASS.replace("SpeculatorModelConfig", "DraftConfig"),
        "one module-level class SpeculatorModelConfig",
        id="SP031 no such class",
    ),
    pytest.param(
        "SP032",
        CONFIG_CLASS.replace(INIT, "    def validate(self):\n        return None\n\n" + INIT),
        "no validate of its own in class SpeculatorModelConfig",
        id="SP032 a validate of the user's",
    ),
    pytest.param(
        "SP033",
        BUILD_DATASET.replace("    return dataset", "    dataset = dataset.map(_shuffle)\n    return dataset"),
        "one 'dataset = dataset.map(...)' statement in build_eagle3_dataset",
        id="SP033 two maps: which one drops?",
    ),
    pytest.param(
        "SP033",
        BUILD_DATASET.replace("def build_eagle3_dataset", "def build_dataset"),
        "one module-level function build_eagle3_dataset",
        id="SP033 no such function",
    ),
]


test_training_fix = rewrite_test(REWRITES)


test_training_fix_noop = noop_test(NOOPS)


test_training_fix_refuses_unknown_code = refusal_test(REFUSALS)


# -- on the real files and facts ------------------------------------------------------------


@pytest.mark.parametrize(
    ("patch_id", "line_5_4", "line_5_22", "found_5_22"),
    [
        ("SP030", 300, 539, "PreTrainedConfig.__init_subclass__: wrap_init_to_accept_kwargs(cls)"),
        ("SP031", 227, 416, "PreTrainedConfig.dtype: str | torch.dtype | None"),
        ("SP032", 517, 781, "PreTrainedConfig.save_pretrained: self.validate()"),
    ],
)
def test_facts_hold_from_transformers_5_4(patch_id, line_5_4, line_5_22, found_5_22):
    where = "transformers/configuration_utils.py"
    assert evidence(patch_id, "5.22.2") == [(True, f"{where}:{line_5_22}", found_5_22)]
    assert [e[:2] for e in evidence(patch_id, "5.4.0")] == [(True, f"{where}:{line_5_4}")]
    for release in ("4.57.6", "5.3.0"):  # the class is there, the hook / field / call is not
        [(holds, at, found)] = evidence(patch_id, release)
        assert not holds and at.startswith(f"{where}:"), (release, found)
    assert evidence(patch_id, None) == [(False, where, "transformers is not installed")]


@pytest.mark.parametrize("release", ["0.3.0", "0.4.0"])
def test_config_patches_rewrite_then_no_op(release):
    source = speculators_file(release, CONFIG)
    for patch_id in CONFIG_PATCHES:
        verdict, source, detail = codemod(patch_id, source)
        assert verdict == "changed", (patch_id, detail)
    cls = source[source.index("class SpeculatorModelConfig") :]
    methods = [
        cls.index(f"    def {name}(") for name in ("__init_subclass__", "__pydantic_init_subclass__", "validate")
    ]
    assert methods == sorted(methods) and methods[-1] < cls.index("    def __init__(self, **kwargs)")
    for patch_id in CONFIG_PATCHES:
        assert codemod(patch_id, source)[0] == "satisfied"
    compile(source, CONFIG, "exec")


def test_config_patch_refuses_a_method_of_the_users():
    source = speculators_file("0.3.0", CONFIG).replace(
        "    def to_diff_dict(self)",
        "    def validate(self):\n        return None\n\n    def to_diff_dict(self)",
    )
    verdict, _, detail = codemod("SP032", source)
    line = source[: source.index("    def validate(self)")].count("\n") + 1
    assert verdict == "refused"
    assert detail.endswith(
        f"{CONFIG}:{line}: unrecognised code, expected no validate of its own in class SpeculatorModelConfig"
    )


@pytest.mark.parametrize("release", ["0.3.0", "0.4.0"])
def test_preprocessing_counts_what_map_drops(release):
    verdict, new, _ = codemod("SP033", speculators_file(release, PREPROCESSING))
    assert verdict == "changed"
    body = new[new.index("def build_eagle3_dataset") :]
    assert (
        body.index("conversations_in = len(dataset)")
        < body.index("dataset = dataset.map(")
        < body.index("if len(dataset) < conversations_in:")
    )
    assert codemod("SP033", new)[0] == "satisfied"


@pytest.fixture(scope="module")
def stack_034(tmp_path_factory):
    """speculators 0.3.0, vLLM 0.34.0 (its CUDA wheel) and transformers 5.22.2, the files only."""
    return make_sandbox(
        tmp_path_factory.mktemp("s034") / "env", "0.3.0", "0.34.0", transformers="5.22.2", vllm_dist="vllm"
    )


def test_verify_names_the_training_breaks_of_an_install_patched_without_them(stack_034):
    """What main before these patches left on a transformers 5.22 stack: verify exits 1 and
    names each break with transformers' file:line; after ``apply``, never 1."""
    skip = [a for pid in ("SP030", "SP031", "SP032", "SP033") for a in ("--skip", pid)]
    code, _ = run_json("apply", "--target", str(stack_034), *skip)
    assert code in (0, 1, 3)
    code, data = run_json("verify", "--target", str(stack_034))
    assert code == 1 and "the patch verdicts (fix column)" in data["failing"]
    missing = {r["id"] for r in data["patches"] if r["verdict"] == "missing"}
    assert missing == {"SP030", "SP031", "SP032", "SP033"}
    facts = {f["patch"]: f"{f['file']}:{f['line']}" for f in data["facts"] if f["library"] == "transformers"}
    assert facts == {
        "SP030": "transformers/configuration_utils.py:539",
        "SP031": "transformers/configuration_utils.py:416",
        "SP032": "transformers/configuration_utils.py:781",
        "SP034": "transformers/configuration_utils.py:1536",  # applied: the draft's wrapped verifier
        "SP036": "transformers/configuration_utils.py:299",  # applied: PretrainedConfig sets no pad_token_id
        "SP014": "transformers/modeling_attn_mask_utils.py:1",  # not needed: the module it guards is there
    }
    assert data["libraries"] == {"transformers": "5.22.2"}
    assert run_cli("apply", "--target", str(stack_034)).returncode in (0, 3)
    assert run_cli("verify", "--target", str(stack_034)).returncode in (0, 3)
