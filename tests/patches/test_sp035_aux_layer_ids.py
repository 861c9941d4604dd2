"""SP035 (the draft's config names the layers its data holds, in vLLM's numbering): how every vLLM
release 0.11-0.34 numbers EAGLE-3 auxiliary hidden states (read from the real wheels), the
rewrite of the real speculators 0.3.0, 0.4.0 and 0.4.0.1 trainers, the no-op once applied, the
refusal of hand-written variants, and the emitted method run on the real patched file.

That a draft trained on the patched install carries ids selecting exactly its data's hidden
states is the engine tier's (tests/e2e/test_training.py, with speculators' generator, trainer and
checkpointer and a transformers forward); here the static side and the method's rules."""

from __future__ import annotations

import ast
import importlib
import json
import logging
import textwrap
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from codemods import noop_test, refusal_test, rewrite_test
from matrix_doc import RELEASES, dist
from sandbox import wheel

from patcher.engine import run_codemod
from patcher.fixes import vllm_eagle3
from patcher.fixes.library_source import LibrarySource
from patcher.fixes.registry import loaded

PATCH = {p.id: p for p in loaded().patches}["SP035"]
PATCH_METHOD = importlib.import_module(PATCH.codemod.__module__).METHOD
TRAINER = "speculators/train/trainer.py"
MODULES = [f"{vllm_eagle3.MODELS}/{m}.py" for m in ("llama", "deepseek_v2", "qwen2", "qwen3_moe")]
READ = [*MODULES, vllm_eagle3.INTERFACES, vllm_eagle3.SPECULATORS_ALGOS]
# Where llama.py takes auxiliary layer i (the evidence verify shows), per release: before the
# layer runs up to 0.17, as idx + 1 after it from 0.18.
LLAMA_LINE = {
    "0.11.0": 403,
    "0.12.0": 438,
    "0.13.0": 434,
    "0.14.1": 446,
    "0.15.1": 424,
    "0.16.0": 424,
    "0.17.1": 424,
    "0.18.1": 426,
    "0.24.0": 418,
    "0.32.0": 439,
    "0.33.0": 439,
    "0.34.0": 439,
}


def source(release: str) -> LibrarySource:
    with zipfile.ZipFile(wheel(dist(release), release)) as z:
        names = set(z.namelist())
        return LibrarySource({p: z.read(p) if p in names else None for p in READ}, release)


def minor(release: str) -> tuple[int, int]:
    return tuple(int(x) for x in release.split(".")[:2])


@pytest.fixture(scope="module")
def sources() -> dict[str, LibrarySource]:
    return {r: source(r) for r in RELEASES}


def test_fact_holds_on_every_release(sources):
    """vLLM numbers auxiliary layer i by the hidden state entering layer i on 0.11-0.34."""
    [fact] = PATCH.facts
    for release, src in sources.items():
        found = fact.probe(src)
        assert found.holds and found.file == vllm_eagle3.LLAMA, (release, found)
        if release in LLAMA_LINE:
            assert found.line == LLAMA_LINE[release], release
        form = "_maybe_add_hidden_state(aux_hidden_states, idx + 1" if minor(release) >= (0, 18) else "idx in self."
        assert form in found.found and found.found.endswith("the input of decoder layer i"), (release, found.found)


def test_no_release_numbers_by_output(sources):
    """Every model with EAGLE-3 (Llama, DeepSeek-V2/V3, Qwen2/3, Qwen3-MoE) numbers by input on
    every release; DeepSeek takes none before 0.18; the state after the last layer (id
    num_layers) exists for Llama from 0.18 and DeepSeek from 0.25."""
    for release, src in sources.items():
        seen = {path.rsplit("/", 1)[1]: vllm_eagle3.aux_capture(src, path) for path in MODULES}
        assert {c.numbering for c in seen.values()} <= {"input", "none"}, release
        assert seen["llama.py"].numbering == seen["qwen2.py"].numbering == "input", release
        assert (seen["deepseek_v2.py"].numbering == "none") is (minor(release) < (0, 18)), release
        assert seen["llama.py"].final_state is (minor(release) >= (0, 18)), release
        assert seen["deepseek_v2.py"].final_state is (minor(release) >= (0, 25)), release


