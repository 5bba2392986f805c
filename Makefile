# eaglegen — see README.md. `make` builds build/eaglegen; `make test` runs every test;
# `make demo` runs the whole pipeline on a tiny random model; `make asan` builds and
# tests with AddressSanitizer/UBSan, `make tsan` with ThreadSanitizer; `make bench` prints CPU throughput.
#
# Modules are static libraries discovered by wildcard, so adding a .c file needs no
# edit here. Dependency rules (docs/ARCHITECTURE.md): common <- prompts, dataset,
# engine <- gen. kernels/ (CUDA) is linked only when nvcc is present.

CC      ?= cc
PYTHON  ?= /usr/bin/python3
BUILD   ?= build
OPT     ?= -O2
NVCC    ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
SAN     ?=

CFLAGS  = -std=c11 $(OPT) -g -Wall -Wextra -Werror -D_GNU_SOURCE -pthread -MMD -MP -I. $(SAN)
LDLIBS  = -ljansson -lzstd -larchive -lpcre2-8 -lm -pthread
LDFLAGS = $(SAN)

ifneq ($(NVCC),)
ifeq ($(NO_CUDA),)
HAVE_CUDA = 1
CFLAGS   += -DEG_HAVE_CUDA=1 -I$(CUDA_HOME)/include
# Machine code for sm_90 (H100/H200) and sm_120 (RTX 50xx / RTX PRO Blackwell), plus
# compute_80 PTX that the driver JIT-compiles on any other GPU of compute capability
# >= 8.0 (A100, A10, L40S, B200 ...): the kernels use nothing past sm_80 (mma.sync bf16,
# cp.async, ldmatrix). docs/CUDA.md, "What runs where".
NVGENCODE ?= -gencode arch=compute_90,code=sm_90 -gencode arch=compute_120,code=sm_120 \
             -gencode arch=compute_80,code=compute_80
NVFLAGS   = -std=c++17 -O3 -g -I. -Xcompiler -Wall,-Wextra,-Werror -MMD -MP $(NVGENCODE) \
            --expt-relaxed-constexpr
LDLIBS   += -L$(CUDA_HOME)/lib64 -L$(CUDA_HOME)/targets/x86_64-linux/lib -lcublasLt -lcublas -lcudart -lstdc++
# NCCL (the multi-GPU pipeline transport) where the toolkit or the system has it, or in
# NCCL_HOME (include/nccl.h, lib/libnccl.so[.2]: e.g. a Python nvidia-nccl wheel's
# site-packages/nvidia/nccl, which ships only libnccl.so.2); NO_NCCL=1 disables. The
# library is linked by its path, with its directory as the run path.
NCCL_HOME ?=
NCCL_H   = $(firstword $(wildcard $(if $(NCCL_HOME),$(NCCL_HOME)/include/nccl.h) $(CUDA_HOME)/include/nccl.h \
                                  /usr/include/nccl.h))
NCCL_SO  = $(firstword $(wildcard $(if $(NCCL_HOME),$(NCCL_HOME)/lib/libnccl.so $(NCCL_HOME)/lib/libnccl.so.2) \
                                  $(CUDA_HOME)/lib64/libnccl.so $(CUDA_HOME)/targets/x86_64-linux/lib/libnccl.so \
                                  /usr/lib/x86_64-linux-gnu/libnccl.so /usr/lib/x86_64-linux-gnu/libnccl.so.2))
ifneq ($(NCCL_H),)
ifneq ($(NCCL_SO),)
ifeq ($(NO_NCCL),)
HAVE_NCCL = 1
CFLAGS   += -DEG_HAVE_NCCL=1 $(if $(NCCL_HOME),-I$(NCCL_HOME)/include)
LDLIBS   += $(NCCL_SO) -Wl,-rpath,$(patsubst %/,%,$(dir $(NCCL_SO)))
endif
endif
endif
endif
endif

