"""``sources`` and the import path: what ``verify`` reads of speculators, vLLM and
transformers, chosen with the parser the controller checks them with (``pysource``)."""

from __future__ import annotations

import os
import sys

from .common import (
    AgentError,
    digest_of,
    dist_infos,
    dist_metadata,
    package_root,
    read_bytes,
    sha256,
    site_dir_of,
    to_b64,
)
from .pysource import (
    ast,
    attributes_read,
    collect_sources,
    gc_paused,
    library_references,
    slim,
    speculators_vllm_imports,
    walk_import_path,
)


def _interpreter():
    """What parsed the files: the implementation and version of this interpreter (an older
    one may not parse what a newer one does, and then follows fewer imports)."""
    return "%s %d.%d.%d" % ((sys.implementation.name,) + tuple(sys.version_info[:3]))


class _Reads(object):
    """Everything a ``sources`` answer was computed from: the interpreter that parsed them,
    the package roots, each file read (its sha256, None when missing) and each directory
    listing. The answer is a function of these alone, so when they are all unchanged the
    caller's copy of it still holds. ``unparsed``: the files this interpreter could not
    parse (the answer is then partial, and the caller keeps none of it)."""

    def __init__(self, roots):
        self.roots, self.files, self.dirs = roots, {}, {}
        self.unparsed = []

    def read(self, path):
        data = read_bytes(path)
        self.files[path] = None if data is None else sha256(data)
        return data

    def listing(self, kind, path, compute):
        found = compute(path)
        self.dirs[kind + ":" + path] = _relative_listing(found, path)
        return found

    def as_dict(self):
        """Paths named relative to the package roots (``vllm:vllm/config/cache.py``): the
        record then fits any install of the same files wherever it lives, so a fresh copy
        of an environment, or a second host, is answered ``unchanged`` too."""
        return {
            "python": _interpreter(),
            "roots": sorted(k for k, v in self.roots.items() if v),
            "files": {self._rel(p): d for p, d in self.files.items()},
            "dirs": {k.partition(":")[0] + ":" + self._rel(k.partition(":")[2]): v for k, v in self.dirs.items()},
        }

    def _rel(self, path):
        best = None
        for name, root in self.roots.items():
            if root and (path == root or path.startswith(root.rstrip(os.sep) + os.sep)):
                if best is None or len(root) > len(self.roots[best]):
                    best = name
        return path if best is None else best + ":" + os.path.relpath(path, self.roots[best])


def _absolute_read(name, roots):
    """A path of a ``_Reads.as_dict`` record, made absolute with this target's roots; None
    when its root is not installed here."""
    head, sep, rel = name.partition(":")
    if not sep or head not in roots:
        return name if os.path.isabs(name) else None
    return os.path.join(roots[head], rel) if roots[head] else None


def _py_files(directory):
    """The ``.py`` names directly in ``directory``, sorted ([] when it is not a directory)."""
    return [e for e in sorted(os.listdir(directory)) if e.endswith(".py")] if os.path.isdir(directory) else []


def _py_tree(top):
    """Every ``.py`` file under ``top``, as paths relative to ``top``'s parent package root."""
    out = []
    for dirpath, _, names in os.walk(top):
        for n in sorted(names):
            if n.endswith(".py"):
                out.append(os.path.join(dirpath, n))
    return sorted(out)


def _still(expect, roots):
    """True when ``expect`` (a ``_Reads.as_dict()`` from an earlier answer) still describes
    this target: same roots, every file the same bytes, every listing the same names."""
    if not isinstance(expect, dict) or expect.get("roots") != sorted(k for k, v in roots.items() if v):
        return False
    if expect.get("python") != _interpreter():
        return False
    for name, digest in (expect.get("files") or {}).items():
        path = _absolute_read(name, roots)
        if path is None or digest_of(path) != digest:
            return False
    computes = {"py_files": _py_files, "py_tree": _py_tree}
    for key, names in (expect.get("dirs") or {}).items():
        kind, _, name = key.partition(":")
        path = _absolute_read(name, roots)
        if kind not in computes or path is None or _relative_listing(computes[kind](path), path) != names:
            return False
    return bool(expect.get("files"))


