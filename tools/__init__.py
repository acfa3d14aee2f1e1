"""Tools for developers: the GPU check and the tutorials runner (not installed with the package)."""
