"""The attribute-read check: does every vLLM attribute speculators reads still exist?

Calls are checked by ``patcher.checks.callsite``; this module checks the other half of what the
generator and the worker extension rely on: plain reads such as
``self.model_runner.input_batch.req_id_to_index`` (custom_worker.py) or
``scheduler_output.num_scheduled_tokens`` (the generator). A rename in vLLM there is no
``TypeError`` at a call but an ``AttributeError`` mid-job, or a capture that silently
reads something else.

How (``ast`` only, nothing imported): the type of an expression is followed as far as the
source states it --
- ``self`` in the worker extension (``worker_extension_cls=``) is vLLM's ``Worker``
  (vllm/v1/worker/gpu_worker.py) plus the extension's own attributes;
- ``Cls(...)`` of an imported vLLM class is that class; ``x = <typed>`` and
  ``(x := <typed>)`` carry it to the name;
- ``obj.attr`` takes the type vLLM declares for the attribute (``self.attr: T = ...``, a
  class-level ``attr: T`` field, or ``self.attr = T(...)``), ``obj.method()`` the method's
  return annotation; ``self.attr`` of speculators' own class what it was assigned.
Every read on an object of a known vLLM class must name a method, property, class-level
field or ``self.<attr>`` assignment of the class or its vLLM bases. Not checked: classes with
a base outside vLLM or a ``__getattr__`` (anything may exist), and reads guarded by
``hasattr(obj, "attr")`` (an ``if`` around them or an earlier ``if not hasattr(...):
raise``/``return``) or by ``try: ... except AttributeError``.
The vLLM files come from the agent's ``sources`` op with ``follow_attributes`` (the declared
types of the attributes speculators reads are collected with the classes).
"""

from __future__ import annotations

import ast
from typing import Iterator, Mapping

from patcher.agent.pysource import local_import
from patcher.checks.callsite import WORKER, Finding, Index, Symbol, dotted_name, vllm_imports, worker_extensions

KIND = "missing-attribute"


def check(
    speculators: Mapping[str, bytes | None], vllm: Mapping[str, bytes | None], index: Index | None = None
) -> list[Finding]:
    """Every read of an attribute a vLLM class does not have, in ``speculators`` modules
    (path -> source). Files that do not parse are skipped (the patch check reports them).
    ``index``: an ``Index`` of ``vllm`` shared with the call-site check (parsed once)."""
    index = index if index is not None else Index(vllm)
    extensions = {(path, cls.name) for path, cls in worker_extensions(speculators)}
    worker = index.resolve(*WORKER)
    findings: list[Finding] = []
    for path, data in sorted(speculators.items()):
        try:
            tree = ast.parse(data, filename=path) if data is not None else None
        except SyntaxError:
            tree = None
        if tree is None:
            continue
        imports = {local: (module, name) for local, (module, name, _) in vllm_imports(tree, index).items()}
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            is_extension = (path, cls.name) in extensions
            findings += _Class(index, path, cls, imports, worker if is_extension else None).check()
    return sorted(set(findings), key=lambda f: (f.file, f.line, f.detail))