def _relative_listing(names, top):
    """A listing as ``_Reads`` records it: ``_py_tree`` gives absolute paths, made relative to ``top``."""
    return [os.path.relpath(n, top) if os.path.isabs(n) else n for n in names]


def sources(request):
    """``_sources`` with the garbage collector paused (``gc_paused``)."""
    with gc_paused():
        return _sources(request)


def _sources(request):
    """Files for the call-site check: speculators' modules and the vLLM files they need.

    request: {"site_packages": str|None, "speculators_dir": path under speculators' import
              root (e.g. speculators/data_generation), "symbols": [[module, name]] to resolve
              besides the ones those modules import from vLLM,
              "import_path": optional {"start": module, "packages": [name]} (see import_path),
              "env": optional [variable names] whose values in this process are returned,
              "builds": optional [distribution names] whose METADATA is returned as "builds"
              (``common.dist_metadata``), read afresh on every answer,
              "follow_attributes": optional bool: also the vLLM classes of the attributes
              speculators reads (see collect_sources),
              "libraries": optional {"start": [speculators module], "packages": [name],
              "limit": max files}: speculators' modules those import (see libraries) and
              the files of ``packages`` (transformers, torch) their calls need,
              "expect": optional, the "reads" of an earlier answer}
    Returns {"speculators": {path: base64}, "vllm": {path: base64 or None}, "reads": what
    the answer was computed from} plus "import_path" and "env" when asked, and "unparsed":
    the files this interpreter could not parse (a partial answer: not to be kept); or, when
    ``expect`` still holds (nothing it was computed from changed), {"unchanged": true}
    plus "env": the caller's earlier answer stands, nothing is parsed or sent.
    """
    site_dir_of(request)
    spec_root, vllm_root = package_root("speculators"), package_root("vllm")
    if spec_root is None:
        raise AgentError("no speculators installed (python %s)" % sys.executable)
    roots = {"speculators": spec_root, "vllm": vllm_root}
    for package in (request.get("import_path") or {}).get("packages", []):
        roots[package] = package_root(package)
    for package in (request.get("libraries") or {}).get("packages", []):
        roots[package] = package_root(package)
    env = {name: os.environ.get(name) for name in request.get("env") or []}
    # dist-info METADATA, read on every answer (a reinstall changes no file the answer was
    # computed from): torch and the builds that must match it (patcher.checks.torch_builds)
    search = [p for p in sys.path if p and os.path.isdir(p)]
    builds = {name: dist_metadata(name, search) for name in request.get("builds") or []}
    if request.get("expect") and _still(request["expect"], roots):
        answer = {"unchanged": True}
        if request.get("builds"):
            answer["builds"] = builds
        if request.get("env"):
            answer["env"] = env
        if request.get("libraries"):
            answer["library_versions"] = _versions(request["libraries"], roots)
        return answer
    reads = _Reads(roots)
    spec_dir = os.path.join(spec_root, request["speculators_dir"])
    spec = {}
    for entry in reads.listing("py_files", spec_dir, _py_files):
        spec[request["speculators_dir"] + "/" + entry] = reads.read(os.path.join(spec_dir, entry))
    seeds = [tuple(s) for s in request.get("symbols", [])]
    trees = []
    for path, data in spec.items():
        try:
            trees.append(ast.parse(data))
        except (SyntaxError, ValueError):
            reads.unparsed.append(path)
    for tree in trees:
        seeds += speculators_vllm_imports(tree)
    found = {}
    if vllm_root is not None:
        follow = attributes_read(trees) if request.get("follow_attributes") else frozenset()
        found = collect_sources(
            lambda p: reads.read(os.path.join(vllm_root, p)), seeds, follow=follow, failed=reads.unparsed
        )
    answer = {"speculators": {p: to_b64(d) for p, d in spec.items()}, "vllm": {p: to_b64(d) for p, d in found.items()}}
    if request.get("import_path"):
        answer["import_path"] = import_path(request["import_path"], reads)
    if request.get("env"):
        answer["env"] = env
    if request.get("builds"):
        answer["builds"] = builds
    if request.get("libraries"):
        answer["libraries"] = libraries(request["libraries"], reads, roots)
        answer["library_versions"] = _versions(request["libraries"], roots)
    answer["reads"] = reads.as_dict()
    if reads.unparsed:
        answer["unparsed"] = sorted(set(reads.unparsed))
    return answer


