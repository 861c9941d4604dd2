"""Starts the agent under the target's interpreter from the sources the controller sent.

The controller sends this file's text followed by one call, ``run(packed(BLOB), DIGEST)``
(``patcher.connect.program``), as one ``python -c`` argument: ``packed(BLOB)`` is the agent's
modules, ``(name, text)`` in the order they import each other, and ``DIGEST`` their sha256.
``run`` makes them the package ``speculators_patch_agent`` in ``sys.modules`` (their
relative imports resolve there; nothing is installed or written on the target but the
compiled code) and calls ``main.main()``.

Compiling the agent (1,700 lines) took ~20 ms of the target's CPU on every run, the largest
part of its start. Like Python's own ``__pycache__``, the compiled code is kept on the
machine that runs it, in ``~/.cache/speculators-patch/agent`` (0700), named by ``DIGEST`` and
the interpreter's cache tag, written atomically; a cache that cannot be read or written only
means compiling again. Standard library only, Python 3.8+.
"""

import marshal as _marshal
import os as _os
import sys as _sys
import types as _types

PACKAGE = "speculators_patch_agent"


def _codes(sources, digest):
    """``{name: code}`` of ``sources``, from the compiled-code cache when it has them."""
    tag = getattr(_sys.implementation, "cache_tag", None)
    folder = _os.path.join(
        _os.environ.get("XDG_CACHE_HOME") or _os.path.join(_os.path.expanduser("~"), ".cache"),
        "speculators-patch",
        "agent",
    )
    path = _os.path.join(folder, "%s.%s.bin" % (digest, tag))
    if tag:
        try:
            with open(path, "rb") as f:
                codes = _marshal.load(f)
            if isinstance(codes, dict) and all(name in codes for name, _ in sources):
                return codes
        except (OSError, EOFError, ValueError, TypeError):
            pass
    codes = {name: compile(text, "agent/%s.py" % name, "exec") for name, text in sources}
    if tag:
        tmp = "%s.%d.tmp" % (path, _os.getpid())
        try:
            _os.makedirs(folder, mode=0o700, exist_ok=True)
            with open(tmp, "wb") as f:
                _marshal.dump(codes, f)
            _os.replace(tmp, path)
        except OSError:
            try:
                _os.unlink(tmp)
            except OSError:
                pass
    return codes


def packed(blob):
    """The agent's sources as ``AGENT_PROGRAM`` carries them: ``(name, text)`` pairs as JSON,
    zlib-compressed, base64 (so the one ``python -c`` argument stays far below Linux's limit on
    a single argument, 128 KiB: ``MAX_ARG_STRLEN``; the plain sources are about that size)."""
    import base64
    import json
    import zlib

    return [tuple(pair) for pair in json.loads(zlib.decompress(base64.b64decode(blob)).decode("utf-8"))]


def load(sources, digest):
    """The agent's package, its modules run in order; returns the package module."""
    codes = _codes(sources, digest)
    package = _types.ModuleType(PACKAGE)
    package.__path__ = []
    _sys.modules[PACKAGE] = package
    for name, _ in sources:
        module = _types.ModuleType("%s.%s" % (PACKAGE, name))
        module.__package__ = PACKAGE
        _sys.modules[module.__name__] = module
        setattr(package, name, module)
        exec(codes[name], module.__dict__)
    return package


def too_old():
    """The refusal of an interpreter older than 3.8, the same on every transport (the
    bootstrap says it in the same words when its own Python is too old), or None."""
    if _sys.version_info[:2] >= (3, 8):
        return None
    return "the agent needs Python 3.8+: %s is Python %d.%d; nothing was read or changed" % (
        _sys.executable or "this interpreter",
        _sys.version_info[0],
        _sys.version_info[1],
    )


def run(sources, digest):
    """Load the agent and answer requests until stdin ends. An interpreter older than 3.8
    answers the marker and one JSON error line instead, before anything is compiled, read
    or written (this file stays Python 2 parseable for that)."""
    refusal = too_old()
    if refusal is not None:
        import json

        marker = [a for a in _sys.argv[1:] if a.startswith("speculators-patch-agent-")]
        _sys.stdout.write("\n%s\n%s\n" % (marker[0] if marker else "", json.dumps({"error": refusal})))
        _sys.stdout.flush()
        _sys.exit(3)
    load(sources, digest).main.main()
