"""Probe builders: each returns a function ``LibrarySource -> Evidence`` for one kind of fact.

Every probe reads the static source only and reports the line and the code it found, so
``verify`` can show its evidence (``file:line`` and the signature or field).
"""

from __future__ import annotations

import ast
import functools
import inspect
from typing import Callable

from patcher.fixes.library_source import Evidence, LibrarySource, parameter_names, required_parameters, signature

Probe = Callable[[LibrarySource], Evidence]


# The parameters of a probe builder that name a vLLM file the probe reads.
PATH_PARAMETERS = ("path", "moved_to", "old_path", "new_path")


def _recorded(builder: Callable[..., Probe]) -> Callable[..., Probe]:
    """Each probe remembers how it was built (``probe.recipe = (builder name, args,
    kwargs)``), so the patch list can be kept as data and its probes rebuilt without
    importing the codemods (``patcher.fixes.patch_index``), and which vLLM files it reads
    (``probe.modules``, from the builder's ``PATH_PARAMETERS``): a ``VllmFact`` takes its
    ``modules`` from there, so a fact names each file once."""
    parameters = inspect.signature(builder)

    @functools.wraps(builder)
    def build(*args, **kwargs) -> Probe:
        probe = builder(*args, **kwargs)
        probe.recipe = (builder.__name__, list(args), dict(kwargs))
        bound = parameters.bind(*args, **kwargs).arguments
        probe.modules = tuple(bound[n] for n in parameters.parameters if n in PATH_PARAMETERS and bound.get(n))
        return probe

    return build


def _missing(path: str, what: str) -> Evidence:
    """``what`` is absent, an answer to the question the probe asks (a feature not there)."""
    return Evidence(False, path, None, f"{what} not found")


def _gone(path: str, what: str) -> Evidence:
    """``what``, the symbol the fact is about, is not in this vLLM (``Evidence.missing``)."""
    return Evidence(False, path, None, f"{what} not found", missing=True)


def _class_field(src: LibrarySource, path: str, cls: str, name: str) -> ast.AnnAssign | Evidence:
    """Field ``name`` of class ``cls`` in ``path``, or the Evidence of its absence: the class
    gone (``Evidence.missing``), or the field not there (an ordinary answer)."""
    if src.find_class(path, cls) is None:
        return _gone(path, cls)
    field = src.class_fields(path, cls).get(name)
    return _missing(path, f"{cls}.{name}") if field is None else field


@_recorded
def init_field_required(path: str, cls: str, name: str) -> Probe:
    """Holds when dataclass ``cls`` declares ``name: InitVar[...]`` without a default."""

    def probe(src: LibrarySource) -> Evidence:
        field = _class_field(src, path, cls, name)
        if isinstance(field, Evidence):
            return field
        text = f"{cls}.{ast.unparse(field).strip()}"
        is_initvar = "InitVar" in ast.unparse(field.annotation)
        return Evidence(is_initvar and field.value is None, path, field.lineno, text)

    return probe


@_recorded
def field_defined(path: str, cls: str, name: str) -> Probe:
    """Holds when class ``cls`` declares the field ``name`` (evidence: its declaration)."""

    def probe(src: LibrarySource) -> Evidence:
        field = _class_field(src, path, cls, name)
        if isinstance(field, Evidence):
            return field
        return Evidence(True, path, field.lineno, f"{cls}.{ast.unparse(field).strip()}")

    return probe


@_recorded
def field_default(path: str, cls: str, name: str, value: str) -> Probe:
    """Holds when ``cls.name`` defaults to ``value`` (source text, e.g. ``True``)."""

    def probe(src: LibrarySource) -> Evidence:
        field = _class_field(src, path, cls, name)
        if isinstance(field, Evidence):
            return field
        found = ast.unparse(field.value) if field.value is not None else None
        return Evidence(found == value, path, field.lineno, f"{cls}.{ast.unparse(field).strip()}")

    return probe


