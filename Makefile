# Kiln: `make up` runs the platform, `make test` runs the whole test suite.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export PYTHONPATH := $(CURDIR):$(CURDIR)/platform

.PHONY: up test install frontend test-python test-frontend lint bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,openvino,litert]'
	touch $(STAMP)

install: $(STAMP)

frontend: $(STAMP)
	bash frontend/build.sh

# Without Node the API, worker and agent still run; the page at / says how to build the UI.
up: install
	bash frontend/build.sh || echo "warning: the web UI was not built (needs Node 18+); the API still runs."
	$(PY) platform/manage.py up

test: install frontend lint test-frontend test-python

test-frontend: frontend
	cd frontend && . .nodeenv/bin/activate && npm test

# KILN_DATA_DIR keeps test blobs and the SQLite test database away from a running `make up`.
test-python: install
	KILN_DATA_DIR=$${KILN_DATA_DIR:-$(CURDIR)/var/test} $(PY) -m pytest $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check platform workers devices tests benchmarks

bench: install
	$(PY) benchmarks/agent_overhead.py
	$(PY) benchmarks/quantization.py
	$(PY) benchmarks/latency_estimate.py
	$(PY) benchmarks/litert.py

clean:
	rm -rf var/test frontend/dist
