"""Slurm specifics: submitit executors and cluster checks, sacct accounting, the detached launcher."""