@_recorded
def parameter_absent(path: str, qualname: str, param: str, moved_to: str | None = None) -> Probe:
    """Holds when function ``qualname`` exists and no longer takes ``param``. ``moved_to``:
    the module that defines ``qualname`` where ``path`` no longer does (both declared in the
    fact's modules)."""

    def probe(src: LibrarySource) -> Evidence:
        where, fn = path, src.find_function(path, qualname)
        if fn is None and moved_to is not None:
            where, fn = moved_to, src.find_function(moved_to, qualname)
        if fn is None:
            return _gone(path, qualname)
        return Evidence(param not in parameter_names(fn), where, fn.lineno, signature(fn, param))

    return probe


@_recorded
def parameter_required(path: str, qualname: str, param: str, optional: bool = False) -> Probe:
    """Holds when function ``qualname`` takes ``param`` without a default. ``optional``: the
    function itself is new in some releases (absent there: the fact does not hold, an
    ordinary answer); otherwise its absence is ``Evidence.missing``."""

    def probe(src: LibrarySource) -> Evidence:
        fn = src.find_function(path, qualname)
        if fn is None:
            return _missing(path, qualname) if optional else _gone(path, qualname)
        return Evidence(param in required_parameters(fn), path, fn.lineno, signature(fn, param))

    return probe


@_recorded
def method_defined(path: str, qualname: str, param: str | None = None) -> Probe:
    """Holds when ``qualname`` is defined (and, if given, takes ``param``)."""

    def probe(src: LibrarySource) -> Evidence:
        fn = src.find_function(path, qualname)
        if fn is None:
            return _missing(path, qualname)
        ok = param is None or param in parameter_names(fn)
        return Evidence(ok, path, fn.lineno, signature(fn, param))

    return probe


@_recorded
def returns_not_list(path: str, qualname: str) -> Probe:
    """Holds when ``qualname``'s return annotation is not ``list[...]`` (a single value)."""

    def probe(src: LibrarySource) -> Evidence:
        fn = src.find_function(path, qualname)
        if fn is None:
            return _gone(path, qualname)
        returns = ast.unparse(fn.returns) if fn.returns is not None else ""
        return Evidence(not returns.lower().startswith("list"), path, fn.lineno, signature(fn, "unique_reply_rank"))

    return probe


@_recorded
def imports_at_top(path: str, module: str) -> Probe:
    """Holds when module ``path`` imports from ``module`` at its top level (not inside a
    function or a branch: whatever loads ``path`` loads ``module``)."""

    def probe(src: LibrarySource) -> Evidence:
        tree = src.tree(path)
        if tree is None:
            return _missing(path, path)
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.module == module and not node.level:
                return Evidence(True, path, node.lineno, " ".join(ast.unparse(node).split()))
        return _missing(path, f"a top-level import from {module}")

    return probe


@_recorded
def attribute_stores(path: str, qualname: str, attr: str, holding: str) -> Probe:
    """Holds when function ``qualname`` assigns ``self.<attr>`` a value built from the name
    ``holding`` (e.g. ``self.execute_model_state = (..., input_batch, ...)``)."""

    def probe(src: LibrarySource) -> Evidence:
        fn = src.find_function(path, qualname)
        if fn is None:
            return _missing(path, qualname)
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Attribute)
                and t.attr == attr
                and isinstance(t.value, ast.Name)
                and t.value.id == "self"
                for t in node.targets
            ):
                if any(isinstance(n, ast.Name) and n.id == holding for n in ast.walk(node.value)):
                    shown = " ".join(ast.unparse(node).split())
                    return Evidence(True, path, node.lineno, shown if len(shown) <= 90 else shown[:87] + "...")
        return Evidence(False, path, fn.lineno, f"{qualname} stores no {holding} in self.{attr}")

    return probe


