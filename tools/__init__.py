"""Tools for developers: the GPU check (not installed with the package)."""
