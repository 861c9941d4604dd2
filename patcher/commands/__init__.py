"""The verbs -- apply, diff, status, verify, revert -- as functions that return data.

Each takes a transport and a snapshot (``patcher.engine.read_snapshot``) and holds every
rule of its verb: what it refuses (an unsupported target, a user patch edited since it was
applied), what it asks the engine for, and the rows and states it reports. The command line
(``patcher.cli``) renders what they return; the Ansible collection's action plugins call
the same functions, so a rule written here holds for both.
"""
