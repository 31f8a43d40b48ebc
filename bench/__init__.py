"""Benchmarks: ``python -m bench all`` (see __main__), or one module as ``python -m bench.NAME``,
run from the repository's root (the package is imported as ``bench``, never as loose scripts)."""
