# HAPI: the two commands are `make demo` and `make test`; both install everything first.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.hapi-installed
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# Wait (up to 10 min) for another apt/dpkg process to release its lock instead of failing. The
# option covers the dpkg frontend lock of `install`; the lists lock of `update` has no wait option
# in apt 2.6 (checked: it fails at once), hence the retry loop around `update`.
APT_GET := apt-get -o DPkg::Lock::Timeout=600

.PHONY: install system-deps demo test suite lint style typecheck bench stack-up stack-down clean compose-check swift-functional

install: $(STAMP) system-deps

# On a GPU machine that already has torch >= 2.11 the venv reuses it (--system-site-packages);
# elsewhere it gets the pinned pair, which pip installs from local files on this kind of machine.
$(STAMP): pyproject.toml examples/hapi-model-plugin/pyproject.toml
	@if $(PYTHON) -c 'import sys, torch; v = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]); sys.exit(0 if v >= (2, 11) and torch.cuda.is_available() else 1)' 2>/dev/null; then \
		echo "== using the system torch (GPU machine)"; \
		$(PYTHON) -m venv --system-site-packages $(VENV); \
	else \
		$(PYTHON) -m venv $(VENV); \
		echo "== installing torch==2.14.1 torchvision==0.29.1 (about 90 s)"; \
		$(PIP) install --quiet torch==2.14.1 torchvision==0.29.1; \
	fi
	$(PIP) install --quiet -e '.[dev]' -e examples/hapi-model-plugin
	@touch $(STAMP)

system-deps:
	@missing=""; \
	command -v memcached >/dev/null || missing="$$missing memcached"; \
	[ -d /usr/share/datasets/fashion-mnist ] || missing="$$missing dataset-fashion-mnist"; \
	command -v docker-compose >/dev/null || missing="$$missing docker-compose"; \
	if [ -n "$$missing" ]; then \
		echo "== apt-get install$$missing"; \
		for try in $$(seq 60); do $(SUDO) $(APT_GET) update -q && break; \
			[ $$try = 60 ] && exit 1; echo "== apt is busy (another apt holds its lock?), retrying in 10 s"; sleep 10; done; \
		$(SUDO) $(APT_GET) install -y -q $$missing; \
	fi

# ruff first: a formatting slip fails in a second, before the suite's long end-to-end tests; mypy
# (about 40 s of one core) runs beside the suite, whose start-up waits on imports and servers, and
# either one failing fails `make test`.
# Two workers (pytest-xdist), a test file each at a time: a file's module fixtures (its servers,
# its uploads) start once, and much of the suite waits on servers, proxies and torchrun jobs
# rather than computing. Files are handed out in tests/conftest.py's order (the longest first),
# not xdist's (the most tests first). TEST_WORKERS=0 runs it in this process.
TEST_WORKERS ?= 2
test: install style
	@$(MAKE) --no-print-directory -j2 typecheck suite

suite: install
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

lint: style typecheck

style: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: install
	$(VENV)/bin/mypy models hapi_contract hapi_core hapi_server hapi_client hapi_stack hapi_cli swift_middleware benchmarks

demo: install
	$(VENV)/bin/hapi demo

bench: install
	$(VENV)/bin/hapi bench all --quick

stack-up: install
	$(VENV)/bin/hapi stack up

# Builds the compose file's images, runs the stack and the README's container commands, then
# removes what it started (about 15 min here; not part of `make test`). See docs/docker.md.
compose-check:
	bash scripts/compose_check.sh

# Swift's own functional tests through a proxy without the HAPI filter, with it decoupled and with
# it in_proxy; the three runs must pass, fail and skip the same tests (about 8 min here; not part
# of `make test`). See docs/swift-functional.md.
swift-functional: $(STAMP)
	bash scripts/swift_functional.sh

stack-down:
	$(VENV)/bin/hapi stack down

clean:
	-$(VENV)/bin/hapi stack down
	rm -rf $(VENV) .hapi bench-results
