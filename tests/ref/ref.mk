# Optional reference check against Hugging Face transformers' DeepseekV3 (downloads
# torch/transformers into build/ref-venv, draws a ~5 GB moonlight-16b model into
# build/ref). Never part of `make test` or `make demo`. Included by the main Makefile
# with `-include tests/ref/ref.mk`; before that: make -f Makefile -f tests/ref/ref.mk ref-check
# Pass options with REF_ARGS, e.g. make ref-check REF_ARGS="--tol 1e-2 --backend cuda".
.PHONY: ref-check
ref-check:
	bash tests/ref/run.sh $(REF_ARGS)