class _Class:
    """One speculators class: infers types in its methods and checks the reads."""

    def __init__(self, index: Index, path: str, cls: ast.ClassDef, imports: dict, worker: Symbol | None) -> None:
        self.index, self.path, self.cls, self.imports = index, path, cls, imports
        self.worker = worker if worker is not None and worker.is_class else None
        self.methods = {f.name: f for f in cls.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
        self.own: dict[str, list[tuple[ast.expr, ast.AST]]] = {}  # self.attr -> [(value, method)]
        for fn in self.methods.values():
            for node in ast.walk(fn):
                for target, value in _assignments(node):
                    if (
                        isinstance(target, ast.Attribute)
                        and isinstance(target.value, ast.Name)
                        and target.value.id == "self"
                    ):
                        self.own.setdefault(target.attr, []).append((value, fn))
        self._busy: set[int] = set()
        self._locals: dict[int, dict[str, list[ast.expr]]] = {}  # id(fn) -> name -> assigned values

    # -- types --------------------------------------------------------------------------

    def _from_import(self, name: str) -> Symbol | None:
        hit = self.imports.get(name)
        sym = self.index.resolve(*hit) if hit else None
        return sym if sym is not None and sym.is_class else None

    def _vllm_name(self, dotted: str, owner: Symbol, fn: ast.AST | None) -> Symbol | None:
        """A class written ``dotted`` in vLLM's ``owner`` module (inside method ``fn``)."""
        head, _, rest = dotted.partition(".")
        if fn is not None and not rest:
            mod = self.index.module(owner.module)
            local = local_import(fn, head, owner.module, bool(mod and mod[1]))
            if local is not None:
                sym = self.index.resolve(*local)
                return sym if sym is not None and sym.is_class else None
        found = self.index.resolve_dotted(owner.module, dotted)
        return found if isinstance(found, Symbol) and found.is_class else None

    def _annotation(self, expr: ast.expr | None, owner: Symbol, fn: ast.AST | None) -> Symbol | None:
        """The first vLLM class named in an annotation (``T``, ``"T"``, ``T | None``)."""
        if expr is None:
            return None
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            try:
                expr = ast.parse(expr.value, mode="eval").body
            except SyntaxError:
                return None
        for node in ast.walk(expr):
            dotted = dotted_name(node) if isinstance(node, (ast.Name, ast.Attribute)) else None
            sym = self._vllm_name(dotted, owner, fn) if dotted else None
            if sym is not None:
                return sym
        return None

    def declared(self, owner: Symbol, attr: str) -> Symbol | None:
        """The class vLLM declares for ``owner.attr`` (see the module docstring)."""
        for cls in self.index.mro(owner)[0]:
            for item in cls.node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and item.target.id == attr:
                    return self._annotation(item.annotation, cls, None)
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == attr:
                    is_property = any(
                        dotted_name(d) in ("property", "functools.cached_property", "cached_property")
                        for d in item.decorator_list
                    )
                    return self._annotation(item.returns, cls, item) if is_property else None
            for item in cls.node.body:
                if not isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                for node in ast.walk(item):
                    for target, value in _assignments(node):
                        if not (isinstance(target, ast.Attribute) and _is_self(target.value) and target.attr == attr):
                            continue
                        if isinstance(node, ast.AnnAssign):
                            return self._annotation(node.annotation, cls, item)
                        if isinstance(value, ast.Call):
                            dotted = dotted_name(value.func)
                            sym = self._vllm_name(dotted, cls, item) if dotted else None
                            if sym is not None:
                                return sym
        return None

    def returns(self, owner: Symbol, method: str) -> Symbol | None:
        found = self.index.method(owner, method)
        return self._annotation(found[1].returns, found[0], found[1]) if found else None

    def type_of(self, expr: ast.expr, fn: ast.AST) -> Symbol | str | None:
        """A vLLM class, ``"self"`` (this class) or None (unknown)."""
        if id(expr) in self._busy:
            return None
        self._busy.add(id(expr))
        try:
            return self._type_of(expr, fn)
        finally:
            self._busy.discard(id(expr))

    def _type_of(self, expr: ast.expr, fn: ast.AST) -> Symbol | str | None:
        if isinstance(expr, ast.NamedExpr):
            return self.type_of(expr.value, fn)
        if isinstance(expr, ast.Name):
            if expr.id == "self":
                return "self"
            values = self._assigned(fn).get(expr.id, [])
            types = {self.type_of(v, fn) for v in values} if values else {None}
            found = types.pop() if len(types) == 1 else None
            return found if isinstance(found, Symbol) else None
        if isinstance(expr, ast.Call):
            func = expr.func
            if isinstance(func, ast.Name):
                return self._from_import(func.id)
            if isinstance(func, ast.Attribute):
                owner = self.type_of(func.value, fn)
                if owner == "self":
                    own = self.methods.get(func.attr)
                    if own is not None and own.returns is not None:
                        dotted = dotted_name(own.returns)
                        return self._from_import(dotted) if dotted else None
                    return self.returns(self.worker, func.attr) if self.worker is not None else None
                return self.returns(owner, func.attr) if isinstance(owner, Symbol) else None
            return None
        if isinstance(expr, ast.Attribute):
            owner = self.type_of(expr.value, fn)
            if owner == "self":
                if expr.attr in self.own:
                    types = {self.type_of(v, where) for v, where in self.own[expr.attr]}
                    found = types.pop() if len(types) == 1 else None
                    return found if isinstance(found, Symbol) else None
                return self.declared(self.worker, expr.attr) if self.worker is not None else None
            return self.declared(owner, expr.attr) if isinstance(owner, Symbol) else None
        return None

    def _assigned(self, fn: ast.AST) -> dict[str, list[ast.expr]]:
        if id(fn) not in self._locals:
            found: dict[str, list[ast.expr]] = {}
            for node in ast.walk(fn):
                for target, value in _assignments(node):
                    if isinstance(target, ast.Name) and value is not None:
                        found.setdefault(target.id, []).append(value)
            self._locals[id(fn)] = found
        return self._locals[id(fn)]

    # -- the check ----------------------------------------------------------------------

    def has(self, owner: Symbol, attr: str) -> bool | None:
        """Whether the class or its vLLM bases define ``attr``; None when it cannot be known."""
        classes, external = self.index.mro(owner)
        if external:
            return None
        for cls in classes:
            for item in cls.node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    if item.name == "__getattr__":
                        return None
                    if item.name == attr:
                        return True
                for target, _ in _assignments(item):
                    if isinstance(target, ast.Name) and target.id == attr:
                        return True
            for node in ast.walk(cls.node):
                for target, _ in _assignments(node):
                    if isinstance(target, ast.Attribute) and _is_self(target.value) and target.attr == attr:
                        return True
        return False

    def check(self) -> list[Finding]:
        findings = []
        for fn in self.methods.values():
            for node, guards in _reads(fn):
                if (ast.dump(node.value), node.attr) in guards:
                    continue
                owner = self.type_of(node.value, fn)
                if owner == "self":
                    if node.attr in self.own or node.attr in self.methods or self.worker is None:
                        continue
                    owner = self.worker
                if not isinstance(owner, Symbol) or self.has(owner, node.attr) is not False:
                    continue
                findings.append(
                    Finding(
                        KIND,
                        self.path,
                        node.lineno,
                        ast.unparse(node),
                        f"{owner.node.name} (and its vLLM bases) has no attribute {node.attr}",
                        owner.file,
                        owner.node.lineno,
                        f"class {owner.node.name}",
                        subject=node.attr,
                    )
                )
        return findings


def _is_self(expr: ast.expr) -> bool:
    return isinstance(expr, ast.Name) and expr.id == "self"


def _assignments(node: ast.AST) -> Iterator[tuple[ast.expr, ast.expr | None]]:
    """(target, value) of an assignment statement or walrus; nothing for other nodes."""
    if isinstance(node, ast.Assign):
        for t in node.targets:
            yield t, node.value
    elif isinstance(node, ast.AnnAssign):
        yield node.target, node.value
    elif isinstance(node, ast.NamedExpr):
        yield node.target, node.value


def _hasattr_tests(test: ast.AST, negated: bool = False) -> set:
    """(dump(obj), name) of ``hasattr(obj, "name")`` in a test (or ``not hasattr`` when negated)."""
    found = set()
    if negated:
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            return _hasattr_tests(test.operand)
        return found
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


def _exits(body: list[ast.stmt]) -> bool:
    return bool(body) and isinstance(body[-1], (ast.Raise, ast.Return, ast.Continue, ast.Break))


def _catches_attribute_error(node: ast.Try) -> bool:
    return any(h.type is None or "AttributeError" in ast.unparse(h.type) for h in node.handlers)


def _reads(fn: ast.AST) -> Iterator[tuple[ast.Attribute, frozenset]]:
    """Every attribute read in ``fn``, with the hasattr guards in force there."""

    def block(stmts: list[ast.stmt], guards: frozenset) -> Iterator[tuple[ast.Attribute, frozenset]]:
        for stmt in stmts:
            yield from walk(stmt, guards)
            if isinstance(stmt, ast.If) and _exits(stmt.body):  # if not hasattr(x, "a"): raise
                guards = guards | _hasattr_tests(stmt.test, negated=True)

    def walk(node: ast.AST, guards: frozenset) -> Iterator[tuple[ast.Attribute, frozenset]]:
        if isinstance(node, ast.Try) and _catches_attribute_error(node):
            for handler in node.handlers:
                yield from block(handler.body, guards)
            yield from block(node.orelse + node.finalbody, guards)
            return
        if isinstance(node, (ast.If, ast.IfExp)):
            inner = guards | _hasattr_tests(node.test)
            yield from walk(node.test, guards)
            body = node.body if isinstance(node.body, list) else [node.body]
            orelse = node.orelse if isinstance(node.orelse, list) else [node.orelse]
            yield from block(body, inner) if isinstance(node, ast.If) else walk(body[0], inner)
            yield from block(orelse, guards) if isinstance(node, ast.If) else walk(orelse[0], guards)
            return
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            yield node, guards
        for name in ("body", "orelse", "finalbody"):
            children = getattr(node, name, None)
            if isinstance(children, list) and children and isinstance(children[0], ast.stmt):
                yield from block(children, guards)
        for field_name, value in ast.iter_fields(node):
            if field_name in ("body", "orelse", "finalbody", "handlers") and isinstance(value, list):
                if field_name == "handlers":
                    for h in value:
                        yield from block(h.body, guards)
                continue
            for child in value if isinstance(value, list) else [value]:
                if isinstance(child, ast.AST):
                    yield from walk(child, guards)

    yield from block(fn.body, frozenset())
