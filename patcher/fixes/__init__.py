"""What a fix is and where fixes come from: ``Patch`` and its vLLM facts (``patch``), the
codemod bases (``codemod_base``, the declarative ``codemods``, ``cst_helpers``), the probes
that read a fact from vLLM's source (``probes`` over ``library_source``), the registry of
shipped patches, installed packs and ``--patch-file`` files (``registry``, ``patch_index``,
``userpatches``). The fixes themselves are the modules of ``patches/``, one per fix."""
