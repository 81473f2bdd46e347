# Coupon Center. `make run` starts everything on embedded defaults; `make test` runs the suite.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PORT ?= 8000
HOST ?= 127.0.0.1
# Development settings for everything started from here (production defaults DEBUG to off).
export DEBUG ?= 1

.PHONY: install lock run test test-chaos lint format bench wrk nginx clean admin-password

# The locked versions (requirements.lock, from `make lock`), installed by uv: a few seconds where
# pip takes minutes. uv comes from PATH, or is bootstrapped into the venv; pip is the fallback.
$(VENV)/.installed: pyproject.toml requirements.lock
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python 3.11+ is needed (set PYTHON=...)")'
	$(PYTHON) -m venv $(VENV)
	@UV="$$(command -v uv || true)"; \
	if [ -z "$$UV" ] && $(VENV)/bin/python -m pip install --quiet --disable-pip-version-check uv 2>/dev/null; then UV=$(VENV)/bin/uv; fi; \
	if [ -n "$$UV" ]; then \
	  echo "installing the locked versions with $$UV"; \
	  "$$UV" pip install --quiet --python $(VENV)/bin/python -r requirements.lock && \
	  "$$UV" pip install --quiet --python $(VENV)/bin/python --no-deps -e . ; \
	else \
	  echo "uv unavailable: installing with pip (slower)"; \
	  $(VENV)/bin/pip install --quiet -r requirements.lock && $(VENV)/bin/pip install --quiet --no-deps -e . ; \
	fi
	@touch $@

install: $(VENV)/.installed

# Re-resolve requirements.lock from pyproject.toml (after changing a dependency).
lock: install
	$$(command -v uv || echo $(VENV)/bin/uv) pip compile --quiet pyproject.toml --extra dev -o requirements.lock

# Every process writes its Prometheus metrics here, so /metrics shows all of them (emptied on
# each start: the files of processes that are gone would count forever).
METRICS_DIR := var/prometheus

run: install
	$(PY) manage.py migrate --noinput
	$(PY) manage.py seed_demo --url http://$(HOST):$(PORT)
	$(PY) manage.py run_embedded_redis --stop
	$(PY) manage.py ensure_demo_admin --url http://$(HOST):$(PORT)/admin/
	rm -rf $(METRICS_DIR) && mkdir -p $(METRICS_DIR)
	WEB_PORT=$(PORT) WEB_HOST=$(HOST) COUPONCENTER_REDIS_AUTOSTART=0 \
	  PROMETHEUS_MULTIPROC_DIR=$(CURDIR)/$(METRICS_DIR) $(VENV)/bin/honcho start -f Procfile

# A new password for the demo admin of `make run` (it is kept from run to run otherwise).
admin-password: install
	$(PY) manage.py ensure_demo_admin --reset --url http://$(HOST):$(PORT)/admin/

# The suite in TEST_PROCESSES processes (pytest-xdist; each has its own test database, and every
# test its own Redis key prefix), a file's tests in one process; then the tests marked `alone`, one
# after the other with nothing beside them: the benchmarks in small form, which load the machine
# on purpose, the ones that change a server-wide setting (autovacuum), and the ones that compare
# the whole Redis database before and after. Most tests wait on the processes they start, so
# three processes fit two cores. A failing first part still runs the second; the exit status is
# the first failure's.
TEST_PROCESSES ?= 3
test: install
	@status=0; \
	$(VENV)/bin/pytest -n $(TEST_PROCESSES) --dist loadfile -m "not alone" || status=$$?; \
	$(VENV)/bin/pytest -m alone || { s=$$?; [ $$status -ne 0 ] || status=$$s; }; \
	exit $$status

test-chaos: install
	$(VENV)/bin/pytest tests/chaos

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	$(PY) bin/check-imports
	$(PY) bin/check-duplicates
	$(VENV)/bin/mypy

format: install
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

bench: install wrk nginx
	$(PY) manage.py bench_all

# The HTTP benchmarks' load generator, from Debian's packages.
wrk:
	@command -v wrk >/dev/null && exit 0; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null; \
	else \
	  echo "wrk is not installed: run 'sudo apt-get install wrk' (Debian/Ubuntu), then make bench again"; exit 1; \
	fi

# The fan-out benchmark's fast receiver (bench_fanout), from Debian's packages; the benchmark
# starts and stops its own nginx, never the system service.
nginx:
	@command -v nginx >/dev/null || test -x /usr/sbin/nginx && exit 0; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light >/dev/null; \
	else \
	  echo "nginx is not installed: run 'sudo apt-get install nginx-light' (Debian/Ubuntu), then make bench again"; exit 1; \
	fi

clean:
	rm -rf var/ .pytest_cache .ruff_cache
