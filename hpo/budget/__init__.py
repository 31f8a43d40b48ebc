"""What a study may spend, and when it stops spending: the compute budget (``compute.py``) and
the rules that end a study once it stops improving (``stopping.py``)."""
