"""The generic call-site check: does every call speculators makes into vLLM still fit?

Independently of the patch list, read speculators' data-generation modules and check each
call into vLLM against the installed vLLM's source (``ast`` only, nothing imported):

- ``missing-import``: a name imported from vLLM that vLLM no longer defines (an import in
  ``try:`` with an ``except ImportError:`` fallback import is judged as it runs: the
  fallback's names where the ``try`` body's imports do not resolve, else the body's);
- ``missing-argument``: a required parameter (or dataclass field, init-only ``InitVar``
  included) that the call does not pass;
- ``unknown-keyword``: a keyword the callee does not take (``ignored-keyword`` when a
  pydantic dataclass without ``extra="forbid"`` silently drops it: a note, not a break);
- ``too-many-positional``, ``missing-method``: a method called on an object built from a
  vLLM class (``self.executor = MultiprocExecutor(...)``) that the class no longer has,
  unless the call is guarded by ``hasattr(obj, "method")``;
- ``unknown-rpc``: ``collective_rpc("name")`` where neither vLLM's worker nor the worker
  extension named by ``worker_extension_cls=`` defines ``name``;
- ``unreadable`` (a note): a vLLM file this interpreter cannot parse, so a name was not checked.

Each finding names the speculators ``file:line`` and the vLLM ``file:line`` of the signature.
The vLLM files come from the agent's ``sources`` op (one exchange; see ``patcher.agent.sources``),
which follows re-exports and base classes the same way this module does.
"""

from __future__ import annotations

import ast
import base64
from dataclasses import dataclass, field
from typing import Callable, Iterator, Mapping

from patcher.agent.pysource import bindings, catches_import_error, module_paths, speculators_vllm_imports
from patcher.connect.transport import Transport

SPECULATORS_DIR = "speculators/data_generation"
# collective_rpc("name") runs ``name`` on vLLM's worker (CPU/XPU workers subclass it) or
# on the worker extension class mixed into it.
WORKER = ("vllm.v1.worker.gpu_worker", "Worker")
# Bases that add no constructor parameters and no methods speculators calls.
NEUTRAL_BASES = {"object", "ABC", "abc.ABC", "Generic", "typing.Generic", "Protocol", "typing.Protocol"}


@dataclass(frozen=True)
class Finding:
    """One call that does not fit the installed vLLM.

    ``severity`` is ``error`` (the call fails at runtime) or ``note`` (accepted, no effect).
    """

    kind: str
    file: str
    line: int
    call: str
    detail: str
    vllm_file: str | None = None
    vllm_line: int | None = None
    vllm_found: str = ""
    severity: str = "error"
    subject: str = field(default="", compare=False)  # the parameter, keyword, name or method
    library: str = "vLLM"  # whose callee: vLLM, transformers, torch (``vllm_*`` then name its file)

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"

    @property
    def vllm_where(self) -> str:
        if self.vllm_file is None:
            return ""
        return f"{self.vllm_file}:{self.vllm_line}" if self.vllm_line else self.vllm_file

    def __str__(self) -> str:
        tail = f" ({self.vllm_where}: {self.vllm_found})" if self.vllm_file else ""
        return f"{self.where}: {self.call}: {self.detail}{tail}"

    def as_dict(self) -> dict:
        return {
            "kind": self.kind,
            "severity": self.severity,
            "file": self.file,
            "line": self.line,
            "call": self.call,
            "subject": self.subject,
            "detail": self.detail,
            "vllm_file": self.vllm_file,
            "vllm_line": self.vllm_line,
            "vllm_found": self.vllm_found,
            "library": self.library,
            "callee_file": self.vllm_file,
            "callee_line": self.vllm_line,
        }


@dataclass(frozen=True)
class Param:
    name: str
    required: bool
    kind: str = "any"  # "any" (positional or keyword) | "positional" (only) | "keyword" (only)
    init_only: bool = False
    line: int | None = None
    text: str = field(default="", compare=False)  # as declared, e.g. "block_size: int"


