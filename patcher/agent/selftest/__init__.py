"""selftest's target side: runs under the target's interpreter (see ``launch.py``)."""
