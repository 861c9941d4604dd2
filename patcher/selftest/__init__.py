"""``speculators-patch selftest``: proof on the user's own box.

``command`` runs on the controller (sends the check, relays progress, judges the report);
``remote/`` runs under the target's interpreter with its torch, transformers and vLLM
(tiny models, speculators' own generator, the transformers reference, the comparison).
"""
