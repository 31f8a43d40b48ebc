"""Benchmarks: ``python -m bench all`` (see __main__)."""