@dataclass(frozen=True)
class Signature:
    """What a callable accepts, read from the source. ``extra``: what an unknown keyword
    does (``error``, or ``ignored`` by a pydantic dataclass without extra="forbid")."""

    name: str
    file: str
    line: int
    text: str
    params: tuple[Param, ...] = ()
    varargs: bool = False
    varkw: bool = False
    extra: str = "error"

    def param(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name), None)

    @property
    def short(self) -> str:
        """Parameter names only: ``Scheduler.__init__(vllm_config, kv_cache_config, log_stats=…)``."""
        if "dataclass" in self.text:
            return self.text
        names = [p.name if p.required else f"{p.name}=…" for p in self.params if p.kind != "keyword"]
        if self.varargs:
            names.append("*args")
        keyword = [p.name if p.required else f"{p.name}=…" for p in self.params if p.kind == "keyword"]
        if keyword and not self.varargs:
            names.append("*")
        names += keyword + (["**kwargs"] if self.varkw else [])
        return f"{self.name}({', '.join(names)})"


@dataclass(frozen=True)
class Symbol:
    """A definition in vLLM: its module, file and node (class, function or assignment; an
    ``ast.alias`` for a name the module imports from outside the packages read, which is
    bound but not followed)."""

    module: str
    file: str
    node: ast.AST

    @property
    def is_class(self) -> bool:
        return isinstance(self.node, ast.ClassDef)


@dataclass(frozen=True)
class Checked:
    """One call the check evaluated: where, the callee as speculators names it
    (``target``: (module, name, method or None)) and the signature read statically.
    ``patcher.checks.runtime`` re-checks the same calls against the live objects."""

    file: str
    line: int
    label: str
    target: tuple[str, str, str | None]
    call: ast.Call | None = field(compare=False, repr=False)
    signature: Signature | None = field(compare=False, default=None)


