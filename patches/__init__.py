"""The shipped fixes, one module per patch (``spNNN_name.py``, each defining ``PATCH``).

The other modules hold what several patches share, written out once (``capture_methods``,
``two_phase_step``, ...): they define no ``PATCH``, and no patch imports another patch.
"""