MODULES = common prompts dataset engine gen
define module_objs
$(patsubst %.c,$(BUILD)/%.o,$(wildcard $(1)/*.c))
endef
COMMON_OBJS  = $(call module_objs,common)
PROMPTS_OBJS = $(call module_objs,prompts)
DATASET_OBJS = $(call module_objs,dataset)
ENGINE_OBJS  = $(call module_objs,engine)
GEN_OBJS     = $(filter-out $(BUILD)/gen/main.o,$(call module_objs,gen))
KERNEL_OBJS  = $(if $(HAVE_CUDA),$(patsubst %.cu,$(BUILD)/%.o,$(wildcard kernels/*.cu)))

LIB_COMMON  = $(BUILD)/libeg_common.a
LIB_PROMPTS = $(BUILD)/libeg_prompts.a
LIB_DATASET = $(BUILD)/libeg_dataset.a
LIB_ENGINE  = $(BUILD)/libeg_engine.a
LIB_GEN     = $(BUILD)/libeg_gen.a
ALL_LIBS    = $(LIB_GEN) $(LIB_ENGINE) $(LIB_DATASET) $(LIB_PROMPTS) $(LIB_COMMON)

# A test's module is the word after "test_" in its name: tests/test_engine_ops.c
# links engine + common. gen tests link everything.
deps_common  = $(LIB_COMMON)
deps_prompts = $(LIB_PROMPTS) $(LIB_COMMON)
deps_dataset = $(LIB_DATASET) $(LIB_COMMON)
deps_engine  = $(LIB_ENGINE) $(LIB_COMMON)
deps_gen     = $(ALL_LIBS)
TEST_SRCS = $(wildcard tests/test_*.c)
TEST_BINS = $(patsubst tests/%.c,$(BUILD)/tests/%,$(TEST_SRCS))

EAGLEGEN = $(BUILD)/eaglegen

# Fuzz harnesses (tests/fuzz/fuzz_NAME.c, one per parser): `make test` links each with
# the replay driver (cc, no libFuzzer) and runs it over tests/fuzz/corpus/NAME/;
# `make fuzz` builds them with clang's libFuzzer and runs the campaign (FUZZ_S seconds
# per target; docs/ARCHITECTURE.md).
FUZZ_TARGETS = $(patsubst tests/fuzz/fuzz_%.c,%,$(wildcard tests/fuzz/fuzz_*.c))
FUZZ_REPLAY  = $(patsubst %,$(BUILD)/tests/fuzz/replay_%,$(FUZZ_TARGETS))
FUZZ_S      ?= 60
FUZZ_BUILD  ?= build-fuzz
FUZZ_CC     ?= clang

.PHONY: sweep emu all test demo asan tsan bench clean deps test-unit test-scripts fmt fuzz fuzz-bins fuzz-cov
all: $(EAGLEGEN) $(TEST_BINS) $(FUZZ_REPLAY)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/kernels/%.o: kernels/%.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c $< -o $@

$(LIB_COMMON): $(COMMON_OBJS)
$(LIB_PROMPTS): $(PROMPTS_OBJS)
$(LIB_DATASET): $(DATASET_OBJS)
$(LIB_ENGINE): $(ENGINE_OBJS) $(KERNEL_OBJS)
$(LIB_GEN): $(GEN_OBJS)
# Every library holds an empty object too, so a module with no sources yet still links.
$(BUILD)/lib%.a: $(BUILD)/.empty.o
	@mkdir -p $(dir $@)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/.empty.o:
	@mkdir -p $(BUILD)
	echo 'typedef int eg_empty_unit;' | $(CC) -x c -c - -o $@

# The git commit in the version string (gen/version.h): the header is rewritten only when
# `git describe` changes, so an unchanged tree rebuilds nothing.
EG_GIT_DESCRIBE := $(shell git describe --always --dirty 2>/dev/null || echo unknown)
EG_HASH := \#
EG_VERSION_H := $(shell mkdir -p $(BUILD) && echo '$(EG_HASH)define EG_GIT_DESCRIBE "$(EG_GIT_DESCRIBE)"' > $(BUILD)/gen_version.h.new && \
	(cmp -s $(BUILD)/gen_version.h.new $(BUILD)/gen_version.h || cp $(BUILD)/gen_version.h.new $(BUILD)/gen_version.h); \
	rm -f $(BUILD)/gen_version.h.new)
$(BUILD)/gen/version.o: CFLAGS += -I$(BUILD)

$(EAGLEGEN): $(BUILD)/gen/main.o $(ALL_LIBS)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# A test depends only on its module's libraries, so a half-written file elsewhere does
# not break it.
.SECONDEXPANSION:
$(BUILD)/tests/test_%: tests/test_%.c tests/check.h $$(deps_$$(word 1,$$(subst _, ,$$*)))
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $< $(deps_$(word 1,$(subst _, ,$*))) $(LDLIBS)

# counts the engine's own allocations (tests/test_engine_allocs.c: none per decode step)
$(BUILD)/tests/test_engine_allocs: LDFLAGS += -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc

$(BUILD)/tests/fuzz/replay_%: tests/fuzz/fuzz_%.c tests/fuzz/replay.c tests/fuzz/fuzz.h tests/fuzz/tok_common.h $(ALL_LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ tests/fuzz/fuzz_$*.c tests/fuzz/replay.c $(ALL_LIBS) $(LDLIBS)

$(BUILD)/tests/fuzz/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz.h tests/fuzz/tok_common.h $(ALL_LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -fsanitize=fuzzer -o $@ $< $(ALL_LIBS) $(LDLIBS) $(LDFLAGS)

fuzz-bins: $(patsubst %,$(BUILD)/tests/fuzz/fuzz_%,$(FUZZ_TARGETS))

# The fuzzing campaign: every harness under ASan + UBSan (no recovery) + LeakSanitizer,
# seeded from tests/fuzz/corpus and from the fixtures and a generated dataset, FUZZ_S
# seconds each; found inputs land in tests/fuzz/corpus/NAME/ (commit them: `make test`
# replays them). FUZZ_TARGETS="record manifest" runs a subset.
fuzz:
	$(MAKE) BUILD=$(FUZZ_BUILD) CC=$(FUZZ_CC) OPT=-O1 NO_CUDA=1 \
	    SAN="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer" \
	    $(FUZZ_BUILD)/eaglegen fuzz-bins
	FUZZ_S=$(FUZZ_S) BUILD=$(FUZZ_BUILD) bash tests/fuzz/run.sh $(FUZZ_TARGETS)

# Line coverage per source file of the campaign's corpus (after `make fuzz`): the replay
# drivers built with clang's source-based coverage, run over each working corpus.
COV_BUILD ?= build-cov
fuzz-cov:
	$(MAKE) BUILD=$(COV_BUILD) CC=$(FUZZ_CC) OPT=-O0 NO_CUDA=1 \
	    SAN="-fprofile-instr-generate -fcoverage-mapping" \
	    $(patsubst %,$(COV_BUILD)/tests/fuzz/replay_%,$(FUZZ_TARGETS))
	COV_BUILD=$(COV_BUILD) FUZZ_BUILD=$(FUZZ_BUILD) bash tests/fuzz/coverage.sh $(FUZZ_TARGETS)

# Unit tests (C), then scripted end-to-end tests (tests/*.sh), then the Python loader.
test: $(EAGLEGEN) $(TEST_BINS) $(FUZZ_REPLAY)
	@BUILD=$(BUILD) PYTHON=$(PYTHON) bash tests/run_all.sh

asan:
	$(MAKE) BUILD=build-asan OPT=-O1 SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer" NO_CUDA=1 test

# ThreadSanitizer over the whole suite (stage threads, writer pool, signal handling);
# a reported race fails the run (TSan exits 66).
tsan:
	TSAN_OPTIONS=halt_on_error=1 $(MAKE) BUILD=build-tsan OPT=-O1 SAN="-fsanitize=thread -fno-omit-frame-pointer" NO_CUDA=1 test

bench: $(EAGLEGEN)
	@BUILD=$(BUILD) bash tests/bench.sh

# The CUDA kernels' op tests on the CPU emulator (tests/gpu/emu; needs g++, no GPU;
# minutes, so not part of `make test`). EMU_ARGS=--forward|--pipeline|--graphs for the
# emulated end-to-end runs, or test-name filters.
emu:
	BUILD_EMU=build-emu bash tests/gpu/emu/run_emu.sh $(EMU_ARGS)

# A randomised differential sweep of generate: layouts, batching, preemption, kill and
# resume, workers, each bit-identical to its reference (tests/sweep_generate.py; minutes,
# not part of `make test`). SWEEP_ARGS="--seed S --families N"; EMU_SWEEP=1 runs it on the
# CUDA emulator (builds it first; slower: use a few families).
sweep: $(EAGLEGEN)
ifeq ($(EMU_SWEEP),)
	EAGLEGEN=$(abspath $(BUILD)/eaglegen) PYTHON=$(PYTHON) $(PYTHON) tests/sweep_generate.py $(SWEEP_ARGS)
else
	BUILD_EMU=build-emu bash tests/gpu/emu/run_emu.sh --link
	EAGLEGEN=$(abspath build-emu/emu/eaglegen_emu) PYTHON=$(PYTHON) $(PYTHON) tests/sweep_generate.py --emu $(SWEEP_ARGS)
endif

demo:
	@bash tests/demo.sh

deps:
	@bash .ci/deps.sh

clean:
	rm -rf build build-asan build-*

# GPU-only test programs and rules (built only with nvcc; run by tests/gpu/run.sh).
-include tests/gpu/gpu.mk
# The optional reference check against transformers' DeepseekV3 (`make ref-check`).
-include tests/ref/ref.mk

# Optional trainer checks (`make trainer-check`; PyPI downloads, several GB; never in `make test`):
# the exports loaded by the trainers' own code, one CPU training step each.
# trainer-check-bootstrap: generate a slice, train SpecForge's drafter on it (CPU, 1.5-5 min),
# regenerate the rest with --draft-model.
# trainer-check-bootstrap-speculators: the same with speculators' drafter (its own save format).
.PHONY: trainer-check trainer-check-specforge trainer-check-speculators trainer-check-bootstrap \
        trainer-check-bootstrap-speculators
trainer-check: trainer-check-specforge trainer-check-speculators trainer-check-bootstrap \
               trainer-check-bootstrap-speculators
trainer-check-specforge: $(BUILD)/eaglegen $(BUILD)/tests/test_dataset_writer
	EAGLEGEN=$(abspath $(BUILD)/eaglegen) PYTHON=$(PYTHON) bash tests/trainer_check_specforge.sh
trainer-check-speculators: $(BUILD)/eaglegen
	EAGLEGEN=$(abspath $(BUILD)/eaglegen) PYTHON=$(PYTHON) bash tests/trainer_check_speculators.sh
trainer-check-bootstrap: $(BUILD)/eaglegen
	EAGLEGEN=$(abspath $(BUILD)/eaglegen) PYTHON=$(PYTHON) bash tests/trainer_check_bootstrap.sh
trainer-check-bootstrap-speculators: $(BUILD)/eaglegen
	BOOTSTRAP_TRAINER=speculators EAGLEGEN=$(abspath $(BUILD)/eaglegen) PYTHON=$(PYTHON) bash tests/trainer_check_bootstrap.sh

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
