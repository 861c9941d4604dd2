"""The parser both sides run: what a Python module binds, imports and reads, found with
``ast`` alone (nothing is imported). The agent uses it to choose which files of vLLM and
transformers to send (``sources``), the controller to check speculators' calls against them
(``patcher.checks``), so both read a file the same way.

Standard library only, Python 3.8+, and no import of another agent module: it is shipped
with the agent and imported by the controller as ``patcher.agent.pysource``.
"""

from __future__ import annotations

import gc
import importlib.util
import sys


def _lazy_import(name):
    """The module ``name``, loaded on first attribute access (the standard library's
    ``importlib.util.LazyLoader``): ``ast`` takes 7 ms to import, and most runs of the
    agent parse nothing."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


ast = _lazy_import("ast")


class gc_paused(object):
    """``with gc_paused():`` the cyclic garbage collector off for a bulk parse, as it was
    after. Parsed trees hold no cycles (reference counting frees them), but their millions
    of objects set off full collections that cost more than the parsing itself (measured:
    the training half's 160 library files, 1.0 s with the collector, 0.45 s without)."""

    def __enter__(self):
        self.was = gc.isenabled()
        gc.disable()
        return self

    def __exit__(self, *exc):
        if self.was:
            gc.enable()
        return False


MAX_SOURCE_FILES = 400


def module_paths(module):
    """Candidate files of a dotted module name: the package's __init__.py, then module.py."""
    base = module.replace(".", "/")
    return [base + "/__init__.py", base + ".py"]


def _absolute(module, is_pkg, level, name):
    """The absolute module named by ``from <level dots><name> import ...`` inside ``module``."""
    if not level:
        return name
    parts = module.split(".")
    if not is_pkg:
        parts = parts[:-1]
    if level > 1:
        parts = parts[: len(parts) - (level - 1)]
    return ".".join(parts + ([name] if name else []))


def _module_statements(body):
    """Module-level statements, including those under ``if``/``try`` (TYPE_CHECKING, fallbacks)."""
    for node in body:
        yield node
        if isinstance(node, ast.If):
            for sub in _module_statements(node.body + node.orelse):
                yield sub
        elif isinstance(node, ast.Try):
            inner = node.body + node.orelse + node.finalbody
            for handler in node.handlers:
                inner += handler.body
            for sub in _module_statements(inner):
                yield sub


def bindings(tree, module, is_pkg):
    """What a module binds at top level: ``(names, star_modules)``.

    ``names`` maps a name to ``("def", node)`` (class, function, assignment; the last
    binding wins as at runtime), ``("import", module, name)`` or ``("module", module)``.
    """
    names, stars = {}, []
    for node in _module_statements(tree.body):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            names[node.name] = ("def", node)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Name):
                    names[t.id] = ("def", node)
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(module, is_pkg, node.level, node.module or "")
            for alias in node.names:
                if alias.name == "*":
                    stars.append(source)
                else:
                    names[alias.asname or alias.name] = ("import", source, alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    names[alias.asname] = ("module", alias.name)
                else:
                    top = alias.name.split(".")[0]
                    names[top] = ("module", top)
    return names, stars


def referenced_names(cls):
    """(dotted name) of each base class and decorator of a ClassDef, e.g. ``msgspec.Struct``."""
    found = []
    for expr in list(cls.bases) + list(cls.decorator_list):
        if isinstance(expr, ast.Call):
            expr = expr.func
        parts = []
        while isinstance(expr, ast.Attribute):
            parts.insert(0, expr.attr)
            expr = expr.value
        if isinstance(expr, ast.Name):
            found.append(".".join([expr.id] + parts))
    return found


def speculators_vllm_imports(tree):
    """[(module, name or None)] that a speculators module imports from vLLM."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "vllm":
            found += [(node.module, a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            found += [(a.name, None) for a in node.names if a.name.split(".")[0] == "vllm"]
    return found


def attribute_types(cls, follow):
    """The types ``cls`` declares for the attributes named in ``follow``, as written.

    Annotations of ``self.a: T = ...`` and class-level ``a: T``, constructors of
    ``self.a = T(...)``, and return annotations of methods ``a``. Returns
    [(dotted name, method it is written in or None)]: a method's own imports bind first.
    """
    found = []

    def names_in(expr, where):
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            try:
                expr = ast.parse(expr.value, mode="eval").body
            except SyntaxError:
                return
        for node in ast.walk(expr):
            parts = []
            while isinstance(node, ast.Attribute):
                parts.insert(0, node.attr)
                node = node.value
            if isinstance(node, ast.Name):
                found.append((".".join([node.id] + parts), where))

    for item in cls.body:
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and item.target.id in follow:
            names_in(item.annotation, None)
        if not isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if item.name in follow and item.returns is not None:
            names_in(item.returns, item)
        for node in ast.walk(item):
            target = (
                node.target
                if isinstance(node, ast.AnnAssign)
                else (node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
            )
            if not (
                isinstance(target, ast.Attribute)
                and isinstance(target.value, ast.Name)
                and target.value.id == "self"
                and target.attr in follow
            ):
                continue
            if isinstance(node, ast.AnnAssign):
                names_in(node.annotation, item)
            elif isinstance(node.value, ast.Call):
                names_in(node.value.func, item)
    return found


def local_import(fn, name, module, is_pkg):
    """(module, name) that ``from ... import`` inside function ``fn`` binds to ``name``, or None."""
    for node in ast.walk(fn):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    return _absolute(module, is_pkg, node.level, node.module or ""), alias.name
    return None


def attributes_read(trees):
    """Every attribute name read in the given modules (``x.name`` anywhere)."""
    return {n.attr for tree in trees for n in ast.walk(tree) if isinstance(n, ast.Attribute)}


def collect_sources(
    read, seeds, package="vllm", follow=frozenset(), limit=MAX_SOURCE_FILES, trees_out=None, failed=None
):
    """Every file of ``package`` needed to resolve ``seeds`` to their definitions.

    ``package``: a top-level package name, or a tuple of them (transformers' classes derive
    from torch's: both are followed). ``limit``: at most this many files are read.
    ``trees_out``: a dict that receives {path: tree} of each file parsed. ``failed``: a list
    that receives the path of each file that does not parse.

    seeds: [(module, name or None)], or (module, name, "resolve") for a name only imported
    (its definition is found, a class's bases are not followed); read(path) -> bytes or
    None. Follows re-exports, star
    imports and submodules, and for a class its bases and decorators, recursively; with
    ``follow`` (attribute names), also the declared types of those attributes of each class
    (``attribute_types``), so that reads like ``runner.input_batch.req_id_to_index`` can be
    checked class by class. Returns {path: bytes or None} (None: the file does not exist).
    ``failed``: a list to which the path of each file this interpreter cannot parse is added
    (what was followed from it is then missing: the answer is partial).
    """
    packages = (package,) if isinstance(package, str) else tuple(package)
    sources = _ReadModules(read, packages, trees_out, failed)
    seen, queue = set(), list(seeds)
    while queue and len(sources.files) < limit:
        item = queue.pop(0)
        module, name, shallow = item[0], item[1], len(item) > 2  # (module, name, "resolve"): no bases
        if (module, name, shallow) in seen or (module, name, False) in seen or module.split(".")[0] not in packages:
            continue
        seen.add((module, name, shallow))
        parsed = sources.parse(module)
        if parsed is None or name is None:
            continue
        queue += _next_lookups(sources, module, parsed[1], name, shallow, follow)
    return sources.files


class _ReadModules:
    """The files ``collect_sources`` has read ({path: bytes or None}), each module parsed
    once, and what each binds (``bindings``)."""

    def __init__(self, read, packages, trees_out, failed):
        self.read, self.packages, self.trees_out, self.failed = read, packages, trees_out, failed
        self.files, self.trees, self.bound_of = {}, {}, {}

    def parse(self, module):
        """(tree, whether it is a package's ``__init__``) of ``module``, or None when it has
        no file or does not parse (its path then goes to ``failed``)."""
        files, trees = self.files, self.trees
        if module not in trees:
            trees[module] = None
            for path in module_paths(module):
                if path not in files:
                    files[path] = self.read(path)
                if files[path] is not None:
                    try:
                        trees[module] = (ast.parse(files[path]), path.endswith("__init__.py"))
                        if self.trees_out is not None:
                            self.trees_out[path] = trees[module][0]
                    except (SyntaxError, ValueError):
                        if self.failed is not None:
                            self.failed.append(path)
                    break
        return trees[module]

    def bindings_of(self, module):
        if module not in self.bound_of:
            parsed = self.parse(module) if module.split(".")[0] in self.packages else None
            self.bound_of[module] = ({}, []) if parsed is None else bindings(parsed[0], module, parsed[1])
        return self.bound_of[module]

    def defines(self, module, name, depth=0):
        """Whether ``module`` binds ``name``, itself or through its star imports."""
        names, stars = self.bindings_of(module)
        return name in names or (
            depth < 20 and any(self.defines(s, name, depth + 1) for s in _likely_first(stars, name))
        )


def _likely_first(stars, name):
    """Star modules whose last part names ``name`` first (``models.llama`` for
    ``LlamaConfig``), the others after them, each group in order."""
    return sorted(stars, key=lambda s: s.rpartition(".")[2].replace("_", "") not in name.lower())


def _next_lookups(sources, module, is_pkg, name, shallow, follow):
    """Where ``collect_sources`` looks next for ``name`` of ``module``: [(module, name or
    None[, "resolve"])], one step toward its definition; for a class (not ``shallow``), its
    bases and decorators and the declared types of its ``follow`` attributes."""
    names, stars = sources.bindings_of(module)
    tail = ("resolve",) if shallow else ()
    hit = names.get(name)
    if hit is None:
        # the star imports, depth first, up to the first that binds the name; else a
        # submodule. transformers' ``from .models import *`` (transformers/__init__.py:794
        # in 4.57.6, under TYPE_CHECKING) reaches some 400 model packages, whose names are
        # unique: the likely one is tried first, and the resolver, which tries the stars
        # in order, skips those not read.
        star = next((s for s in _likely_first(stars, name) if sources.defines(s, name)), None)
        return [(star, name, *tail) if star is not None else (module + "." + name, None)]
    if hit[0] == "import" and hit[1] == module:  # torch/__init__.py:2318 (2.13.0) ``from torch import (nn as nn)``
        return [(module + "." + hit[2], None)]
    if hit[0] == "import":
        return [(hit[1], hit[2], *tail)]
    if hit[0] == "module":
        return [(hit[1], None)]
    if isinstance(hit[1], ast.ClassDef) and not shallow:
        return _class_lookups(hit[1], module, is_pkg, names, follow)
    return []


def _class_lookups(cls, module, is_pkg, names, follow):
    """The lookups of a class's bases and decorators, and of the declared types of its
    ``follow`` attributes (a method's own imports bind first); ``names``: what ``module``
    binds."""
    named = [(d, None, True) for d in referenced_names(cls)]
    named += [(d, fn, False) for d, fn in (attribute_types(cls, follow) if follow else [])]
    found = []
    for dotted, fn, is_base in named:
        head, _, rest = dotted.partition(".")
        local = local_import(fn, head, module, is_pkg) if fn is not None else None
        bound = names.get(head)
        if local is not None and not rest:
            found.append(local)
        elif not rest and (is_base or bound):  # a type: only names the module binds
            found.append((module, head))
        elif bound and bound[0] == "module":
            target, _, last = (bound[1] + "." + rest).rpartition(".")
            found.append((target, last))
    return found


_IMPORT_ERRORS = ("ImportError", "ModuleNotFoundError", "Exception", "BaseException")


def catches_import_error(handler):
    if handler.type is None:
        return True
    names = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(isinstance(n, ast.Name) and n.id in _IMPORT_ERRORS for n in names)


def _is_type_checking(test):
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def executed_imports(tree, module, is_pkg):
    """Imports a module runs when it is imported: [(module, name or None, line, guarded)].

    Module level, class bodies and ``if``/``try`` blocks count; function bodies and
    ``if TYPE_CHECKING:`` do not. ``guarded``: inside a ``try`` whose handler catches
    ImportError (a fallback exists). ``name`` is None for ``import a.b``.
    """
    found = []

    def walk(body, guarded):
        for node in body:
            if isinstance(node, ast.Import):
                found.extend((a.name, None, node.lineno, guarded) for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                source = _absolute(module, is_pkg, node.level, node.module or "")
                found.extend((source, a.name, node.lineno, guarded) for a in node.names)
            elif isinstance(node, ast.If):
                if not _is_type_checking(node.test):
                    walk(node.body, guarded)
                walk(node.orelse, guarded)
            elif isinstance(node, ast.Try):
                caught = any(catches_import_error(h) for h in node.handlers)
                walk(node.body, guarded or caught)
                for h in node.handlers:
                    walk(h.body, guarded)
                walk(node.orelse + node.finalbody, guarded)
            elif isinstance(node, (ast.ClassDef, ast.With)):
                walk(node.body, guarded)

    walk(tree.body, False)
    return found


def auto_packages(tree):
    """Packages speculators' registry imports every module of (``auto_package = "..."``)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "auto_package" for t in targets) and node.value is not None:
                values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
                found += [v.value for v in values if isinstance(v, ast.Constant) and isinstance(v.value, str)]
    return found


def walk_import_path(read, listdir, start, own="speculators", failed=None, broken=None):
    """Follow what importing ``start`` runs inside package ``own``.

    read(path) -> bytes or None; listdir(package path) -> [relative .py paths under it].
    ``start``: a module name, or a list of them.
    Returns ({path: bytes or None} of ``own``'s files read, [(importer path, module, name,
    line, guarded)] of imports leaving ``own``). ``failed``: as for ``collect_sources``.
    ``broken``: gets (path, line, kind, statement, detail) of each break of the chain
    (``patcher.checks.import_path``).
    """
    files, external, seen = {}, [], set()
    starts = [start] if isinstance(start, str) else list(start)
    queue = [(m, ("", 0, "start")) for m in starts]  # (module, (importer, line, statement) or None)
    while queue:
        module, why = queue.pop(0)
        if module in seen or module.split(".")[0] != own:
            continue
        parts = module.split(".")
        queue += [(".".join(parts[:i]), ("", 0, "parent")) for i in range(1, len(parts))]  # run first
        paths, found = module_paths(module), None
        for path in paths:
            if path not in files:
                files[path] = read(path)
            if files[path] is not None:
                found = path
                break
        if found is None and why is None:
            continue  # ``from pkg import name``: not a submodule
        seen.add(module)
        if found is None:
            if broken is not None:
                init = bool(listdir(paths[0][:-12]))  # a folder without its __init__.py
                where = (paths[0], 0) if init else (why[0] or paths[1], why[1])
                broken.append(where + ("missing-init" if init else "missing-module", why[2], module))
            continue
        try:
            tree = ast.parse(files[found])
        except (SyntaxError, ValueError) as e:
            if failed is not None:
                failed.append(found)
            if broken is not None:
                broken.append(
                    (found, getattr(e, "lineno", 0) or 0, "syntax-error", type(e).__name__, getattr(e, "msg", str(e)))
                )
            continue
        for pkg in auto_packages(tree):
            for sub in listdir(pkg.replace(".", "/")):
                name = sub[:-3].replace("/", ".")
                name = name[: -len(".__init__")] if name.endswith(".__init__") else name
                queue.append((name, (found, 0, "auto_package = %r" % pkg)))
        for target, name, line, guarded in executed_imports(tree, module, found.endswith("__init__.py")):
            if target.split(".")[0] == own:
                statement = "import %s" % target if name is None else "from %s import %s" % (target, name)
                queue.append((target, None if guarded else (found, line, statement)))
                if name is not None:
                    queue.append((target + "." + name, None))  # ``from pkg import submodule``
            else:
                external.append((found, target, name, line, guarded))
    return files, external


def module_aliases(tree, packages):
    """{local name: module} that ``import a.b`` / ``import a.b as c`` bind to a module of
    ``packages``, anywhere in ``tree`` (``import torch.nn.functional as F`` binds ``F`` to
    ``torch.nn.functional``, ``import torch.distributed`` binds ``torch`` to ``torch``)."""
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in packages:
                    found[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
    return found


def dotted_parts(expr):
    """``a.b.c`` as ["a", "b", "c"], or None when the expression is not a dotted name."""
    parts = []
    while isinstance(expr, ast.Attribute):
        parts.insert(0, expr.attr)
        expr = expr.value
    return [expr.id] + parts if isinstance(expr, ast.Name) else None


def library_references(tree, packages):
    """[(module, name or None)] a speculators module reaches in ``packages`` (transformers,
    torch): every ``from``/``import`` of them anywhere (``(module, name, "resolve")`` for a
    name the module neither calls nor derives a class from: see ``collect_sources``), and
    for each call written
    ``alias.a.b(...)`` on an imported module, every split of the dotted path
    (``("torch.nn", "functional")``, ``("torch.nn.functional", "pad")``), so that the
    files defining the callee are read whatever part of the path is a module."""
    found = []
    aliases = module_aliases(tree, packages)
    # ``from torch import nn``: ``nn.Linear(...)`` may go through a module too
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] in packages:
            for a in node.names:
                aliases.setdefault(a.asname or a.name, node.module + "." + a.name)
    used = set()  # names called (``Name(...)``, ``Name.method(...)``) or derived from: bases matter
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            parts = dotted_parts(node.func)
            if parts:
                used.add(parts[0])
        elif isinstance(node, ast.ClassDef):
            used.update(p[0] for p in (dotted_parts(b) for b in node.bases) if p)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] in packages:
            found += [
                (node.module, a.name) if (a.asname or a.name) in used else (node.module, a.name, "resolve")
                for a in node.names
            ]
        elif isinstance(node, ast.Import):
            found += [(a.name, None) for a in node.names if a.name.split(".")[0] in packages]
        elif isinstance(node, ast.Call):
            parts = dotted_parts(node.func)
            if parts and len(parts) > 1 and parts[0] in aliases:
                path = aliases[parts[0]].split(".") + parts[1:]
                found += [(".".join(path[:i]), path[i]) for i in range(1, len(path))]
    return found


def slim(data, tree=None):
    """``data`` (a module's source) with every function body replaced by ``...`` on its
    first line and blank lines after it, so that every line keeps its number: what the
    call checks read of a library module (names, classes, signatures, fields) parses in a
    fraction of the time. Bodies that mention ``dataclass`` are kept (a decorator that
    makes dataclasses is read from its body). ``data`` unchanged when it does not parse."""
    if tree is None:
        try:
            tree = ast.parse(data)
        except (SyntaxError, ValueError):
            return data
    lines = data.split(b"\n")
    spans = []

    def functions(body):  # the outermost functions: module and class level, under if/try/with
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield node
            elif isinstance(node, ast.ClassDef):
                for sub in functions(node.body):
                    yield sub
            elif isinstance(node, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
                inner = node.body + getattr(node, "orelse", []) + getattr(node, "finalbody", [])
                inner += [s for h in getattr(node, "handlers", []) for s in h.body]
                for sub in functions(inner):
                    yield sub

    for node in functions(tree.body):
        if not node.body:
            continue
        first = min([node.body[0].lineno] + [d.lineno for d in getattr(node.body[0], "decorator_list", [])])
        last = node.end_lineno
        head = lines[first - 1][: node.body[0].col_offset]
        if first <= node.lineno or head.strip() or last is None or last < first:
            continue
        spans.append((first, last, head))
    spans.sort()
    end = 0
    for first, last, head in spans:
        if first <= end:
            continue  # nested in a body already elided
        if b"dataclass" in b"\n".join(lines[first - 1 : last]):
            end = last
            continue
        lines[first - 1] = head + b"..."  # the body's own indentation
        for i in range(first, last):
            lines[i] = b""
        end = last
    return b"\n".join(lines)