@_recorded
def class_reads(path: str, cls: str, attr: str) -> Probe:
    """Holds when a method of class ``cls`` reads ``<something>.<attr>`` (the first such read
    is the evidence)."""

    def probe(src: LibrarySource) -> Evidence:
        node = src.find_class(path, cls)
        if node is None:
            return _missing(path, cls)
        for fn in (n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            for read in ast.walk(fn):
                if isinstance(read, ast.Attribute) and read.attr == attr and isinstance(read.ctx, ast.Load):
                    return Evidence(True, path, read.lineno, f"{cls}.{fn.name} reads {ast.unparse(read)}")
        return Evidence(False, path, node.lineno, f"class {cls} reads no .{attr}")

    return probe


@_recorded
def function_moved(old_path: str, new_path: str, name: str) -> Probe:
    """Holds when module ``old_path`` no longer defines the top-level function ``name`` and
    module ``new_path`` does (evidence: its definition there); where ``old_path`` still
    defines it, the evidence is that definition."""

    def probe(src: LibrarySource) -> Evidence:
        old = src.find_function(old_path, name)
        if old is not None:
            return Evidence(False, old_path, old.lineno, signature(old))
        new = src.find_function(new_path, name)
        if new is None:
            return _missing(new_path, name)
        return Evidence(True, new_path, new.lineno, f"{signature(new)}, no longer in {old_path.rsplit('/', 1)[-1]}")

    return probe


def _absent_library(src: LibrarySource, path: str) -> Evidence | None:
    """The answer of a probe into a library the target does not have at all (transformers
    or torch): the fact does not hold there, an ordinary answer; None when it is installed."""
    library = path.split("/", 1)[0]
    return None if src.installed(library) else Evidence(False, path, None, f"{library} is not installed")


def _find_class(src: LibrarySource, path: str, cls: str) -> ast.ClassDef | Evidence:
    """Class ``cls`` of ``path`` (a module-level alias followed), or the answer of a probe
    that cannot find it: its library not installed (an ordinary answer), the class gone
    (``Evidence.missing``)."""
    absent = _absent_library(src, path)
    if absent is not None:
        return absent
    node = src.find_class(path, cls)
    return node if node is not None else _gone(path, cls)


def _find_method(src: LibrarySource, path: str, cls: str, method: str):
    """(class ``cls``, its method ``method``), or the answer of a probe that cannot find them:
    ``_find_class``'s, or the class defining no such method (an ordinary answer)."""
    node = _find_class(src, path, cls)
    if isinstance(node, Evidence):
        return node
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef)
    fn = next((n for n in node.body if isinstance(n, kinds) and n.name == method), None)
    return (
        (node, fn) if fn is not None else Evidence(False, path, node.lineno, f"class {node.name} defines no {method}")
    )


@_recorded
def method_calls(path: str, cls: str, method: str, callee: str) -> Probe:
    """Holds when class ``cls`` (a module-level alias followed) defines ``method`` and its body
    calls ``callee`` (dotted source text: ``wrap_init_to_accept_kwargs``, ``self.validate``);
    evidence: that call. The class defining no such method is an ordinary answer (the fact
    does not hold); the class gone is ``Evidence.missing``."""

    def probe(src: LibrarySource) -> Evidence:
        found = _find_method(src, path, cls, method)
        if isinstance(found, Evidence):
            return found
        node, fn = found
        for call in ast.walk(fn):
            if isinstance(call, ast.Call) and ast.unparse(call.func) == callee:
                return Evidence(True, path, call.lineno, f"{node.name}.{method}: {ast.unparse(call)}")
        return Evidence(False, path, fn.lineno, f"{node.name}.{method} does not call {callee}")

    return probe


@_recorded
def field_annotation_mentions(path: str, cls: str, name: str, word: str) -> Probe:
    """Holds when class ``cls`` (a module-level alias followed) declares the class-level
    annotated field ``name`` and its annotation names ``word`` (e.g. ``torch``). The class
    without that field is an ordinary answer; the class gone is ``Evidence.missing``."""

    def probe(src: LibrarySource) -> Evidence:
        node = _find_class(src, path, cls)
        if isinstance(node, Evidence):
            return node
        for field in node.body:
            if isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name) and field.target.id == name:
                text = ast.unparse(field.annotation)
                mentions = any(
                    isinstance(n, ast.Name)
                    and n.id == word
                    or isinstance(n, ast.Constant)
                    and isinstance(n.value, str)
                    and word in n.value
                    for n in ast.walk(field.annotation)
                )
                return Evidence(mentions, path, field.lineno, f"{node.name}.{name}: {text}")
        return Evidence(False, path, node.lineno, f"class {node.name} declares no class-level field {name}")

    return probe


