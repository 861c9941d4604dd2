"""Patches written by users: ``--patch-file FILE`` and installed packs.

``loader``: load a patch file or the entry-point group ``speculators_patch.patches`` into
``Patch`` objects with their origin and source digest. ``record``: what the manifest keeps
about each applied user patch (so ``status``/``revert`` work without the source at hand,
and ``verify`` notices a source changed since). ``template``: ``speculators-patch new``.
"""