class Index:
    """Resolve names to definitions over a set of source files (path -> bytes) of the
    top-level ``packages`` (vLLM's; ``patcher.checks.library_calls``: transformers' and
    torch's together, so that a transformers class's torch bases resolve too)."""

    def __init__(self, files: Mapping[str, bytes | None], packages: tuple[str, ...] = ("vllm",)) -> None:
        self.files = files
        self.packages = packages
        self.unparsable: dict[str, str] = {}  # path -> why ast could not parse it
        self._modules: dict[str, tuple[ast.Module, bool, str, dict, list] | None] = {}

    def module(self, name: str) -> tuple[ast.Module, bool, str, dict, list] | None:
        """(tree, is_package, path, bindings, star modules) of a module, or None."""
        if name not in self._modules:
            self._modules[name] = None
            for path in module_paths(name):
                data = self.files.get(path)
                if data is not None:
                    try:
                        tree = ast.parse(data, filename=path)
                    except SyntaxError as e:  # newer syntax than this interpreter reads
                        self.unparsable[path] = f"line {e.lineno}: {e.msg}"
                        break
                    is_pkg = path.endswith("__init__.py")
                    self._modules[name] = (tree, is_pkg, path, *bindings(tree, name, is_pkg))
                    break
        return self._modules[name]

    def resolve(self, module: str, name: str, depth: int = 0) -> Symbol | None:
        """Follow ``from module import name`` to the definition (None when not found)."""
        mod = self.module(module)
        if mod is None or depth > 20:
            return None
        _, _, path, names, stars = mod
        hit = names.get(name)
        if hit is None:
            for star in stars:
                found = self.resolve(star, name, depth + 1)
                if found is not None:
                    return found
            sub = self.module(f"{module}.{name}")
            return Symbol(f"{module}.{name}", sub[2], sub[0]) if sub else None
        if hit[0] == "def":
            return Symbol(module, path, hit[1])
        if hit[0] == "import" and hit[1] == module:  # torch/__init__.py:2318 (2.13.0) ``from torch import (nn as nn)``
            sub = self.module(f"{module}.{hit[2]}")
            return Symbol(f"{module}.{hit[2]}", sub[2], sub[0]) if sub else None
        # bound from outside the packages read, e.g. transformers/processing_utils.py:28 (5.22.2)
        # ``from typing import ..., Unpack``: the name exists, its definition is not followed
        if hit[1].split(".")[0] not in self.packages:
            return Symbol(hit[1], path, ast.alias(name=hit[2] if hit[0] == "import" else hit[1]))
        if hit[0] == "import":
            return self.resolve(hit[1], hit[2], depth + 1)
        sub = self.module(hit[1])
        return Symbol(hit[1], sub[2], sub[0]) if sub else None

    def resolve_dotted(self, module: str, dotted: str) -> Symbol | str | None:
        """A base or decorator written ``Name`` or ``mod.Name`` in ``module``: its Symbol,
        or the dotted external name (``msgspec.Struct``) when it lives outside the packages."""
        mod = self.module(module)
        if mod is None:
            return None
        head, _, rest = dotted.partition(".")
        bound = mod[3].get(head)
        if bound is None:
            return dotted if not rest else None
        if bound[0] == "def":
            return Symbol(module, mod[2], bound[1]) if not rest else None
        if bound[0] == "import":
            target = f"{bound[1]}.{bound[2]}" + (f".{rest}" if rest else "")
        else:
            target = bound[1] + (f".{rest}" if rest else "")
        if target.split(".")[0] not in self.packages:
            return target
        parent, _, last = target.rpartition(".")
        return self.resolve(parent, last)

    # -- classes ------------------------------------------------------------------------

    def mro(self, sym: Symbol) -> tuple[list[Symbol], list[str]]:
        """The class and its vLLM bases (depth-first, each once), and the external bases."""
        order: list[Symbol] = []
        external: list[str] = []

        def visit(s: Symbol) -> None:
            if any(o.node is s.node for o in order):
                return
            order.append(s)
            for base in s.node.bases:
                base_name = dotted_name(base)
                found = self.resolve_dotted(s.module, base_name) if base_name else None
                if isinstance(found, Symbol) and found.is_class:
                    visit(found)
                elif base_name not in NEUTRAL_BASES:
                    external.append(found if isinstance(found, str) else (base_name or ast.unparse(base)))

        visit(sym)
        return order, external

    def method(self, sym: Symbol, name: str) -> tuple[Symbol, ast.FunctionDef] | None:
        """The first class in the MRO that defines ``name``, and its definition: the last in
        the class body, as at runtime (``@overload`` stubs come before the implementation,
        e.g. torch/nn/modules/module.py ``Module.to`` in torch 2.13)."""
        for cls in self.mro(sym)[0]:
            found = [
                n for n in cls.node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name
            ]
            if found:
                return cls, found[-1]
        return None

    def dataclass_kind(self, sym: Symbol) -> str | None:
        """``stdlib`` | ``pydantic`` | ``pydantic-forbid`` | ``msgspec`` | None."""
        for deco in sym.node.decorator_list:
            call = deco if isinstance(deco, ast.Call) else None
            found = self.resolve_dotted(sym.module, dotted_name(call.func if call else deco) or "")
            if found in ("dataclasses.dataclass",):
                return "stdlib"
            if found == "pydantic.dataclasses.dataclass":
                return "pydantic-forbid" if call is not None and _forbids_extra(call) else "pydantic"
            if isinstance(found, Symbol) and isinstance(found.node, ast.FunctionDef):
                kind = self._decorator_factory(found)
                if kind:
                    return kind
        for base in sym.node.bases:
            if self.resolve_dotted(sym.module, dotted_name(base) or "") == "msgspec.Struct":
                return "msgspec"
        return None

    def _decorator_factory(self, fn: Symbol) -> str | None:
        """A vLLM decorator (e.g. vllm.config.utils.config) that makes a dataclass."""
        makes = None
        for node in ast.walk(fn.node):
            if isinstance(node, ast.Call):
                found = self.resolve_dotted(fn.module, dotted_name(node.func) or "")
                if found == "pydantic.dataclasses.dataclass":
                    makes = "pydantic"
                elif found == "dataclasses.dataclass":
                    makes = makes or "stdlib"
        if makes == "pydantic" and any(_forbids_extra(n) for n in ast.walk(fn.node) if isinstance(n, ast.Call)):
            return "pydantic-forbid"
        return makes

    def constructor(self, sym: Symbol) -> Signature | None:
        """The signature ``Class(...)`` is checked against, or None when it cannot be known.

        As at runtime: the first class in the MRO that defines ``__init__`` or is a
        dataclass (whose generated ``__init__`` takes the fields of it and its dataclass
        bases) decides.
        """
        classes, external = self.mro(sym)
        for i, cls in enumerate(classes):
            inits = [n for n in cls.node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"]
            init = inits[-1] if inits else None  # the last definition wins, as at runtime
            if init is not None:
                return function_signature(init, cls.file, f"{cls.node.name}.__init__", method=True)
            kind = self.dataclass_kind(cls)
            if kind is None:
                continue
            if any(e != "msgspec.Struct" for e in external):
                return None  # fields may come from a base outside vLLM
            params: dict[str, Param] = {}
            for base in reversed(classes[i:]):
                if base is cls or self.dataclass_kind(base):
                    for p in dataclass_fields(base.node):
                        params[p.name] = p
            bases = ", ".join(ast.unparse(b) for b in cls.node.bases)
            text = f"class {cls.node.name}({bases})" if bases else f"class {cls.node.name}"
            return Signature(
                cls.node.name,
                cls.file,
                cls.node.lineno,
                f"{kind} dataclass {text}",
                tuple(params.values()),
                extra="ignored" if kind == "pydantic" else "error",
            )
        if external:
            return None
        return Signature(sym.node.name, sym.file, sym.node.lineno, f"class {sym.node.name}")


def dotted_name(expr: ast.AST) -> str | None:
    parts = []
    while isinstance(expr, ast.Attribute):
        parts.insert(0, expr.attr)
        expr = expr.value
    if isinstance(expr, ast.Name):
        return ".".join([expr.id, *parts])
    return None


def _forbids_extra(call: ast.Call) -> bool:
    """``ConfigDict(extra="forbid")`` (or ``extra="forbid"``) anywhere in a call."""
    for node in ast.walk(call):
        if isinstance(node, ast.keyword) and node.arg == "extra":
            return isinstance(node.value, ast.Constant) and node.value.value == "forbid"
    return False


def function_signature(
    fn: ast.FunctionDef | ast.AsyncFunctionDef, file: str, name: str, method: bool = False
) -> Signature:
    args = fn.args
    positional = [*args.posonlyargs, *args.args]
    first_default = len(positional) - len(args.defaults)
    params = []
    for i, a in enumerate(positional):
        if method and i == 0:
            continue
        kind = "positional" if i < len(args.posonlyargs) else "any"
        params.append(Param(a.arg, i < first_default, kind, line=a.lineno, text=ast.unparse(a)))
    for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        params.append(Param(a.arg, d is None, "keyword", line=a.lineno, text=ast.unparse(a)))
    text = f"{fn.name}({ast.unparse(args)})"
    return Signature(name, file, fn.lineno, text, tuple(params), args.vararg is not None, args.kwarg is not None)


FIELD_CALLS = {"field", "Field", "dataclasses.field", "msgspec.field", "pydantic.Field"}


def dataclass_fields(cls: ast.ClassDef) -> Iterator[Param]:
    """The ``__init__`` parameters a dataclass body declares (InitVar included, ClassVar and
    ``field(init=False)`` left out)."""
    for node in cls.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        annotation = ast.unparse(node.annotation)
        if "ClassVar" in annotation:
            continue
        required = node.value is None
        value = node.value
        if isinstance(value, ast.Call) and dotted_name(value.func) in FIELD_CALLS:
            kws = {k.arg: k.value for k in value.keywords if k.arg}
            init = kws.get("init")
            if isinstance(init, ast.Constant) and init.value is False:
                continue
            has_default = (
                "default" in kws
                or "default_factory" in kws
                or any(not (isinstance(a, ast.Constant) and a.value is Ellipsis) for a in value.args[:1])
            )
            required = not has_default
        yield Param(
            node.target.id, required, "any", "InitVar" in annotation, node.lineno, f"{node.target.id}: {annotation}"
        )


# -- the check ---------------------------------------------------------------------------


@dataclass
class SpecModule:
    path: str
    tree: ast.Module
    imports: dict[str, tuple[str, str, int]] = field(default_factory=dict)  # local -> (module, name, line)


def check(
    speculators: Mapping[str, bytes | None],
    vllm: Mapping[str, bytes | None],
    record: list[Checked] | None = None,
    index: Index | None = None,
) -> list[Finding]:
    """Every call from ``speculators`` modules (path -> source) into vLLM (path -> source)
    that does not fit. Files that do not parse are skipped (the patch check reports them).
    ``record``, when given, receives every call evaluated (for ``patcher.checks.runtime``);
    ``index``, an ``Index`` of ``vllm`` to share parsed modules with another check."""
    index = index if index is not None else Index(vllm)
    modules = []
    for path, data in sorted(speculators.items()):
        if data is None:
            continue
        try:
            tree = ast.parse(data, filename=path)
        except SyntaxError:
            continue
        mod = SpecModule(path, tree, vllm_imports(tree, index))
        if mod.imports:
            modules.append(mod)
    extensions = worker_extensions(speculators)
    findings: list[Finding] = []
    for mod in modules:
        findings += _check_module(index, mod, extensions, record if record is not None else [])
    return sorted(set(findings), key=lambda f: (f.file, f.line, f.kind, f.detail))


def _from_vllm(node: ast.AST, packages: tuple[str, ...] = ("vllm",)) -> list[ast.ImportFrom]:
    return [
        n
        for n in ast.walk(node)
        if isinstance(n, ast.ImportFrom) and not n.level and (n.module or "").split(".")[0] in packages
    ]


def vllm_imports(
    tree: ast.Module, index: Index, packages: tuple[str, ...] = ("vllm",)
) -> dict[str, tuple[str, str, int]]:
    """What each name a speculators module imports from vLLM (or from ``packages``) is bound
    to when the module runs on this install: {local name: (module, name, line)}.

    Every ``from vllm... import`` counts, wherever it is. Under a ``try:`` whose handler
    catches ImportError, the handler's vLLM imports run only when one of the ``try`` body's
    vLLM imports does not resolve in ``index``: then their names replace the body's; when
    every body import resolves, the handler's imports never run and bind nothing.
    """
    unused: set[int] = set()
    fallback: set[int] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Try):
            continue
        caught = [
            n for h in node.handlers if catches_import_error(h) for stmt in h.body for n in _from_vllm(stmt, packages)
        ]
        body = [n for stmt in node.body for n in _from_vllm(stmt, packages)]
        if caught and body:
            fails = any(index.resolve(n.module, a.name) is None for n in body for a in n.names)
            (fallback if fails else unused).update(id(n) for n in caught)
    bound: dict[str, tuple[str, str, int]] = {}
    for replacing in (False, True):  # a fallback that runs rebinds what its try body bound
        for node in _from_vllm(tree, packages):
            if id(node) not in unused and (id(node) in fallback) is replacing:
                for a in node.names:
                    bound[a.asname or a.name] = (node.module, a.name, node.lineno)
    return bound