def test_defaults_and_speculators_drafts(sources):
    """Without ids vLLM serves (2, n//2, n-3) on every release (the model's own getter up to 0.17,
    interfaces.py after); it passes a speculators draft's ids on from 0.12 (0.11 drops them)."""
    for release, src in sources.items():
        default = vllm_eagle3.default_layers(src, (vllm_eagle3.LLAMA,))
        assert default.expression == "(2, num_layers // 2, num_layers - 3)", release
        assert default.for_depth(8) == (2, 4, 5) and default.for_depth(32) == (2, 16, 29)
        assert default.file == (vllm_eagle3.LLAMA if minor(release) < (0, 18) else vllm_eagle3.INTERFACES)
        eagle3 = vllm_eagle3.speculators_methods(src)["eagle3"]
        assert eagle3.architectures.get("llama", eagle3.architectures.get("")) == "Eagle3LlamaForCausalLM"
        assert (eagle3.aux_ids_line is None) is (release == "0.11.0"), release


def run(src: str) -> tuple[str, str, str]:
    verdict, new, detail = run_codemod(PATCH, src.encode())
    return verdict, new.decode(), detail


def trainer(release: str) -> str:
    with zipfile.ZipFile(wheel("speculators", release)) as z:
        return z.read(TRAINER).decode()


# --- String pairs (tests/codemods.py) ------------------------------------------------------

TRAINER_CLASS = """\
class Trainer:
    def __init__(self, model, config, train_loader, val_loader=None):
        self.model = model
        self.train_loader = train_loader
        self.setup_trainer()
        self.setup_model()

    def setup_trainer(self):
        self.current_epoch = 0
"""
RECORDING = TRAINER_CLASS.replace(
    "        self.setup_trainer()\n", "        self.record_aux_hidden_state_layers()\n        self.setup_trainer()\n"
).replace("    def setup_trainer(self):", textwrap.indent(PATCH_METHOD, "    ") + "\n    def setup_trainer(self):")

REWRITES = [
    pytest.param("SP035", TRAINER_CLASS, RECORDING, id="SP035 the call before setup_trainer, the method above it")
]
NOOPS = [pytest.param("SP035", RECORDING, id="SP035 already records the data's layers")]
REFUSALS = [
    pytest.param(
        "SP035",
        TRAINER_CLASS.replace("self.setup_trainer()", "self.setup_trainer(resume=True)"),
        "one 'self.setup_trainer()' in Trainer.__init__",
        id="SP035 setup_trainer called with arguments",
    ),
    pytest.param(
        "SP035",
        RECORDING.replace("[i + 1 for i in captured[:-1]]", "list(captured[:-1])"),
        "Trainer.record_aux_hidden_state_layers as SP035 writes it, called once from __init__",
        id="SP035 the method edited by hand",
    ),
]


test_record_aux_layers = rewrite_test(REWRITES)


test_record_aux_layers_noop = noop_test(NOOPS)


test_record_aux_layers_refuses_unknown_code = refusal_test(REFUSALS)


@pytest.mark.parametrize("release", ["0.3.0", "0.4.0", "0.4.0.1"])
def test_rewrite_then_no_op(release):
    verdict, new, detail = run(trainer(release))
    assert verdict == "changed", detail
    init = new[new.index("    def __init__(") : new.index("    def setup_trainer(")]
    assert init.index("self.record_aux_hidden_state_layers()") < init.index("self.setup_trainer()")
    assert init.index("    def record_aux_hidden_state_layers(self):") > init.index("self.setup_optimizer()")
    compile(new, TRAINER, "exec")
    assert run(new)[:2] == ("satisfied", new)


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (
            lambda s: s.replace("        self.setup_trainer()\n", "        self.setup_trainer(resume=True)\n", 1),
            "one 'self.setup_trainer()' in Trainer.__init__",
        ),
        (
            lambda s: s.replace(
                "    def setup_trainer(self):",
                "    def record_aux_hidden_state_layers(self):\n        pass\n\n    def setup_trainer(self):",
            ),
            "no record_aux_hidden_state_layers in class Trainer without its call in __init__",
        ),
    ],
    ids=["setup call changed", "a method of that name, not called"],
)
def test_refuses_unknown_code(edit, expected):
    verdict, _, detail = run(edit(trainer("0.3.0")))
    assert verdict == "refused" and detail.endswith(f"unrecognised code, expected {expected}"), detail


