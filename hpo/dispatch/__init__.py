"""Running a study's trials: the checks before a launch, the shared launch set-up, per-trial jobs,
``--workers``, the Ray backend, one launcher per study (the lease), and ``hpo cancel``."""