@_recorded
def aux_layers_are_layer_inputs(path: str) -> Probe:
    """Holds when every EAGLE-3 auxiliary hidden-state capture in the vLLM model module ``path``
    numbers layer ``i`` by the hidden state entering decoder layer ``i``
    (``patcher.fixes.vllm_eagle3.aux_capture``); evidence: the first capture. The module gone
    is ``Evidence.missing``; one without a capture is an ordinary answer."""

    def probe(src: LibrarySource) -> Evidence:
        from patcher.fixes.vllm_eagle3 import aux_capture

        if not src.has(path):
            return _gone(path, path.rsplit("/", 1)[-1])
        capture = aux_capture(src, path)
        if capture.numbering == "none":
            return Evidence(False, path, None, capture.found)
        said = {"input": "the input of decoder layer i", "output": "the output of decoder layer i"}
        return Evidence(
            capture.numbering == "input",
            path,
            capture.line,
            f"{capture.found}: auxiliary layer i is {said.get(capture.numbering, 'numbered both ways')}",
        )

    return probe


@_recorded
def method_mentions(path: str, cls: str, method: str, literal: str) -> Probe:
    """Holds when class ``cls`` (a module-level alias followed) defines ``method`` and its body
    holds the string constant ``literal`` (e.g. the attribute name ``"text_config"`` a method
    looks up); evidence: the statement that holds it. The class defining no such method is an
    ordinary answer (the fact does not hold); the class gone is ``Evidence.missing``."""

    def probe(src: LibrarySource) -> Evidence:
        found = _find_method(src, path, cls, method)
        if isinstance(found, Evidence):
            return found
        node, fn = found
        simple = (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Expr, ast.Return)
        for stmt in (n for n in ast.walk(fn) if isinstance(n, simple)):
            if any(isinstance(c, ast.Constant) and c.value == literal for c in ast.walk(stmt)):
                return Evidence(True, path, stmt.lineno, f"{node.name}.{method}: {ast.unparse(stmt)}")
        return Evidence(False, path, fn.lineno, f"{node.name}.{method} never names {literal!r}")

    return probe


@_recorded
def class_sets_no_attribute(path: str, cls: str, attr: str) -> Probe:
    """Holds when class ``cls`` (a module-level alias followed) gives its instances no
    attribute ``attr``: no method assigns ``self.<attr>`` and the class body declares no
    ``attr``; evidence: the class. Where it does, the evidence is that assignment. The class
    gone is ``Evidence.missing``; the library not installed, an ordinary answer."""

    def probe(src: LibrarySource) -> Evidence:
        node = _find_class(src, path, cls)
        if isinstance(node, Evidence):
            return node
        for stmt in node.body:
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
            if any(isinstance(t, ast.Name) and t.id == attr for t in targets):
                return Evidence(False, path, stmt.lineno, f"class {node.name} declares {ast.unparse(stmt)}")
        for fn in (n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            for stmt in ast.walk(fn):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
                if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and any(
                    isinstance(t, ast.Attribute)
                    and t.attr == attr
                    and isinstance(t.value, ast.Name)
                    and t.value.id == "self"
                    for t in targets
                ):
                    return Evidence(False, path, stmt.lineno, f"{node.name}.{fn.name}: {ast.unparse(stmt)}")
        return Evidence(
            True, path, node.lineno, f"class {node.name} sets no {attr} (each model's config declares its own)"
        )

    return probe


@_recorded
def module_absent(path: str) -> Probe:
    """Holds when the library is installed and has no module ``path`` (a file removed in a
    release); evidence: its absence, or the module's first line where it is still there. The
    library not installed is an ordinary answer (the fact does not hold)."""

    def probe(src: LibrarySource) -> Evidence:
        absent = _absent_library(src, path)
        if absent is not None:
            return absent
        if not src.has(path):
            return Evidence(True, path, None, f"no {path.rsplit('/', 1)[-1]}: the module is gone")
        return Evidence(False, path, 1, f"{path.rsplit('/', 1)[-1]} is there")

    return probe
