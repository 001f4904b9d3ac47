# Two commands do all the set-up on a fresh machine:
#   make demo                 # writes a token dataset locally and streams it through a DataLoader
#   make demo URL=s3://rangestream/demo ENDPOINT=http://127.0.0.1:9000   # the same on S3/MinIO
#   make test                 # the whole test suite (starts its own SeaweedFS S3 server, a GCS
#                             # emulator and Azurite)
# Everything is installed into .venv; torch is pinned first to its CPU build so that no
# other requirement can pull a CUDA build of several GB. Azurite (the Azure Blob emulator of
# the Azure tests) is an npm package: installed into .ci/node (gitignored) from the
# committed package-lock.json, so every clone gets the same version.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_VERSION ?= 2.13.0
URL ?=
ENDPOINT ?=
DEMO_ARGS ?=
PYTEST_ARGS ?=
# test processes: the suite mostly waits (servers, proxies with added latency, worker
# start-up), so three processes keep two cores busy; TEST_WORKERS=0 runs it in one process
TEST_WORKERS ?= 3
NPM ?= npm
AZURITE := .ci/node/node_modules/.bin/azurite-blob

.PHONY: demo test lint bench install

$(VENV)/.installed: pyproject.toml setup.py src/rangestream/layout/_chunked.c
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "torch==$(TORCH_VERSION)"
	$(PY) -m pip install --quiet -e ".[torch,ingest,hf,dask,integrations,gcs,azure,dev]"
	touch $@

$(AZURITE): .ci/node/package.json .ci/node/package-lock.json
	$(NPM) ci --prefix .ci/node --no-audit --no-fund
	touch $@

install: $(VENV)/.installed $(AZURITE)

demo: $(VENV)/.installed
	$(VENV)/bin/rangestream demo $(URL) $(if $(ENDPOINT),--endpoint-url $(ENDPOINT)) $(DEMO_ARGS)

# bytecode first: where PYTHONDONTWRITEBYTECODE is set (CI images often set it) every
# worker and rank the suite starts would compile the package again (about 0.7 s each)
test: $(VENV)/.installed $(AZURITE)
	$(PY) -m compileall -q src testkit tests > /dev/null
	$(PY) -m pytest -q -n $(TEST_WORKERS) $(PYTEST_ARGS)

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check src tests benchmarks testkit
	$(VENV)/bin/ruff format --check src tests benchmarks testkit

bench: $(VENV)/.installed
	$(PY) -m benchmarks run
