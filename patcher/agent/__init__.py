"""Code that runs on the target machine, under the target's own interpreter.

It is sent there as source text (``python -c``), never installed or imported from this
package on the target. The agent (``main``, ``inspect``, ``state``, ``commit``, ``sources``,
``run_python``, ``common``, ``pysource``; standard library only, Python 3.8+) answers the controller's
requests: read files, commit a patch set all-or-nothing, read what ``verify`` checks.
``loader.py`` starts it from the sources the controller sends, ``bootstrap.py`` resolves
the target on a remote side first, ``runtime_probe.py`` imports vLLM for ``verify
--runtime``, and ``selftest/`` (with the target's torch, transformers and vLLM) is
``selftest``'s check.

Two modules are what both sides run, and the only ones the controller imports:
``pysource`` (the parser) and ``bootstrap`` (``resolve``, the target rule).
"""
