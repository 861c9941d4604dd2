"""The call-site check for speculators' training half: its calls into transformers and torch.

speculators trains its EAGLE-3 draft with its own code (``speculators/train/``,
``speculators/models/eagle3/``, ``speculators/config.py``,
``speculators/data_generation/preprocessing.py`` and the speculators modules their imports
run), which calls transformers (``LlamaDecoderLayer``, ``DynamicCache``, ``AutoConfig``,
``PreTrainedModel``...) and torch (``create_block_mask``, ``torch.distributed``, FSDP's
``fully_shard``...). A newer library can remove a name or a parameter those calls use; the
trainer then dies only when it reaches the call. This module checks those calls as
``patcher.checks.callsite`` checks the data-generation modules' calls into vLLM, with the same
resolver (``callsite.Index``, over transformers' and torch's files together, so that a
transformers layer's ``torch.nn.Module`` base resolves) and the same argument check
(``callsite.check_call``). Nothing is imported; torch's compiled half (``torch._C``) has no
source, and a name found only there is not checked (neither reported nor counted; an
import from a module that star-imports a module without source is not a finding).

Checked, each with the speculators ``file:line`` and the callee's ``file:line``:

- ``missing-import``: ``from transformers.X import Y`` (anywhere in a module, functions
  included) where the installed library defines no ``Y`` there; not one in a ``try`` whose
  handler catches ImportError (the module has a fallback: the mask builder of
  patches/sp014_attention_mask_import.py);
- a call of an imported name, ``Name(...)``; of a method on an imported class,
  ``AutoConfig.from_pretrained(...)`` (``missing-method`` when neither the class nor its
  bases define it and none of its bases lies outside the files read); of a function through
  an imported module, ``dist.barrier(...)``, ``torch.nn.functional.pad(...)``; and
  ``super().__init__(...)`` in a speculators class whose first base is a library class
  (``LlamaDecoderEagle3FirstLayer(LlamaDecoderLayer)``): ``unknown-keyword``,
  ``too-many-positional``, ``missing-argument`` as for vLLM.

The files come from the ``sources`` exchange's ``libraries`` part
(``patcher.agent.sources.libraries``): only the modules the training files import, followed
as far as the resolver needs (re-exports, star imports, bases), never the whole library.
"""

from __future__ import annotations

import ast
import base64
from dataclasses import dataclass, field
from typing import Mapping

from patcher.agent.pysource import catches_import_error, dotted_parts, module_aliases
from patcher.checks.callsite import (
    Checked,
    Finding,
    Index,
    SpecModule,
    Symbol,
    callee_signature,
    check_call,
    function_signature,
    guarded_calls,
    resolve_imports,
    vllm_imports,
)

LIBRARIES = ("transformers", "torch")
# The training half: every module of these packages (``.*``) and these modules, then what
# their imports run inside speculators (``patcher.agent.pysource.walk_import_path``).
START = (
    "speculators.train.*",
    "speculators.models.eagle3.*",
    "speculators.config",
    "speculators.data_generation.preprocessing",
)
# At most this many library paths are read (transformers 4.57.6 with torch 2.13: about 265,
# 171 of them files, the others candidates that do not exist).
LIMIT = 1200


def request() -> dict:
    """The ``libraries`` part of verify's ``sources`` request."""
    return {"start": list(START), "packages": list(LIBRARIES), "limit": LIMIT}


@dataclass
class LibraryCalls:
    """What the check found: ``versions`` {library: installed version, None when it is not
    installed}; ``checked`` the calls and imports evaluated; ``findings`` the ones that do not fit."""

    versions: dict[str, str | None]
    checked: list[Checked] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)

    def count(self, library: str) -> int:
        return sum(library_of(c.target[0]) == library for c in self.checked)


def library_of(module: str) -> str:
    """``transformers``/``torch`` for a module of theirs, else ``vLLM``."""
    top = module.split(".")[0]
    return top if top in LIBRARIES else "vLLM"


def decode(answer: dict) -> tuple[dict[str, bytes], dict[str, bytes | None]]:
    """(speculators files, library files) of a ``sources`` answer's ``libraries`` part."""

    def unb64(files: dict) -> dict[str, bytes | None]:
        return {k: None if v is None else base64.b64decode(v) for k, v in files.items()}

    part = answer.get("libraries") or {"speculators": {}, "packages": {}}
    return unb64(part["speculators"]), unb64(part["packages"])


