"""How the controller reaches a target's agent: locally, over SSH, or through an ``--exec`` command."""
