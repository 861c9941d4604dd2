"""Read the live signatures of vLLM objects: run by the target's interpreter, stdlib only.

``patcher.checks.runtime`` sends this file's source to the agent (op ``run_python``), which runs
it as a child of the target's interpreter, so importing vLLM (seconds, torch, logging on
stdout) never disturbs the agent's JSON exchange. Python 3.8 compatible.

Input on stdin (JSON): {"site_packages": str|None,
                        "imports": [[module, name]],
                        "targets": [[module, name, method or null]],
                        "worker": [module, class], "rpc": [method names]}
Output: one line ``@@speculators-patch-runtime@@`` followed by JSON:
  {"imports": {"module:name": null or error}, "targets": {"module:name:method": description},
   "rpc": {name: bool}, "vllm": version, "seconds": import time}
"""

import dataclasses
import importlib
import inspect
import json
import site
import sys
import time

MARKER = "@@speculators-patch-runtime@@"
KINDS = {
    inspect.Parameter.POSITIONAL_ONLY: "positional",
    inspect.Parameter.POSITIONAL_OR_KEYWORD: "any",
    inspect.Parameter.KEYWORD_ONLY: "keyword",
    inspect.Parameter.VAR_POSITIONAL: "*",
    inspect.Parameter.VAR_KEYWORD: "**",
}


def load(module, name):
    """(object, None) or (None, why it cannot be imported)."""
    try:
        mod = importlib.import_module(module)
    except Exception as e:  # any import failure is a finding to report, not a crash
        return None, "import %s failed: %s: %s" % (module, type(e).__name__, e)
    if hasattr(mod, name):
        return getattr(mod, name), None
    try:
        return importlib.import_module(module + "." + name), None
    except ImportError:
        return None, "cannot import name %s from %s" % (name, module)


def where(obj):
    try:
        path = inspect.getsourcefile(obj)
        line = inspect.getsourcelines(obj)[1]
    except (TypeError, OSError):
        return None, None
    marker = "/vllm/"
    return (path[path.rfind(marker) + 1 :] if path and marker in path else path), line


def describe(obj, method):
    target = obj if method is None else getattr(obj, method, None)
    if target is None:
        return {"missing": True}
    try:
        sig = inspect.signature(target)
    except (TypeError, ValueError) as e:
        return {"unknown": str(e)}
    params = list(sig.parameters.values())
    if (
        method is not None
        and params
        and not isinstance(inspect.getattr_static(obj, method), (staticmethod, classmethod))
    ):
        params = params[1:]  # unbound method read from the class: drop self
    extra = "error"
    if method is None and inspect.isclass(obj) and dataclasses.is_dataclass(obj):
        config = getattr(obj, "__pydantic_config__", None)
        if config is not None and config.get("extra") in (None, "ignore"):
            extra = "ignored"
    file, line = where(target if method is not None or not inspect.isclass(obj) else obj)
    return {
        "params": [[p.name, KINDS[p.kind], p.default is inspect.Parameter.empty] for p in params],
        "text": str(sig),
        "extra": extra,
        "file": file,
        "line": line,
    }


def main():
    request = json.loads(sys.stdin.read())
    if request.get("site_packages"):
        site.addsitedir(request["site_packages"])
        sys.path.insert(0, request["site_packages"])
    start = time.perf_counter()
    out = {"imports": {}, "targets": {}, "rpc": {}}
    for module, name in request["imports"]:
        out["imports"]["%s:%s" % (module, name)] = load(module, name)[1]
    for module, name, method in request["targets"]:
        obj, error = load(module, name)
        key = "%s:%s:%s" % (module, name, method or "")
        out["targets"][key] = {"missing": True, "error": error} if obj is None else describe(obj, method)
    worker, error = load(*request["worker"])
    for name in request["rpc"]:
        out["rpc"][name] = worker is not None and callable(getattr(worker, name, None))
    out["seconds"] = time.perf_counter() - start
    try:
        out["vllm"] = importlib.import_module("vllm").__version__
    except Exception as e:
        out["vllm"] = None
        out["vllm_error"] = "%s: %s" % (type(e).__name__, e)
    sys.stdout.write("\n" + MARKER + json.dumps(out) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