def worker_extensions(speculators: Mapping[str, bytes | None]) -> list[tuple[str, ast.ClassDef]]:
    """Worker extension classes named by ``worker_extension_cls="pkg.mod.Class"``."""
    found = []
    for data in speculators.values():
        if data is None:
            continue
        try:
            tree = ast.parse(data)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.keyword)
                and node.arg == "worker_extension_cls"
                and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)
            ):
                module, _, cls_name = node.value.value.rpartition(".")
                path = module.replace(".", "/") + ".py"
                source = speculators.get(path)
                if source is None:
                    continue
                cls = next(
                    (n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == cls_name), None
                )
                if cls is not None:
                    found.append((path, cls))
    return found


def resolve_imports(
    index: Index, mod: SpecModule, record: list[Checked], library: Callable[[str], str] = lambda module: "vLLM"
) -> tuple[list[Finding], dict[str, Symbol]]:
    """Each name ``mod`` imports (``mod.imports``) resolved in ``index``: the findings
    (``missing-import``; ``unreadable``, a note, when a file of the package does not parse
    here) and {local name: Symbol} of those that resolve. ``library(module)``: the name of
    the package a module belongs to, for the findings (``vLLM``, ``transformers``,
    ``torch``); each import is recorded as checked."""
    findings = []
    symbols: dict[str, Symbol] = {}
    for local, (module, name, line) in mod.imports.items():
        lib = library(module)
        record.append(Checked(mod.path, line, f"from {module} import {name}", (module, name, None), None))
        sym = index.resolve(module, name)
        if sym is None and index.unparsable:
            why = "; ".join(f"{p} ({e})" for p, e in sorted(index.unparsable.items()))
            findings.append(
                Finding(
                    "unreadable",
                    mod.path,
                    line,
                    f"from {module} import {name}",
                    f"not checked: this Python cannot parse {why}",
                    severity="note",
                    subject=name,
                    library=lib,
                )
            )
        elif sym is None:
            mod_info = index.module(module)
            findings.append(
                Finding(
                    "missing-import",
                    mod.path,
                    line,
                    f"from {module} import {name}",
                    f"{lib} has no {name} in {module}" if mod_info else f"{lib} has no module {module}",
                    mod_info[2] if mod_info else module_paths(module)[1],
                    None,
                    "name not defined" if mod_info else "file not found",
                    subject=name,
                    library=lib,
                )
            )
        else:
            symbols[local] = sym
    return findings, symbols


