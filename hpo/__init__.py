"""HPO service for Slurm GPU clusters: Optuna or Ray Tune studies whose trials run your own
training code (a command, the hpo.trial API, a Python function) or the built-in ResNet trainer."""

__version__ = "0.1.0"
