"""The verbs -- apply, diff, status, verify, revert, repair, list, selftest -- one module
each, as functions that return a result object: its data, its ``exit_code``, its one-line
``summary`` and its ``outcome`` in a run over several hosts.

Each takes what it works on (a transport and a snapshot from ``patcher.engine.read_snapshot``;
``repair`` reads its own, ``list`` reads no target) and holds every rule of its verb: what it
refuses (an unsupported target, a user patch edited since it was applied), what it asks the
engine for, the rows and states it reports, and its one-line summary (``common.notes``: what
to know about the install whatever the verb). The command line (``patcher.cli``) lays out
what they return; the Ansible collection's action plugins call the same functions and say the
same summaries and notes, so a rule or a sentence written here holds for both.
"""
