"""The Ray backend: Ray Tune inside one Slurm allocation (or a local Ray instance), same storage."""
