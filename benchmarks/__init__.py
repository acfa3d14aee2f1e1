"""Benchmarks of lazytensor against dense torch and pykeops (not installed with the package)."""
