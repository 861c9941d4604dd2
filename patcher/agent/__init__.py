"""Code that runs on the target machine, under the target's own interpreter.

Standard library only, Python 3.8+: it is sent there as source text (``python -c``), never
installed or imported from this package on the target. ``agent.py`` answers the
controller's requests (read files, commit a patch set all-or-nothing); ``runtime_probe.py``
imports vLLM for ``verify --runtime``. The controller (``patcher/``: CLI, engine, codemods,
transports) imports a few of the agent's pure functions to parse the same way it does.
"""