def callee_signature(index: Index, sym: Symbol, label: str) -> Signature | None:
    """What calling ``sym`` accepts: a class's constructor, a function's parameters; None
    when it cannot be known (an assignment, a constructor from outside the index)."""
    if sym.is_class:
        return index.constructor(sym)
    if isinstance(sym.node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return function_signature(sym.node, sym.file, label)
    return None


def _check_module(
    index: Index, mod: SpecModule, extensions: list[tuple[str, ast.ClassDef]], record: list[Checked]
) -> list[Finding]:
    findings, symbols = resolve_imports(index, mod, record)
    # self.<attr> = <vLLM class>(...) anywhere in the module: the attribute's class.
    attrs: dict[str, tuple[Symbol, str]] = {}  # attribute -> (class, its local import name)
    for node in ast.walk(mod.tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name):
            sym = symbols.get(node.value.func.id)
            if sym is not None and sym.is_class:
                for t in node.targets:
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                        attrs[t.attr] = (sym, node.value.func.id)
    for call, guards in guarded_calls(mod.tree):
        func = call.func
        line = call.lineno
        if isinstance(func, ast.Name) and func.id in symbols:
            sig = callee_signature(index, symbols[func.id], func.id)
            module, name, _ = mod.imports[func.id]
            record.append(Checked(mod.path, line, f"{func.id}(...)", (module, name, None), call, sig))
            if sig is not None:
                findings += check_call(mod.path, line, f"{func.id}(...)", call, sig)
        elif (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Attribute)
            and isinstance(func.value.value, ast.Name)
            and func.value.value.id == "self"
            and func.value.attr in attrs
        ):
            owner, owner_local = attrs[func.value.attr]
            label = f"self.{func.value.attr}.{func.attr}(...)"
            found = index.method(owner, func.attr)
            module, name, _ = mod.imports[owner_local]
            guarded = (ast.dump(func.value), func.attr) in guards
            if not guarded or found is not None:
                sig = (
                    None
                    if found is None
                    else function_signature(
                        found[1], found[0].file, f"{found[0].node.name}.{found[1].name}", method=True
                    )
                )
                record.append(Checked(mod.path, line, label, (module, name, func.attr), call, sig))
            if found is None:
                if not guarded and not index.mro(owner)[1]:
                    findings.append(
                        Finding(
                            "missing-method",
                            mod.path,
                            line,
                            label,
                            f"{owner.node.name} (and its bases) has no method {func.attr}",
                            owner.file,
                            owner.node.lineno,
                            f"class {owner.node.name}",
                            subject=func.attr,
                        )
                    )
                continue
            findings += check_call(mod.path, line, label, call, sig)
            if func.attr == "collective_rpc" and call.args and isinstance(call.args[0], ast.Constant):
                rpc = call.args[0].value
                findings += _check_rpc(index, mod.path, line, rpc, extensions)
                if isinstance(rpc, str):
                    by_extension = any(_defines(c, rpc) for _, c in extensions)
                    record.append(
                        Checked(
                            mod.path,
                            line,
                            f'collective_rpc("{rpc}")',
                            ("<rpc>", rpc, "extension" if by_extension else None),
                            call,
                        )
                    )
    return findings


