"""``check-draft``'s rules: how the installed vLLM will serve a saved speculators EAGLE-3 draft,
each rule one ``Check`` with its evidence (vLLM's ``file:line``, or the file it read).

vLLM's side is read from its source (``patcher.fixes.vllm_eagle3``); the draft's from speculators'
checkpoint format (speculators 0.3.0-0.4.x ``Eagle3SpeculatorConfig`` and ``Eagle3DraftModel``:
``fc.weight`` of shape [hidden, aux layers x target hidden], ``d2t`` [draft vocabulary], ``t2d``
[verifier vocabulary], ``lm_head.weight`` [draft vocabulary, hidden]). Layer numbers: speculators'
generator stores the output of decoder layer ``i`` (``data_config.json``'s
``hidden_states.layer_ids``; the last one is the verifier's last hidden state, the others the
draft's input); vLLM's auxiliary layer ``i`` is the state entering layer ``i``: ``i + 1``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from patcher.fixes import vllm_eagle3 as e3
from patcher.fixes.library_source import LibrarySource

OK, PROBLEM, UNKNOWN = "ok", "problem", "unknown"
FC = "fc.weight"
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass
class Check:
    """One row: ``name``, ``verdict`` (``ok``, ``problem``, ``unknown``: could not be checked),
    ``detail`` (what was found, in words) and ``evidence`` (``file:line`` in vLLM, or the file read)."""

    name: str
    verdict: str
    detail: str
    evidence: str = ""


@dataclass
class Draft:
    """What the agent read, parsed. ``config``: the draft's config.json; ``tensors``: name ->
    {"dtype", "shape"} from its safetensors headers (``weight_errors``: file -> what is wrong
    with one); ``verifier``: the agent's record (name, path, is_dir, error) and
    ``verifier_config`` its config.json (its ``text_config`` for a multimodal model; None when
    not read); ``data_layers``: the generator's ``layer_ids`` from ``data_path`` (None without
    ``--data-config``); ``vllm``: vLLM's files read so far; ``verifier_modules``: the model module
    of the verifier's architecture and those it builds on (read in a second exchange)."""

    path: str
    config: dict
    tensors: dict
    weight_errors: dict
    verifier: dict | None
    verifier_config: dict | None
    data_layers: list[int] | None
    data_path: str | None
    vllm: LibrarySource
    verifier_modules: tuple[str, ...] = ()


def vllm_ids(generator_layers: list[int]) -> list[int]:
    """The auxiliary layers, in vLLM's numbering, of data captured at ``generator_layers``
    (speculators' numbering): captured in layer order, the last is the verifier's last hidden
    state, each other is vLLM's ``i + 1``."""
    return [i + 1 for i in sorted(set(generator_layers))[:-1]]


def _where(path: str, line: int | None) -> str:
    return f"{path}:{line}" if line else path


def layer_count(config: dict | None) -> int | None:
    value = (config or {}).get("num_hidden_layers")
    return value if isinstance(value, int) and value > 0 else None


def weights(d: Draft) -> Check:
    """The draft's weights: safetensors files whose headers read, holding tensors."""
    if d.weight_errors:
        bad = "; ".join(f"{name}: {why}" for name, why in d.weight_errors.items())
        return Check("weights", PROBLEM, f"vLLM cannot load {bad}", d.path)
    if not d.tensors:
        return Check("weights", PROBLEM, "no *.safetensors with tensors beside config.json", d.path)
    return Check("weights", OK, f"{len(d.tensors)} tensors", d.path)


def method(d: Draft) -> tuple[Check, e3.SpeculatorsMethod | None]:
    """The method vLLM serves a draft of this ``speculators_model_type`` with."""
    kind = d.config.get("speculators_model_type")
    methods = e3.speculators_methods(d.vllm)
    found = methods.get(kind)
    if found is None:
        known = ", ".join(sorted(methods)) or "none"
        return Check(
            "method", PROBLEM, f"speculators_model_type {kind!r}: this vLLM reads {known}", e3.SPECULATORS_ALGOS
        ), None
    return Check("method", OK, f"{kind}", _where(e3.SPECULATORS_ALGOS, found.line)), found


def architecture(d: Draft, found: e3.SpeculatorsMethod | None) -> Check:
    """The draft architecture vLLM builds for the layer config's ``model_type``."""
    if found is None:
        return Check("architecture", UNKNOWN, "no method vLLM serves the draft with", e3.SPECULATORS_ALGOS)
    layer = d.config.get("transformer_layer_config") or {}
    model_type = layer.get("model_type") or found.default_model_type
    arch = found.architectures.get(model_type) or found.architectures.get("")
    where = _where(e3.SPECULATORS_ALGOS, found.architecture_line)
    if not arch:
        known = ", ".join(sorted(found.architectures)) or "none"
        return Check(
            "architecture",
            PROBLEM,
            f"layer model_type {model_type!r}: vLLM builds {found.name} drafts for {known}",
            where,
        )
    return Check("architecture", OK, f"{arch} (layer model_type {model_type})", where)


