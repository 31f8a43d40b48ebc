"""What a study may spend, and when it stops. ``admission.py`` is the one answer, for every backend,
to whether another trial may start and why not (the timeout, ``hpo cancel``, fail fast, the stop
rules, the compute budget, a worker job's time left), with ``Gate``, a launcher's memory of it;
``compute.py`` the GPU- or CPU-hour budget (spent, and what the trials in flight will still cost);
``cost.py`` what a study's trials cost, measured or estimated; ``stopping.py`` the patience rule and
Optuna's Terminator; ``failing.py`` fail fast (a launch whose first trials fail the same way stops)."""
