# magi_lp: `make run` and `make test` set everything up on first use.
# The virtualenv is rebuilt only when requirements.txt or setup.py change.
VENV      := .venv
PY        := $(VENV)/bin/python
STAMP     := $(VENV)/.installed
WORKDIR   ?= runs/reacher_hard_distributed
CONFIG    ?= configs/reacher_hard_distributed.py
PYTEST_ARGS ?=

.PHONY: setup run test lint format bench bench-quick clean

setup: $(STAMP)

$(STAMP): requirements.txt setup.py scripts/setup_venv.sh
	@bash scripts/setup_venv.sh $(VENV)
	@touch $(STAMP)

run: $(STAMP)
	$(PY) projects/drq_v2/lp_main.py --config $(CONFIG) --workdir $(WORKDIR)

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

bench: $(STAMP)
	$(PY) -m benchmarks.run

bench-quick: $(STAMP)
	$(PY) -m benchmarks.run --quick

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