def verifier(d: Draft) -> Check:
    """The verifier the draft names (or ``--verifier``): its config read, an architecture vLLM loads."""
    v = d.verifier
    if v is None:
        return Check(
            "verifier", PROBLEM, "the draft names no verifier (speculators_config.verifier.name_or_path)", "config.json"
        )
    if not v["is_dir"]:
        if HUB_ID.match(v["name"]):
            detail = f"{v['name']}: a hub id, not a directory here: its depth, sizes and vocabulary not read; pass --verifier DIR"
            return Check("verifier", UNKNOWN, detail, "")
        return Check("verifier", PROBLEM, f"{v['name']}: no such directory", v["path"])
    if d.verifier_config is None:
        return Check("verifier", PROBLEM, v.get("error") or f"{v['path']}: its config.json does not read", v["path"])
    c = d.verifier_config
    arch = ", ".join(c.get("architectures") or ["no architectures"])
    if not d.verifier_modules:
        return Check("verifier", PROBLEM, f"{arch}: not an architecture this vLLM loads", e3.REGISTRY)
    return Check(
        "verifier",
        OK,
        f"{v['path']}: {arch}, {layer_count(c)} layers, hidden {c.get('hidden_size')}, vocabulary {c.get('vocab_size')}",
        f"{v['path']}/config.json",
    )


def capture_of(d: Draft) -> e3.AuxCapture:
    """How vLLM takes auxiliary states from this verifier: the first of its model modules that
    takes any (a model that only subclasses another takes them there); llama.py, EAGLE-3's
    reference, when the verifier is unknown."""
    first = None
    for path in d.verifier_modules or (e3.LLAMA,):
        found = e3.aux_capture(d.vllm, path)
        first = first or found
        if found.numbering != "none":
            return found
    return first


def _shape(d: Draft, name: str) -> list | None:
    shape = (d.tensors.get(name) or {}).get("shape")
    return shape if isinstance(shape, list) and all(isinstance(x, int) for x in shape) else None


def _layers(ids) -> str:
    return ", ".join(map(str, ids))


def _outputs(ids) -> str:
    """vLLM layer ids as the speculators layers whose output they are."""
    return _layers(i - 1 for i in ids)


@dataclass
class Layers:
    """What decides the auxiliary layers: the verifier's depth ``n`` (None: unknown), vLLM's
    capture and defaults, whether vLLM passes the draft's ids on, the ids the draft records, the
    layers its data holds in vLLM's numbering (None: not given)."""

    n: int | None
    capture: e3.AuxCapture
    defaults: e3.DefaultLayers | None
    passes: bool
    recorded: object
    trained: list[int] | None

    @property
    def default_ids(self) -> list[int] | None:
        found = self.defaults.for_depth(self.n) if self.defaults and self.n else None
        return list(found) if found else None

    @property
    def default_text(self) -> str:
        if self.default_ids:
            return f"({_layers(self.default_ids)})"
        return self.defaults.expression if self.defaults else "(none found)"


def aux_layers(d: Draft, found: e3.SpeculatorsMethod | None) -> tuple[Check, dict]:
    """The hidden states vLLM will hand the draft against those its data holds. Returns the
    check and what vLLM serves (``{"aux_layers": [...], "from": ...}``)."""
    modules = d.verifier_modules or (e3.LLAMA,)
    g = Layers(
        layer_count(d.verifier_config),
        capture_of(d),
        e3.default_layers(d.vllm, modules),
        found is not None and found.aux_ids_line is not None,
        d.config.get("eagle_aux_hidden_state_layer_ids"),
        vllm_ids(d.data_layers) if d.data_layers else None,
    )
    if g.capture.numbering == "none":
        arch = ", ".join((d.verifier_config or {}).get("architectures") or ["this verifier"])
        detail = (
            f"vLLM's {g.capture.file.rsplit('/', 1)[-1]} hands no auxiliary hidden states: no EAGLE-3 draft on {arch}"
        )
        return Check("auxiliary layers", PROBLEM, detail, g.capture.file), {}
    if g.capture.numbering != "input":
        detail = f"vLLM numbers auxiliary layers here by {g.capture.numbering}: not what this check knows"
        return Check("auxiliary layers", UNKNOWN, detail, _where(g.capture.file, g.capture.line)), {}
    if not g.recorded:
        return _unrecorded(g)
    return _recorded(d, g, found)


