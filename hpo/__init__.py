"""HPO service for Slurm GPU clusters: Optuna or Ray Tune studies whose trials run the trainer."""

__version__ = "0.1.0"