def guarded_calls(tree: ast.AST) -> Iterator[tuple[ast.Call, frozenset]]:
    """Every call, with the ``hasattr(obj, "name")`` guards (as (dump(obj), name)) above it."""

    def guards_of(test: ast.AST) -> set:
        found = set()
        for node in ast.walk(test):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "hasattr"
                and len(node.args) == 2
                and isinstance(node.args[1], ast.Constant)
            ):
                found.add((ast.dump(node.args[0]), node.args[1].value))
        return found

    def walk(node: ast.AST, guards: frozenset) -> Iterator[tuple[ast.Call, frozenset]]:
        if isinstance(node, (ast.If, ast.IfExp)):
            inner = guards | guards_of(node.test)
            yield from walk(node.test, guards)
            body = node.body if isinstance(node.body, list) else [node.body]
            for child in body:
                yield from walk(child, inner)
            orelse = node.orelse if isinstance(node.orelse, list) else [node.orelse]
            for child in orelse:
                yield from walk(child, guards)
            return
        if isinstance(node, ast.Call):
            yield node, guards
        for child in ast.iter_child_nodes(node):
            yield from walk(child, guards)

    yield from walk(tree, frozenset())


def check_call(
    path: str, line: int, label: str, call: ast.Call, sig: Signature, library: str = "vLLM"
) -> list[Finding]:
    """Does ``call`` fit ``sig``: positional count, keywords, required parameters.
    ``library``: whose callee (named in the findings)."""
    findings = []

    def finding(kind: str, detail: str, p: Param | None = None, severity: str = "error", subject: str = "") -> Finding:
        vline = p.line if p is not None and p.line else sig.line
        if p is None:
            found = sig.short
        elif "dataclass" in sig.text:
            found = f"{sig.name}.{p.text or p.name}"
        else:
            found = f"{sig.name}(... {p.text or p.name} ...)"
        return Finding(
            kind,
            path,
            line,
            label,
            detail,
            sig.file,
            vline,
            found,
            severity,
            subject or (p.name if p is not None else ""),
            library,
        )

    splat = any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords)
    positional = [p for p in sig.params if p.kind != "keyword"]
    n_pos = sum(1 for a in call.args if not isinstance(a, ast.Starred))
    if n_pos > len(positional) and not sig.varargs and not splat:
        findings.append(
            finding(
                "too-many-positional",
                f"{n_pos} positional arguments, {sig.name} takes {len(positional)}",
                subject=str(n_pos),
            )
        )
    passed = {p.name for p in positional[:n_pos]}
    for kw in call.keywords:
        if kw.arg is None:
            continue
        p = sig.param(kw.arg)
        if p is not None and p.kind != "positional":
            passed.add(kw.arg)
        elif not sig.varkw:
            if sig.extra == "ignored":
                findings.append(
                    finding(
                        "ignored-keyword",
                        f"{sig.name} has no field {kw.arg}; pydantic drops it",
                        severity="note",
                        subject=kw.arg,
                    )
                )
            else:
                findings.append(finding("unknown-keyword", f"{sig.name} takes no keyword {kw.arg}", subject=kw.arg))
    if not splat:
        for p in sig.params:
            if p.required and p.name not in passed:
                what = "init-only field" if p.init_only else ("field" if "dataclass" in sig.text else "parameter")
                findings.append(finding("missing-argument", f"required {what} {p.name} not passed", p))
    return findings


