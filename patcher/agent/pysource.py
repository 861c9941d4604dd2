"""The parser both sides run: what a Python module binds, imports and reads, found with
``ast`` alone (nothing is imported). The agent uses it to choose which files of vLLM and
transformers to send (``sources``), the controller to check speculators' calls against them
(``patcher.checks``), so both read a file the same way.

Standard library only, Python 3.8+, and no import of another agent module: it is shipped
with the agent and imported by the controller as ``patcher.agent.pysource``.
"""

from __future__ import annotations

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


def collect_sources(read, seeds, package="vllm", follow=frozenset(), failed=None):
    """Every file of ``package`` needed to resolve ``seeds`` to their definitions.

    seeds: [(module, name or None)]; read(path) -> bytes or None. Follows re-exports, star
    imports and submodules, and for a class its bases and decorators, recursively; with
    ``follow`` (attribute names), also the declared types of those attributes of each class
    (``attribute_types``), so that reads like ``runner.input_batch.req_id_to_index`` can be
    checked class by class. Returns {path: bytes or None} (None: the file does not exist).
    ``failed``: a list to which the path of each file this interpreter cannot parse is added
    (what was followed from it is then missing: the answer is partial).
    """
    files, trees = {}, {}

    def parse(module):
        if module not in trees:
            trees[module] = None
            for path in module_paths(module):
                if path not in files:
                    files[path] = read(path)
                if files[path] is not None:
                    try:
                        trees[module] = (ast.parse(files[path]), path.endswith("__init__.py"))
                    except (SyntaxError, ValueError):
                        if failed is not None:
                            failed.append(path)
                    break
        return trees[module]

    seen, queue = set(), list(seeds)
    while queue and len(files) < MAX_SOURCE_FILES:
        module, name = queue.pop(0)
        if (module, name) in seen or module.split(".")[0] != package:
            continue
        seen.add((module, name))
        parsed = parse(module)
        if parsed is None or name is None:
            continue
        names, stars = bindings(parsed[0], module, parsed[1])
        hit = names.get(name)
        if hit is None:
            queue += [(module + "." + name, None)] + [(star, name) for star in stars]
        elif hit[0] == "import":
            queue.append((hit[1], hit[2]))
        elif hit[0] == "module":
            queue.append((hit[1], None))
        elif isinstance(hit[1], ast.ClassDef):
            named = [(d, None, True) for d in referenced_names(hit[1])]
            named += [(d, fn, False) for d, fn in (attribute_types(hit[1], follow) if follow else [])]
            for dotted, fn, is_base in named:
                head, _, rest = dotted.partition(".")
                local = local_import(fn, head, module, parsed[1]) if fn is not None else None
                bound = names.get(head)
                if local is not None and not rest:
                    queue.append(local)
                elif not rest and (is_base or bound):  # a type: only names the module binds
                    queue.append((module, head))
                elif bound and bound[0] == "module":
                    target, _, last = (bound[1] + "." + rest).rpartition(".")
                    queue.append((target, last))
    return files


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


def walk_import_path(read, listdir, start, own="speculators", failed=None):
    """Follow what importing ``start`` runs inside package ``own``.

    read(path) -> bytes or None; listdir(package path) -> [relative .py paths under it].
    Returns ({path: bytes or None} of ``own``'s files read, [(importer path, module, name,
    line, guarded)] of imports leaving ``own``). ``failed``: as for ``collect_sources``.
    """
    files, external, seen = {}, [], set()
    queue = [start]
    while queue:
        module = queue.pop(0)
        if module in seen or module.split(".")[0] != own:
            continue
        seen.add(module)
        parts = module.split(".")
        queue += [".".join(parts[:i]) for i in range(1, len(parts))]  # parent packages run first
        for path in module_paths(module):
            if path not in files:
                files[path] = read(path)
            data = files[path]
            if data is None:
                continue
            try:
                tree = ast.parse(data)
            except (SyntaxError, ValueError):
                if failed is not None:
                    failed.append(path)
                break
            for pkg in auto_packages(tree):
                for sub in listdir(pkg.replace(".", "/")):
                    name = sub[:-3].replace("/", ".")
                    queue.append(name[: -len(".__init__")] if name.endswith(".__init__") else name)
            for target, name, line, guarded in executed_imports(tree, module, path.endswith("__init__.py")):
                if target.split(".")[0] == own:
                    queue.append(target)
                    if name is not None:
                        queue.append(target + "." + name)  # ``from pkg import submodule``
                else:
                    external.append((path, target, name, line, guarded))
            break
    return files, external