def test_refuses_a_hand_edited_method():
    patched = run(trainer("0.3.0"))[1]
    edited = patched.replace("[i + 1 for i in captured[:-1]]", "list(captured[:-1])")
    verdict, _, detail = run(edited)
    assert verdict == "refused"
    assert detail.endswith(
        "expected Trainer.record_aux_hidden_state_layers as SP035 writes it, called once from __init__"
    )


# --- The emitted method, run from the patched file on plain objects ---------------------------


@pytest.fixture(scope="module")
def record():
    """``Trainer.record_aux_hidden_state_layers`` as the patched 0.3.0 file defines it."""
    tree = ast.parse(run(trainer("0.3.0"))[1])
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Trainer")
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "record_aux_hidden_state_layers")
    scope: dict = {}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), TRAINER, "exec"), scope)
    return scope["record_aux_hidden_state_layers"]


def trainer_on(files, recorded=None):
    config = SimpleNamespace(eagle_aux_hidden_state_layer_ids=recorded)
    return SimpleNamespace(
        model=SimpleNamespace(config=config), train_loader=SimpleNamespace(dataset=SimpleNamespace(data=files))
    )


def data_dir(root: Path, layer_ids, n: int = 2) -> list[str]:
    """A generator's output directory: ``n`` sample files and its data_config.json."""
    root.mkdir(parents=True)
    (root / "data_config.json").write_text(json.dumps({"hidden_states": {"layer_ids": layer_ids}}))
    return [str(root / f"data_{i}.pt") for i in range(n)]


@pytest.mark.parametrize(
    ("layer_ids", "ids"),
    [([2, 16, 29, 31], [3, 17, 30]), ([31, 10, 2, 20], [3, 11, 21]), ([1, 3, 6, 7], [2, 4, 7])],
    ids=["32-layer default", "picked, unsorted", "8 layers picked"],
)
def test_records_the_datas_layers_in_vllm_numbering(record, tmp_path, layer_ids, ids):
    """The generator captures in layer order; the last is the verifier's last state."""
    t = trainer_on(data_dir(tmp_path / "data", layer_ids))
    record(t)
    assert t.model.config.eagle_aux_hidden_state_layer_ids == ids


def test_keeps_matching_ids_and_refuses_others(record, tmp_path):
    files = data_dir(tmp_path / "data", [2, 4, 5, 7])
    same = trainer_on(files, recorded=[5, 3, 6])
    record(same)
    assert same.model.config.eagle_aux_hidden_state_layer_ids == [5, 3, 6]
    with pytest.raises(ValueError, match=r"names auxiliary layers \[2, 4, 5\] .* holds \[3, 5, 6\]"):
        record(trainer_on(files, recorded=[2, 4, 5]))  # the generator's numbering, one layer off


def test_refuses_data_of_different_layers_and_a_damaged_data_config(record, tmp_path):
    mixed = data_dir(tmp_path / "a", [2, 4, 5, 7]) + data_dir(tmp_path / "b", [1, 4, 5, 7])
    with pytest.raises(ValueError, match="hidden states of different layers"):
        record(trainer_on(mixed))
    files = data_dir(tmp_path / "c", [2, 4, 5, 7])
    (tmp_path / "c" / "data_config.json").write_text('{"hidden_states": {}}')
    with pytest.raises(ValueError, match=r"data_config.json: no hidden_states.layer_ids"):
        record(trainer_on(files))


def test_without_a_data_config_warns_and_changes_nothing(record, tmp_path, caplog):
    (tmp_path / "data").mkdir()
    t = trainer_on([str(tmp_path / "data" / "data_0.pt")])
    with caplog.at_level(logging.WARNING, logger="speculators"):
        record(t)
    assert t.model.config.eagle_aux_hidden_state_layer_ids is None
    assert "no data_config.json beside the training data" in caplog.text
    other = SimpleNamespace(model=SimpleNamespace(config=SimpleNamespace()), train_loader=None)
    record(other)  # a draft without auxiliary layers (not EAGLE-3): nothing to record
    assert vars(other.model.config) == {}