def _check_rpc(
    index: Index, path: str, line: int, name: object, extensions: list[tuple[str, ast.ClassDef]]
) -> list[Finding]:
    if not isinstance(name, str):
        return []
    worker = index.resolve(*WORKER)
    if worker is None or not worker.is_class:
        return []  # no worker source to check against
    if index.method(worker, name) is not None:
        return []
    if any(_defines(cls, name) for _, cls in extensions):
        return []
    ext = " nor ".join(f"{c.name} ({p}:{c.lineno})" for p, c in extensions) or "no worker extension"
    return [
        Finding(
            "unknown-rpc",
            path,
            line,
            f'collective_rpc("{name}")',
            f"neither {worker.node.name} nor {ext} defines {name}",
            worker.file,
            worker.node.lineno,
            f"class {worker.node.name}",
            subject=name,
        )
    ]


def _defines(cls: ast.ClassDef, name: str) -> bool:
    return any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name for n in cls.body)


def fetch(
    transport: Transport, site_packages: str | None = None
) -> tuple[dict[str, bytes | None], dict[str, bytes | None]]:
    """One ``sources`` exchange: (speculators files, vLLM files) for ``check``."""
    answer = transport.request(
        "sources",
        site_packages=site_packages,
        speculators_dir=SPECULATORS_DIR,
        symbols=[list(WORKER)],
        follow_attributes=True,
    )
    return decode(answer)


