"""Examples of lazytensor (not installed with the package)."""
