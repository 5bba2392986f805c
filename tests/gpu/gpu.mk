# GPU-only test programs: every tests/gpu/*.c becomes $(BUILD)/gpu/<name>, linked with
# all libraries (kernels included). Built only when nvcc was found (HAVE_CUDA) by
# `make gpu-tests`; tests/gpu/run.sh builds and runs them on a machine with a GPU.
GPU_TEST_SRCS = $(wildcard tests/gpu/*.c)
GPU_TEST_BINS = $(patsubst tests/gpu/%.c,$(BUILD)/gpu/%,$(GPU_TEST_SRCS))

.PHONY: gpu-tests
ifneq ($(HAVE_CUDA),)
gpu-tests: $(GPU_TEST_BINS)

$(BUILD)/gpu/%: tests/gpu/%.c tests/check.h $(ALL_LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $< $(ALL_LIBS) $(LDLIBS)
else
gpu-tests:
	@echo "gpu-tests: built without CUDA (nvcc not found or NO_CUDA set): nothing to build"
endif