def _versions(request, roots):
    """{package: [installed version]} of the ``libraries`` request's packages (None: not
    installed), from the dist-info next to each import root."""
    out = {}
    for package in request.get("packages", []):
        root = roots.get(package)
        out[package] = None if root is None else sorted({v for _, v in dist_infos(package, [root]) if v})
    return out


def libraries(request, reads, roots):
    """For ``sources``: speculators' training-side modules and what they reach in other
    libraries. From each ``start`` module (``pkg.*``: every module of that package), the speculators modules its imports run
    (``walk_import_path``); then, for each package of ``packages`` installed, the files
    that resolve every name those modules import from it or call through an imported
    module (``library_references``), classes' bases followed across the packages (a
    transformers layer derives from torch's ``nn.Module``).
    Returns {"speculators": {path: base64}, "packages": {path: base64 or None}}: the
    library files with their function bodies elided (``slim``; every line keeps its number)."""
    spec_root = roots["speculators"]

    def listdir(rel):
        found = reads.listing("py_tree", os.path.join(spec_root, rel), _py_tree)
        return sorted(os.path.relpath(p, spec_root) for p in found)

    start = []
    for module in request["start"]:
        if module.endswith(".*"):  # every module of that package
            for path in listdir(module[:-2].replace(".", "/")):
                name = path[:-3].replace(os.sep, ".")
                start.append(name[: -len(".__init__")] if name.endswith(".__init__") else name)
        else:
            start.append(module)
    files, _ = walk_import_path(lambda p: reads.read(os.path.join(spec_root, p)), listdir, start)
    packages = [p for p in request.get("packages", []) if roots.get(p)]
    seeds = []
    for data in files.values():
        if data is None:
            continue
        try:
            seeds += library_references(ast.parse(data), packages)
        except (SyntaxError, ValueError):
            pass

    def read(path):
        root = roots.get(path.split("/", 1)[0])
        return reads.read(os.path.join(root, path)) if root else None

    trees = {}
    found = collect_sources(read, seeds, tuple(packages), limit=request.get("limit") or 1200, trees_out=trees)
    return {
        "speculators": {p: to_b64(d) for p, d in files.items() if d is not None},
        # function bodies elided, line numbers kept (``slim``): the check reads no body
        "packages": {p: to_b64(d if d is None or p not in trees else slim(d, trees[p])) for p, d in found.items()},
    }


def import_path(request, reads=None):
    """For ``sources``: speculators' files on the import path of ``start``, and for every
    package named in ``packages`` the files that resolve what those modules import;
    "broken": ``walk_import_path``'s. ``reads``: a ``_Reads`` that records what was read."""
    spec_root = package_root("speculators")
    reads = reads or _Reads({})

    def listdir(rel):
        found = reads.listing("py_tree", os.path.join(spec_root, rel), _py_tree)
        return sorted(os.path.relpath(p, spec_root) for p in found)

    broken = []
    read = lambda p: reads.read(os.path.join(spec_root, p))  # noqa: E731
    files, external = walk_import_path(read, listdir, request["start"], failed=reads.unparsed, broken=broken)
    packages = {}
    for package in request.get("packages", []):
        root = package_root(package)
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
        found = collect_sources(lambda p, r=root: reads.read(os.path.join(r, p)), seeds, package, failed=reads.unparsed)
        packages[package] = {p: to_b64(d) for p, d in found.items()}
    return {
        "speculators": {p: to_b64(d) for p, d in files.items()},
        "packages": packages,
        "broken": broken,
    }
