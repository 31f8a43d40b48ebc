"""A FIFO job queue on one machine and its executor plugin for slurm-hpo (see pyproject.toml)."""
