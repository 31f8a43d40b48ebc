"""Slurm specifics: submitit executors (and sbatch scripts), sacct accounting, the detached launcher."""