def _unrecorded(g: Layers) -> tuple[Check, dict]:
    """No ``eagle_aux_hidden_state_layer_ids``: vLLM serves its defaults."""
    served = {"aux_layers": g.default_ids, "from": "vLLM's defaults"}
    where = _where(g.defaults.file, g.defaults.line) if g.defaults else e3.INTERFACES
    said = f"no eagle_aux_hidden_state_layer_ids: vLLM serves its defaults {g.default_text}, the states entering those layers"
    if g.trained is not None:
        if g.default_ids == g.trained:
            return Check("auxiliary layers", OK, f"{said}: the data's layers", where), served
        detail = (
            f"{said}; the data holds the outputs of layers {_outputs(g.trained)}, vLLM's "
            f"{_layers(g.trained)}: set eagle_aux_hidden_state_layer_ids to [{_layers(g.trained)}] in config.json"
        )
        return Check("auxiliary layers", PROBLEM, detail, where), served
    generator = [2, g.n // 2, g.n - 3] if g.n else None
    their = f"({_layers(generator)}), vLLM's ({_layers(i + 1 for i in generator)})" if generator else "(2, n/2, n-3)"
    detail = (
        f"{said}; speculators' generator stores layer outputs, by default of layers {their}: one layer off. "
        f"Trained before `speculators-patch apply`? Set eagle_aux_hidden_state_layer_ids to the data's "
        f"layers + 1 (--data-config DATA_DIR says which)"
    )
    return Check("auxiliary layers", PROBLEM, detail, where), served


def _recorded(d: Draft, g: Layers, found: e3.SpeculatorsMethod | None) -> tuple[Check, dict]:
    """The draft's config names its auxiliary layers (vLLM's numbering)."""
    ids = g.recorded
    where = _where(g.capture.file, g.capture.line)
    if not (isinstance(ids, list) and all(isinstance(i, int) and i >= 0 for i in ids) and len(set(ids)) == len(ids)):
        return Check(
            "auxiliary layers",
            PROBLEM,
            f"eagle_aux_hidden_state_layer_ids {ids!r}: not distinct layer numbers",
            "config.json",
        ), {}
    ids = sorted(ids)  # vLLM hands them over in layer order, whatever the order named
    if not g.passes:
        served = {"aux_layers": g.default_ids, "from": "vLLM's defaults (the draft's ids are dropped)"}
        if g.default_ids == ids:
            return Check(
                "auxiliary layers", OK, f"vLLM's defaults {g.default_text}, the layers the draft names", where
            ), served
        detail = (
            f"this vLLM drops a speculators draft's eagle_aux_hidden_state_layer_ids (its {found.name if found else 'method'} "
            f"config takes none on) and serves its defaults {g.default_text}, not [{_layers(ids)}]"
        )
        return Check("auxiliary layers", PROBLEM, detail, e3.SPECULATORS_ALGOS), served
    served = {"aux_layers": ids, "from": "the draft's config"}
    problem = _fc_width(d, ids) or _beyond(g, ids)
    if problem:
        return Check("auxiliary layers", PROBLEM, problem, where), served
    if g.trained is None:
        detail = f"[{_layers(ids)}] (the draft's config): the outputs of layers {_outputs(ids)}; not compared with its data (--data-config)"
        return Check("auxiliary layers", OK, detail, where), served
    if ids == g.trained:
        return Check(
            "auxiliary layers", OK, f"[{_layers(ids)}]: the data's layers (outputs of {_outputs(ids)})", where
        ), served
    if ids == [t - 1 for t in g.trained]:
        detail = (
            f"[{_layers(ids)}] names the data's layers as speculators numbers them (outputs); vLLM hands the states "
            f"entering layers {_layers(ids)}, one layer off: set [{_layers(g.trained)}]"
        )
    else:
        detail = (
            f"[{_layers(ids)}], but the data holds vLLM's [{_layers(g.trained)}] (outputs of {_outputs(g.trained)})"
        )
    return Check("auxiliary layers", PROBLEM, detail, where), served


def _fc_width(d: Draft, ids: list[int]) -> str | None:
    """The draft's ``fc`` takes len(ids) hidden states of the target's width."""
    fc = _shape(d, FC)
    target = d.config.get("target_hidden_size") or (d.config.get("transformer_layer_config") or {}).get("hidden_size")
    if fc is None or len(fc) != 2 or not isinstance(target, int) or target <= 0:
        return None
    if fc[1] != len(ids) * target:
        return f"{FC} {fc} takes {fc[1] / target:g} hidden states of {target}, the config names {len(ids)}"
    return None


def _beyond(g: Layers, ids: list[int]) -> str | None:
    """Layers vLLM never hands over for a verifier of this depth."""
    if g.n is None:
        return None
    top = g.n if g.capture.final_state else g.n - 1
    bad = [i for i in ids if i > top]
    if not bad:
        return None
    after = f"; layer {g.n}, the state after the last one, from vLLM 0.18" if not g.capture.final_state else ""
    return f"layers {_layers(bad)}: vLLM hands layers 0-{top} of this {g.n}-layer verifier{after}"


def hidden_size(d: Draft) -> Check:
    """The verifier's width against the draft's ``target_hidden_size`` and its ``fc`` input."""
    layer = d.config.get("transformer_layer_config") or {}
    target = d.config.get("target_hidden_size") or layer.get("hidden_size")
    width = (d.verifier_config or {}).get("hidden_size")
    fc = _shape(d, FC)
    states = len(d.config.get("eagle_aux_hidden_state_layer_ids") or ()) or 3  # vLLM's count without ids
    said = f"target {target}, draft {layer.get('hidden_size')}" + (f", {FC} {fc}" if fc else "")
    if isinstance(width, int) and target != width:
        return Check("hidden size", PROBLEM, f"{said}; the verifier's hidden size is {width}", "config.json")
    if fc is not None and len(fc) == 2 and (fc[0] != layer.get("hidden_size") or fc[1] != states * (target or 0)):
        return Check(
            "hidden size",
            PROBLEM,
            f"{said}: {FC} should be [{layer.get('hidden_size')}, {states * (target or 0)}]",
            "config.json",
        )
    if width is None:
        return Check("hidden size", UNKNOWN, f"{said}; the verifier's not read", "config.json")
    return Check("hidden size", OK, f"{said} = the verifier's", "config.json")


def vocabulary(d: Draft) -> Check:
    """``d2t`` (draft -> verifier token offsets) of ``draft_vocab_size`` entries, ``t2d``,
    ``embed_tokens`` and the layer config of the verifier's vocabulary, ``lm_head`` of
    ``draft_vocab_size`` rows; vLLM
    (llama_eagle3.py) loads ``d2t`` where the two vocabularies differ and maps every draft token
    to the verifier's first ones without it."""
    draft_vocab = d.config.get("draft_vocab_size")
    vocab = (d.verifier_config or {}).get("vocab_size")
    layer_vocab = (d.config.get("transformer_layer_config") or {}).get("vocab_size")
    d2t, t2d, head = _shape(d, "d2t"), _shape(d, "t2d"), _shape(d, "lm_head.weight")
    embed = _shape(d, "embed_tokens.weight")
    said = f"draft_vocab_size {draft_vocab}, d2t {d2t}, t2d {t2d}, lm_head {head}"
    wrong = []
    if not isinstance(draft_vocab, int) or draft_vocab <= 0:
        wrong.append("no draft_vocab_size")
    if head is not None and head[0] != draft_vocab:
        wrong.append(f"lm_head has {head[0]} rows")
    if d2t is not None and d2t != [draft_vocab]:
        wrong.append(f"d2t has {d2t} entries")
    target = vocab if isinstance(vocab, int) else layer_vocab
    if t2d is not None and t2d != [target]:
        wrong.append(f"t2d {t2d} is not the verifier's {target} tokens")
    if embed is not None and embed[0] != target:
        wrong.append(f"embed_tokens has {embed[0]} rows, the verifier {target} tokens")
    if isinstance(vocab, int) and layer_vocab not in (None, vocab):
        wrong.append(f"transformer_layer_config.vocab_size {layer_vocab}, the verifier's {vocab}")
    if d2t is None and isinstance(draft_vocab, int) and draft_vocab != target:
        wrong.append(f"no d2t: vLLM cannot map {draft_vocab} draft tokens to the verifier's {target}")
    if wrong:
        return Check("vocabulary", PROBLEM, f"{said}: {'; '.join(wrong)}", d.path)
    if vocab is None:
        return Check("vocabulary", UNKNOWN, f"{said}; the verifier's vocabulary not read", d.path)
    return Check("vocabulary", OK, f"{said}; the verifier has {vocab} tokens", d.path)


def all_checks(d: Draft) -> tuple[list[Check], dict]:
    """Every rule, in the order the table shows them, and what vLLM will serve the draft."""
    found_method, served_by = method(d)
    layers, served = aux_layers(d, served_by)
    checks = [weights(d), found_method, architecture(d, served_by), verifier(d), layers, hidden_size(d), vocabulary(d)]
    arch = checks[2].detail.split(" ", 1)[0] if checks[2].verdict == OK else None
    trained = vllm_ids(d.data_layers) if d.data_layers else None
    return checks, {
        "method": served_by.name if served_by else None,
        "architecture": arch,
        **served,
        "trained_on": trained,
        "data_config": d.data_path,
    }
