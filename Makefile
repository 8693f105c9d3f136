# The two commands (see README):
#   make demo   set up a fresh machine and run the main job on the embedded default model
#   make test   set up a fresh machine (Debian toolchains included) and pass the tests

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
DT     := $(VENV)/bin/deploytool
MODEL  := deploytool/data/squeezenet1.0.onnx
OUT    ?= out
APT_PACKAGES := gcc-aarch64-linux-gnu g++-aarch64-linux-gnu binutils-aarch64-linux-gnu qemu-user \
                g++-arm-linux-gnueabihf binutils-arm-linux-gnueabihf \
                gcc-arm-none-eabi libnewlib-arm-none-eabi qemu-system-arm cmake
# CI tier: everything but the long benchmarks. PYTEST_ARGS adds to it (e.g. -m fast).
PYTEST_ARGS ?=

.PHONY: setup toolchains demo test test-fast test-slow bench bench-tuned clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade "pip>=24"
	$(VENV)/bin/pip install -q -e ".[test,cuda]"
	touch $@

setup: $(VENV)/.installed

toolchains:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  echo "installing Debian packages:$$missing"; \
	  $$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q --no-install-recommends $$missing; \
	fi

# The demo replays the shipped tuning log for the most capable portable preset this machine runs
# (x86-avx512, else x86-avx2); elsewhere it tunes the model briefly for this CPU first (a few
# minutes), then builds from that log.
demo: setup
	mkdir -p $(OUT)
	$(DT) inspect $(MODEL)
	@preset=$$($(PY) -c "from deploytool import targets as t; print(t.portable_preset() or 'x86')"); \
	log=tuning_logs/squeezenet1.0-$$preset.jsonl; [ -f "$$log" ] || log=$$log.gz; \
	if [ ! -f "$$log" ]; then preset=x86; log=$(OUT)/squeezenet1.0-x86.jsonl; set -x; \
	  $(DT) tune $(MODEL) --target x86 --trials 320 -o $$log || exit 1; set +x; fi; \
	set -ex; \
	$(DT) logs show $$log | head -12; \
	$(DT) compile $(MODEL) --target $$preset --tuning-log $$log --require-tuned -o $(OUT)/squeezenet.so; \
	$(DT) run $(OUT)/squeezenet.so --check $(MODEL); \
	$(DT) bench $(OUT)/squeezenet.so --compare $(MODEL)

test: toolchains setup
	$(PY) -m pytest -n 2 --dist loadgroup -m "not slow and not gpu" $(PYTEST_ARGS)

test-fast: setup
	$(PY) -m pytest -m fast $(PYTEST_ARGS)

test-slow: toolchains setup
	$(PY) -m pytest -n 2 --dist loadgroup -m "slow and not gpu" $(PYTEST_ARGS)

bench: setup
	$(PY) bench/untuned.py

bench-tuned: setup
	$(PY) bench/tuned.py

clean:
	rm -rf $(OUT) .pytest_cache
