"""The two-phase step that SP005 writes and SP025 recognises, written out once.

SP005 rewrites each ``self.executor.execute_model(scheduler_output)`` statement of the
generator into ``TWO_PHASE``; SP025 accepts the flush it adds after the step loop either as it
writes it or as SP005 leaves it when SP005 runs after it (its one statement as ``TWO_PHASE``).
The emitted bytes are pinned by tests/patches/test_codemod_audit.py: a change here changes what
SP005 writes and what SP025 accepts. Not a patch: it defines no ``PATCH``.
"""

TWO_PHASE = """\
model_output = self.executor.execute_model(scheduler_output)
if model_output is None and hasattr(self.executor, "sample_tokens"):
    # vLLM >= 0.12: a step is execute_model() then sample_tokens().
    self.executor.sample_tokens(None)
"""