def versions(answer: dict) -> dict[str, str | None]:
    """{library: its installed version(s), joined; None when not installed} of a ``sources``
    answer (``library_versions``, sent with ``unchanged`` answers too)."""
    found = answer.get("library_versions") or {}
    return {
        lib: None if found.get(lib) is None else (", ".join(found[lib]) or "unknown")
        for lib in LIBRARIES
        if lib in found
    }


def check(
    speculators: Mapping[str, bytes | None],
    files: Mapping[str, bytes | None],
    record: list[Checked] | None = None,
    index: Index | None = None,
    installed: tuple[str, ...] | None = None,
) -> list[Finding]:
    """Every call from the training-side ``speculators`` modules (path -> source) into
    transformers and torch (``files``: path -> source, both libraries) that does not fit.
    ``record`` receives every call and import evaluated; ``installed``: the libraries the
    target has (default both): names of one it lacks are not checked (an environment without
    torch cannot train; the import-path check and ``verify``'s title say so)."""
    index = index if index is not None else Index(files, LIBRARIES)
    record = record if record is not None else []
    installed = tuple(installed) if installed is not None else LIBRARIES
    findings: list[Finding] = []
    for path, data in sorted(speculators.items()):
        if data is None:
            continue
        try:
            tree = ast.parse(data, filename=path)
        except SyntaxError:
            continue  # the patch check reports a file that does not parse
        mod = SpecModule(path, tree, vllm_imports(tree, index, installed))
        findings += _check_module(index, mod, module_aliases(tree, installed), record)
    return sorted(set(findings), key=lambda f: (f.file, f.line, f.kind, f.detail))


