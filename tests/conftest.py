"""Test configuration: a private kernel cache per test session (unless one is given)."""

import os
import tempfile

import numpy as np
import pytest

if not os.environ.get("LAZYTENSOR_CACHE_DIR"):
    os.environ["LAZYTENSOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="lazytensor-test-cache-")


@pytest.fixture
def rng(request):
    """A fresh random generator per test; the seed is printed on failure."""
    seed = int.from_bytes(os.urandom(4), "little")
    request.node.user_properties.append(("seed", seed))
    print(f"random seed: {seed}")
    return np.random.default_rng(seed)
