# Two commands do all the set-up: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-distributed bench gpu-check lint clean

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

test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -m "not distributed" tests

# several processes: gloo ranks on loopback, a Dask LocalCluster (about a minute)
test-distributed: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -m distributed tests

bench: $(STAMP)
	$(PY) -m benchmarks.bench

gpu-check: $(STAMP)
	$(PY) -m tools.gpu_check

lint: $(STAMP)
	$(PY) -m pip install -q ruff
	$(PY) -m ruff check lazytensor codegen cache tests benchmarks examples tools

clean:
	rm -rf $(VENV) build *.egg-info
