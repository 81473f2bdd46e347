# Coupon Center. `make run` starts everything on embedded defaults; `make test` runs the suite.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PORT ?= 8000
HOST ?= 127.0.0.1
# Development settings for everything started from here (production defaults DEBUG to off).
export DEBUG ?= 1

.PHONY: install run test test-chaos lint format bench clean

$(VENV)/.installed: pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python 3.11+ is needed (set PYTHON=...)")'
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[dev]'
	@touch $@

install: $(VENV)/.installed

run: install
	$(PY) manage.py migrate --noinput
	$(PY) manage.py seed_demo
	$(PY) manage.py run_embedded_redis --stop
	$(PY) manage.py ensure_demo_admin --url http://$(HOST):$(PORT)/admin/
	WEB_PORT=$(PORT) WEB_HOST=$(HOST) COUPONCENTER_REDIS_AUTOSTART=0 $(VENV)/bin/honcho start -f Procfile

test: install
	$(VENV)/bin/pytest

test-chaos: install
	$(VENV)/bin/pytest tests/chaos

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

format: install
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

bench: install
	$(PY) manage.py bench_all

clean:
	rm -rf var/ .pytest_cache .ruff_cache