def decode(answer: dict) -> tuple[dict[str, bytes | None], dict[str, bytes | None]]:
    """(speculators files, vLLM files) of a ``sources`` answer."""

    def unb64(files: dict) -> dict[str, bytes | None]:
        return {k: None if v is None else base64.b64decode(v) for k, v in files.items()}

    return unb64(answer["speculators"]), unb64(answer["vllm"])


def local_sources(speculators_root: str, vllm_root: str) -> tuple[dict[str, bytes | None], dict[str, bytes | None]]:
    """What ``fetch`` returns, read directly from two directories (tests, benchmarks)."""
    import os

    from patcher.agent.pysource import attributes_read, collect_sources

    def read(root: str, path: str) -> bytes | None:
        try:
            with open(os.path.join(root, path), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    spec_dir = os.path.join(speculators_root, SPECULATORS_DIR)
    spec = {f"{SPECULATORS_DIR}/{n}": read(spec_dir, n) for n in sorted(os.listdir(spec_dir)) if n.endswith(".py")}
    trees = [ast.parse(d) for d in spec.values() if d]
    seeds = [WORKER] + [s for tree in trees for s in speculators_vllm_imports(tree)]
    return spec, collect_sources(lambda p: read(vllm_root, p), seeds, follow=attributes_read(trees))
