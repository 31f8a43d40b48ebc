"""Reading a study, after or while it runs: ``views.py`` (``hpo status``, ``hpo best``, ``hpo logs``),
``studies.py`` (``hpo studies``, the studies a storage holds, and ``hpo delete``), ``report.py`` (the
HTML page, CSV and plots), ``dashboard.py`` (optuna-dashboard on the study's storage) and ``tunnel.py``
(the ssh commands that bring the dashboards to a laptop). It reads what dispatch writes (the lease,
the Ray rendezvous); dispatch never imports it, and a launch's live progress line is dispatch's own."""
