# Two commands do all the set-up: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYCUDA := $(VENV)/.pycuda

.PHONY: demo test test-cuda test-distributed test-compat soak bench gpu-check lint clean \
	tutorials tutorials-save docs

$(PY):
	$(PYTHON) -m venv $(VENV)

# torch first, pinned to the CPU build held locally, so that no CUDA build is pulled.
$(STAMP): $(PY) pyproject.toml
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m examples.demo

# The suite runs in JOBS processes (pytest-xdist), one test file per process at a time
# (its module fixtures built once), all sharing one kernel cache (tests/conftest.py).
# JOBS=0 runs it in this process.
JOBS ?= 2
XDIST = $(if $(filter-out 0,$(JOBS)),-n $(JOBS) --dist loadfile)

# The CUDA runtime tests (marked `cuda`) run the generated kernels on a GPU, or on the
# emulator in tests/cuda_emulator through pycuda built against its fake driver: slower, so
# a target of their own. Without nvcc they are skipped, saying why.
test: $(STAMP)
	@echo "make test: the suite takes 11 to 18 minutes on 2 cores; skipped groups are summarized at the end"
	$(PY) -m pytest -q -p no:cacheprovider $(XDIST) -m "not cuda and not distributed" tests

test-cuda: $(PYCUDA)
	$(PY) -m pytest -q -p no:cacheprovider $(XDIST) -m cuda tests

# pycuda 2026.1, built once into build/wheels (a source archive on the package index)
$(PYCUDA): $(STAMP) tools/build_pycuda.py
	$(PY) -m tools.build_pycuda
	touch $(PYCUDA)

# several processes: gloo ranks on loopback, a Dask LocalCluster (about a minute)
test-distributed: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -m distributed tests

# The pykeops drop-in alone (also part of `make test`): pykeops's own test files through the
# alias, the alias and the API it needs, geomloss and GPyTorch on lazytensor.
test-compat: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -rx tests/test_compat_pykeops.py tests/test_keops_api.py \
		tests/test_pykeops_suite.py tests/test_clients.py

# Not part of CI: every test that takes the `rng` fixture and puts float32 to the test, over
# SOAK_SEEDS fresh seeds each (one process per core; each kernel compiled once for all the
# seeds), then a table: runs and failures per file, failing seeds per test (tests/soak.py).
# Run it after any change to code generation, a reduction or a tolerance (CONTRIBUTING.md).
# A subset: `make soak SOAK_TESTS=tests/test_x.py SOAK_K=float32 SOAK_SEEDS=50`.
SOAK_SEEDS ?= 200
SOAK_TESTS ?= tests
SOAK_K ?=
SOAK_MARK ?= not cuda and not distributed
soak: $(STAMP)
	LAZYTENSOR_SOAK=$(SOAK_SEEDS) $(PY) -m pytest -q -p no:cacheprovider --tb=line \
		$(if $(filter-out 0,$(JOBS)),-n $(JOBS)) -m "$(SOAK_MARK)" \
		$(if $(SOAK_K),-k "$(SOAK_K)") $(SOAK_TESTS)

bench: $(STAMP)
	$(PY) -m benchmarks.bench

gpu-check: $(PYCUDA)
	$(PY) -m tools.gpu_check

# Every tutorial notebook in a fresh kernel with an empty kernel cache; fails on an error cell.
tutorials: $(STAMP)
	$(PY) -m tools.tutorials

# The same, saving the outputs and figures into the notebooks (to commit them).
tutorials-save: $(STAMP)
	$(PY) -m tools.tutorials --write

DOCS_STAMP := $(VENV)/.docs-installed
$(DOCS_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[docs]'
	touch $(DOCS_STAMP)

# The API reference, built from the docstrings; fails on a broken cross-reference.
docs: $(DOCS_STAMP)
	$(PY) -m sphinx -b html -W -n --keep-going -q docs docs/_build/html
	@echo "API reference: docs/_build/html/index.html"

lint: $(STAMP)
	$(PY) -m pip install -q ruff
	$(PY) -m ruff check lazytensor codegen cache tests benchmarks examples tools

clean:
	rm -rf $(VENV) build *.egg-info  # build/ holds the pycuda wheel and the emulator
