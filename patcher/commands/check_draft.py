"""``check-draft``, as data: will the installed vLLM serve a saved EAGLE-3 draft as it was trained?

The agent reads the draft's ``config.json`` (speculators' format) and its weights' headers, the
verifier's ``config.json``, optionally the training data's ``data_config.json``, and vLLM's own
files (``agent.draft``): one exchange, and one more for the verifier's model module (its name
comes from vLLM's registry and the verifier's architecture). The rules are
``patcher.checks.draft_serving``; what vLLM does is read from its source
(``patcher.fixes.vllm_eagle3``). Needs no speculators on the target: a serving box has vLLM only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from patcher.checks.draft_serving import OK, PROBLEM, UNKNOWN, Check, Draft, all_checks
from patcher.errors import UserError
from patcher.fixes import vllm_eagle3 as e3
from patcher.fixes.library_source import LibrarySource

if TYPE_CHECKING:
    from patcher.connect.transport import Transport

FIRST_READ = (e3.SPECULATORS_ALGOS, e3.REGISTRY, e3.INTERFACES, e3.LLAMA)


@dataclass
class DraftChecked:
    """Every check of one draft (``checks``), what vLLM will serve it (``served``: method,
    architecture, auxiliary layers and where they come from, the data's layers), the vLLM
    release read and the target's interpreter."""

    draft: str
    vllm: str
    python: str
    checks: list[Check]
    served: dict = field(default_factory=dict)

    def names(self, verdict: str) -> list[str]:
        return [c.name for c in self.checks if c.verdict == verdict]

    @property
    def exit_code(self) -> int:
        """1 when a check found that vLLM would not serve the draft as it was trained, 3 when
        none did but one could not be made (the verifier not on this machine), else 0: as
        ``verify`` (1: a disagreement; 3: not everything proven)."""
        return 1 if self.names(PROBLEM) else 3 if self.names(UNKNOWN) else 0

    @property
    def summary(self) -> str:
        """The verdict in one line."""
        problems, unknown = self.names(PROBLEM), self.names(UNKNOWN)
        if problems:
            return (
                f"check-draft: PROBLEM: vLLM {self.vllm} would not serve {self.draft} as it was trained "
                f"({', '.join(problems)})"
            )
        if unknown:
            return f"check-draft: INCOMPLETE: nothing wrong found; not checked: {', '.join(unknown)}"
        layers = ", ".join(map(str, self.served.get("aux_layers") or []))
        trained = "the data's" if self.served.get("trained_on") else "its config's"
        return (
            f"check-draft: OK: vLLM {self.vllm} serves {self.draft} as {self.served.get('method')} "
            f"({self.served.get('architecture')}) on the verifier's layers {layers} ({trained})"
        )

    @property
    def outcome(self) -> tuple[str, str]:
        """This host's (outcome, reason) in a run over several hosts, in ``verify``'s words:
        ``disagrees`` (a problem: the checks that found one), ``unproven`` (the checks not made)
        or ``ok``."""
        if self.names(PROBLEM):
            return "disagrees", f"not served as trained: {', '.join(self.names(PROBLEM))}"
        if self.names(UNKNOWN):
            return "unproven", f"not checked: {', '.join(self.names(UNKNOWN))}"
        return OK, ""

    @property
    def data(self) -> dict:
        """``check-draft --json``."""
        return {
            "draft": self.draft,
            "vllm": self.vllm,
            "python": self.python,
            "checks": [vars(c) for c in self.checks],
            "served": self.served,
            "summary": self.summary,
        }


def check_draft(
    transport: Transport, draft: str, data_config: str | None = None, verifier: str | None = None
) -> DraftChecked:
    """``check-draft`` of the draft directory ``draft`` on the target behind ``transport``
    (already entered); ``data_config``: the training data's ``data_config.json`` (or its
    directory), ``verifier``: the verifier to check against in place of the one the draft names.
    Raises ``UserError`` (one line, exit 2) on bad input: a path missing, a config that is not
    JSON or not a speculators draft, no vLLM on the target."""
    answer = transport.request(
        "draft", draft=draft, data_config=data_config, verifier=verifier, vllm_files=list(FIRST_READ)
    )
    d = parse(answer)
    d = _with_verifier_modules(transport, d, answer)
    checks, served = all_checks(d)
    return DraftChecked(d.path, d.vllm.version, answer.get("python") or "", checks, served)


def _json(text: str, path: str, what: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError as e:
        raise UserError(f"{path}: {what} is not JSON ({e})") from None
    if not isinstance(value, dict):
        raise UserError(f"{path}: {what} is not a JSON object")
    return value


def parse(answer: dict) -> Draft:
    """The agent's ``draft`` answer as a ``Draft``. Raises ``UserError`` on bad input."""
    if answer.get("vllm") is None:
        raise UserError(
            f"no vLLM installed for {answer.get('python')}: check-draft reads how the installed vLLM serves a "
            "draft; point --target at the environment that serves it"
        )
    found = answer["draft"]
    where = f"{found['path']}/config.json"
    config = _json(found["config"], where, "the draft's config")
    if not isinstance(config.get("speculators_model_type"), str) or not isinstance(
        config.get("speculators_config"), dict
    ):
        raise UserError(
            f"{where}: not a speculators draft (no speculators_model_type and speculators_config: "
            "a checkpoint directory of speculators' trainer has both)"
        )
    if not isinstance(config.get("transformer_layer_config"), dict):
        raise UserError(f"{where}: no transformer_layer_config (vLLM refuses such a draft)")
    tensors, errors = {}, {}
    for name, header in found["weights"].items():
        if "error" in header:
            errors[name] = header["error"]
        else:
            tensors.update(header["tensors"])
    return Draft(
        path=found["path"],
        config=config,
        tensors=tensors,
        weight_errors=errors,
        verifier=answer.get("verifier"),
        verifier_config=_verifier_config(answer.get("verifier")),
        data_layers=_data_layers(answer.get("data_config")),
        data_path=(answer.get("data_config") or {}).get("path"),
        vllm=_source(answer["vllm"]),
    )


def _verifier_config(found: dict | None) -> dict | None:
    """The verifier's config (its ``text_config`` for a model that wraps a text model), or None
    when it was not read or is not a JSON object (the verifier check says so)."""
    if not found or found.get("config") is None:
        return None
    try:
        config = json.loads(found["config"])
    except ValueError as e:
        found["error"] = f"{found['path']}/config.json is not JSON ({e})"
        return None
    if not isinstance(config, dict):
        return None
    text = config.get("text_config")
    if isinstance(text, dict) and "num_hidden_layers" not in config:
        return {**text, "architectures": config.get("architectures")}
    return config


def _data_layers(found: dict | None) -> list[int] | None:
    """The generator's ``layer_ids`` from a ``data_config.json`` (``hidden_states.layer_ids``)."""
    if not found:
        return None
    config = _json(found["text"], found["path"], "the training data's config")
    layers = (
        (config.get("hidden_states") or {}).get("layer_ids") if isinstance(config.get("hidden_states"), dict) else None
    )
    if not (isinstance(layers, list) and len(layers) >= 2 and all(isinstance(i, int) and i >= 0 for i in layers)):
        raise UserError(f"{found['path']}: no hidden_states.layer_ids (speculators' data_config.json names the layers)")
    return layers


def _source(vllm: dict) -> LibrarySource:
    files = {p: None if t is None else t.encode() for p, t in vllm["files"].items()}
    return LibrarySource(files, ", ".join(vllm["versions"]) or "unknown")


def _with_verifier_modules(transport: Transport, d: Draft, answer: dict) -> Draft:
    """``d`` with the verifier's model module read (``vllm/model_executor/models/<module>.py``
    from vLLM's registry), and the model modules it imports when it takes no auxiliary hidden
    states itself (Qwen3's model is Qwen2's): one or two more exchanges."""
    archs = (d.verifier_config or {}).get("architectures") or []
    found = next((m for m in (e3.model_module(d.vllm, a) for a in archs if isinstance(a, str)) if m), None)
    if found is None:
        return d
    modules = [found[0]]
    files = dict(d.vllm.files)
    if found[0] not in files:
        more = transport.request("draft", vllm_files=modules)["vllm"]["files"]
        files.update({p: None if t is None else t.encode() for p, t in more.items()})
    src = LibrarySource(files, d.vllm.version)
    if e3.aux_capture(src, modules[0]).numbering == "none":
        siblings = [m for m in e3.sibling_imports(src, modules[0]) if m not in files]
        if siblings:
            more = transport.request("draft", vllm_files=siblings)["vllm"]["files"]
            files.update({p: None if t is None else t.encode() for p, t in more.items()})
        modules += [m for m in e3.sibling_imports(src, modules[0]) if files.get(m) is not None]
        src = LibrarySource(files, d.vllm.version)
    d.vllm, d.verifier_modules = src, tuple(modules)
    return d


__all__ = ["OK", "PROBLEM", "UNKNOWN", "DraftChecked", "check_draft"]
