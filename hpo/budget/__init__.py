"""What a study may spend, and when it stops: whether another trial may start (``admission.py``,
the one place that decides it for every backend), the compute budget (``compute.py``), the rules
that end a study once it stops improving (``stopping.py``) and fail fast (``failing.py``)."""
