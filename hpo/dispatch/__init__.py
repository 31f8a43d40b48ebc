"""Running a study's trials: the shared launch set-up, per-trial jobs, ``--workers``, and the Ray backend."""