def _check_module(index: Index, mod: SpecModule, aliases: dict[str, str], record: list[Checked]) -> list[Finding]:
    findings, symbols = resolve_imports(index, mod, record, library_of)
    # an import with a fallback (``try: ... except ImportError:``, e.g. the attention-mask patch's
    # own mask builder where transformers 5.24 removed modeling_attn_mask_utils) breaks nothing
    fallback = _guarded_imports(mod.tree)
    findings = [
        f
        for f in findings
        if not (f.kind == "missing-import" and ((f.line, f.subject) in fallback or _opaque(index, f.call.split()[1])))
    ]
    supers = _super_calls(mod.tree, symbols)
    for call, guards in guarded_calls(mod.tree):
        target = supers.get(id(call)) or _target(index, call.func, symbols, aliases)
        if target is None:
            continue
        label, sym, method, where = target
        library = library_of(sym.module)
        if method is None or method == "__init__":  # a call, or super().__init__(...): as Class(...) runs it
            sig = (
                callee_signature(index, sym, label.removesuffix("(...)")) if method is None else index.constructor(sym)
            )
            record.append(Checked(mod.path, call.lineno, label, (*where, method), call, sig))
            if sig is not None:
                fn = sym.node if isinstance(sym.node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None
                if sym.is_class:
                    fn = (index.method(sym, "__init__") or (None, None))[1]
                findings += _accepted(check_call(mod.path, call.lineno, label, call, sig, library), fn)
            continue
        found = index.method(sym, method)
        guarded = isinstance(call.func, ast.Attribute) and (ast.dump(call.func.value), method) in guards
        if found is None:
            dunder = method.startswith("__") and method.endswith("__")  # object has them
            if not guarded and not dunder and not index.mro(sym)[1] and not _dynamic(index, sym):
                record.append(Checked(mod.path, call.lineno, label, (*where, method), call))
                findings.append(
                    Finding(
                        "missing-method",
                        mod.path,
                        call.lineno,
                        label,
                        f"{sym.node.name} (and its bases) has no method {method}",
                        sym.file,
                        sym.node.lineno,
                        f"class {sym.node.name}",
                        subject=method,
                        library=library,
                    )
                )
            continue
        owner, fn = found
        sig = function_signature(fn, owner.file, f"{owner.node.name}.{fn.name}", method=not _static(fn))
        record.append(Checked(mod.path, call.lineno, label, (*where, method), call, sig))
        findings += _accepted(check_call(mod.path, call.lineno, label, call, sig, library), fn)
    return findings


def _accepted(findings: list[Finding], fn: ast.FunctionDef | ast.AsyncFunctionDef | None) -> list[Finding]:
    """``findings`` less the unknown keywords that ``fn``'s ``@deprecate_kwarg("old", ...)``
    decorators still take and rename (transformers/utils/deprecation.py ``deprecate_kwarg``,
    transformers 4.57.6; e.g. ``LlamaDecoderLayer.forward``'s ``past_key_value``)."""
    if fn is None:
        return findings
    renamed = {
        d.args[0].value
        for d in fn.decorator_list
        if isinstance(d, ast.Call)
        and (dotted_parts(d.func) or [""])[-1] == "deprecate_kwarg"
        and d.args
        and isinstance(d.args[0], ast.Constant)
        and isinstance(d.args[0].value, str)
    }
    return [f for f in findings if not (f.kind == "unknown-keyword" and f.subject in renamed)]


def _opaque(index: Index, module: str, depth: int = 0) -> bool:
    """Whether ``module`` star-imports, itself or through the modules it star-imports, a
    module with no source to read: torch/__init__.py's ``from torch._C import *`` (torch
    2.13.0) binds hundreds of names only the compiled extension knows, so a name not found
    there is not a finding."""
    mod = index.module(module) if module else None
    if mod is None or depth > 20:
        return False
    return any(index.module(s) is None or _opaque(index, s, depth + 1) for s in mod[4])


def _guarded_imports(tree: ast.Module) -> set[tuple[int, str]]:
    """(line, name) of every ``from ... import name`` in the body of a ``try`` whose handler
    catches ImportError: the module runs on without it. Such an import is the attention-mask
    patch's (patches/sp014_attention_mask_import.py) in speculators/models/eagle.py:
    transformers 5.24.0 has no transformers/modeling_attn_mask_utils.py
    (4.57.6 and 5.22.2 have it, with ``_prepare_4d_causal_attention_mask``)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(catches_import_error(h) for h in node.handlers):
            for stmt in node.body:
                for sub in ast.walk(stmt):
                    if isinstance(sub, ast.ImportFrom):
                        found.update((sub.lineno, a.name) for a in sub.names)
    return found


def _static(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in fn.decorator_list)


def _dynamic(index: Index, sym: Symbol) -> bool:
    """A class whose attributes may come from ``__getattr__`` (or a metaclass): a method
    the source does not define is then not a finding."""
    classes, _ = index.mro(sym)
    return any(
        isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name in ("__getattr__", "__getattribute__")
        for c in classes
        for n in c.node.body
    ) or any(k.arg == "metaclass" for c in classes for k in c.node.keywords)


def _target(
    index: Index, func: ast.AST, symbols: dict[str, Symbol], aliases: dict[str, str]
) -> tuple[str, Symbol, str | None, tuple[str, str]] | None:
    """What a call's callee is in the libraries: (label, symbol, method or None, (module,
    name) as speculators names it), or None when it is not theirs or cannot be followed."""
    parts = dotted_parts(func)
    if not parts:
        return None
    label = ".".join(parts) + "(...)"
    head, rest = parts[0], parts[1:]
    if head in symbols and isinstance(symbols[head].node, ast.Module):  # ``from torch import nn``
        aliases = {head: symbols[head].module}
    elif head in symbols:
        sym = symbols[head]
        where = (sym.module, sym.node.name if hasattr(sym.node, "name") else head)
        if not rest:
            return label, sym, None, where
        if len(rest) == 1 and sym.is_class:
            return label, sym, rest[0], where
        return None
    if head not in aliases or not rest:
        return None
    path = aliases[head].split(".") + rest
    # the longest prefix that is a module read from source, then one name in it, then at
    # most one method of a class
    for cut in range(len(path) - 1, 0, -1):
        module = ".".join(path[:cut])
        if index.module(module) is None:
            continue
        sym = index.resolve(module, path[cut])
        tail = path[cut + 1 :]
        if sym is None or isinstance(sym.node, ast.Module):
            return None
        if not tail:
            return label, sym, None, (module, path[cut])
        if len(tail) == 1 and sym.is_class:
            return label, sym, tail[0], (module, path[cut])
        return None
    return None


def _super_calls(tree: ast.Module, symbols: dict[str, Symbol]) -> dict[int, tuple[str, Symbol, str, tuple[str, str]]]:
    """``super().name(...)`` inside the methods of a class whose first base is an imported
    library class: {id(call): (label, that base, name, (module, class))}."""
    found = {}
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        base = cls.bases[0] if cls.bases else None
        sym = symbols.get(base.id) if isinstance(base, ast.Name) else None
        if sym is None or not sym.is_class:
            continue
        for fn in cls.body:
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Call)
                    and isinstance(node.func.value.func, ast.Name)
                    and node.func.value.func.id == "super"
                    and not node.func.value.args
                ):
                    label = f"super().{node.func.attr}(...)"
                    found[id(node)] = (label, sym, node.func.attr, (sym.module, sym.node.name))
    return found
