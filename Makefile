# gpufleet.proxmox — everything runs from this checkout, as root, on Debian 12 / Ubuntu 24.04.
#   make demo   install what is needed, bring the lab up, run site.yml on it (gpufleet up: its verification table)
#   make test   every test: unit, planted bugs, lab integration, molecule scenarios, ansible-lint (production
#               profile), ansible-test sanity, and the newest ansible-core on Python 3.13 (unit, a lab run); the
#               checks that need no lab run beside the lab's suites (tests/all.sh)
PYTHON ?= python3
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
export PATH := $(BIN):$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg

APT_PACKAGES := python3 python3-venv python3-dev gcc lxc debootstrap openssh-server openssh-client \
	nftables iproute2 uidmap ca-certificates shellcheck zstd chromium

.PHONY: demo test newest-unit newest-lab deps venv lab-up lab-down lab-status unit integration molecule lint sanity bench clean planted mutants newest

demo: deps venv lab-up
	gpufleet up -i inventories/lab
	gpufleet lab status

test: deps venv lab-up
	MAKE='$(MAKE)' tests/all.sh

deps:
	@missing=$$(for p in $(APT_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null \
		| grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing: $$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@

lab-up: venv
	gpufleet lab up

lab-down: venv
	gpufleet lab down

lab-status: venv
	gpufleet lab status

unit: venv
	python -m pytest -q tests/unit

# the bugs that matter, planted one at a time in a copy of the checkout: the unit suite must fail on each (docs/testing.md)
planted: venv
	python tests/planted/run.py

# mutmut on the core modules against the unit suite (not in make test: see docs/testing.md for its time and survivors)
mutants: venv
	python -m pip install -q mutmut
	python tests/mutants/run.py

integration: venv lab-up
	python -m pytest -q --durations=40 tests/integration

molecule: venv lab-up
	molecule test --all

lint: venv
	ansible-lint --profile production

sanity: venv
	tests/sanity/run.sh

# the newest ansible-core pyproject.toml allows, on Python 3.13 (a Debian 13 root from the lab's base): the unit suite,
# and gpufleet up, drift and verify on the lab
newest: venv lab-up
	tests/newest/run.sh smoke

# the two halves of newest, as make test runs them: the unit suite needs only the lab's cached Debian 13 base
newest-unit: venv
	tests/newest/run.sh unit

newest-lab: venv lab-up
	tests/newest/run.sh lab

bench: venv lab-up
	python bench/lab_bench.py
	python bench/reconcile_bench.py
	python bench/venv_bench.py

clean:
	rm -rf $(VENV) .pytest_cache
