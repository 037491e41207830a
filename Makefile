# hyb — top-level build. The two commands a newcomer needs:
#   make run    build, make a demo model if none is given, generate text
#   make test   every test that needs no GPU
# The kernel module is built by Kbuild (see kmod/).

SHELL   := /bin/bash
BUILD   ?= build
CC      ?= gcc
PREFIX  ?= /usr/local
MODEL   ?=
PROMPT  ?=
N       ?= 128

OPT      ?= -O2
# Warnings are errors here; WERROR= builds with another compiler's new warnings
# (a GPU machine's, say) without stopping the one build it has time for.
WERROR   ?= -Werror
CFLAGS   := -std=c11 $(OPT) -g -Wall -Wextra $(WERROR) -pthread -fno-math-errno -MMD -MP
# Include paths: libhyb's own files name other subsystems' headers by folder
# ("sparse/sparse_op.h"); tools see only the public API (libhyb/include).
CPPFLAGS := -D_GNU_SOURCE -Ilibhyb/include -Ikmod/include/uapi
INTERNAL := -Ilibhyb -Ikernels/cpu
LDLIBS   := -lm -pthread -lnuma -luring $(shell pkg-config --libs libutf8proc 2>/dev/null || echo -lutf8proc)
# METIS partitions the co-activation graph: the offline planner's alone
PLAN_LIBS := -lmetis
# hyb serve's HTTP server and JSON (docs/SERVE.md): the hyb tool's alone, never libhyb's
SERVE_PKGS   := libmicrohttpd jansson
SERVE_CFLAGS := $(shell pkg-config --cflags $(SERVE_PKGS) 2>/dev/null)
SERVE_LIBS   := $(shell pkg-config --libs $(SERVE_PKGS) 2>/dev/null || echo -lmicrohttpd -ljansson)

# Kernels are compiled once per ISA level (file suffix) and picked at run time.
ISA_avx2       := -mavx2 -mfma -mf16c -mpopcnt
ISA_avx512     := $(ISA_avx2) -mavx512f -mavx512bw -mavx512vl -mavx512dq
ISA_avx512vnni := $(ISA_avx512) -mavx512vnni
ISA_amx        := $(ISA_avx512vnni) -mamx-tile -mamx-int8

# libhyb: the runtime (every subsystem folder but plan/) and the CPU kernels;
# libhybplan: the offline planner, linked by hybctl and the tests only;
# libhybd: hybd's own code, linked by hybd and the tests.
ABI_VERSION := 0
LIB_SRCS   := $(filter-out libhyb/plan/%,$(wildcard libhyb/*/*.c)) $(wildcard kernels/cpu/*.c)
LIB_OBJS   := $(LIB_SRCS:%.c=$(BUILD)/%.o)
PLAN_OBJS  := $(patsubst %.c,$(BUILD)/%.o,$(wildcard libhyb/plan/*.c))
HYBD_OBJS  := $(patsubst %.c,$(BUILD)/%.o,$(filter-out daemon/hybd.c,$(wildcard daemon/*.c)))
HYB_OBJS   := $(patsubst %.c,$(BUILD)/%.o,$(wildcard tools/hyb/*.c))
CTL_OBJS   := $(patsubst %.c,$(BUILD)/%.o,$(wildcard tools/hybctl/*.c))
TEST_OBJS  := $(patsubst %.c,$(BUILD)/%.o,$(wildcard tests/unit/*.c))

LIB     := $(BUILD)/libhyb.a
SOLIB   := $(BUILD)/libhyb.so.$(ABI_VERSION)
PLANLIB := $(BUILD)/libhybplan.a
HYBDLIB := $(BUILD)/libhybd.a
TOOLS   := $(BUILD)/hyb $(BUILD)/hybctl $(BUILD)/hybd
TESTBIN := $(BUILD)/hyb-tests
BENCHBIN := $(patsubst tests/bench/%.c,$(BUILD)/%,$(wildcard tests/bench/bench_*.c))
FUZZ    := $(BUILD)/fuzz_gguf

$(LIB_OBJS) $(PLAN_OBJS) $(HYBD_OBJS): CPPFLAGS += $(INTERNAL)
# tests reach every layer: hybd's files by their path from the root ("daemon/reload.h")
$(TEST_OBJS) $(BUILD)/tests/bench/%.o: CPPFLAGS += $(INTERNAL) -I.
$(BUILD)/daemon/hybd.o: CPPFLAGS += $(INTERNAL)
$(HYB_OBJS) $(TEST_OBJS): CPPFLAGS += $(SERVE_CFLAGS)
# libhyb.so is made of the same objects as libhyb.a
$(LIB_OBJS): CFLAGS += -fPIC

# CUDA: built whenever nvcc exists, even with no GPU to run it.
NVCC ?= $(shell command -v nvcc 2>/dev/null || { [ -x /usr/local/cuda/bin/nvcc ] && echo /usr/local/cuda/bin/nvcc; })
LIB_CU_SRCS  := $(wildcard kernels/cuda/*.cu libhyb/*/*.cu)
HYBD_CU_SRCS := $(wildcard daemon/*.cu)
# A100 and H100/H200 machine code; CUDA_ARCH='-gencode arch=compute_90,code=sm_90'
# halves nvcc's time where only Hopper will run it.
CUDA_ARCH ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90
comma   := ,
NVFLAGS ?= -O3 -std=c++17 $(CUDA_ARCH) -Xcompiler -fPIC,-Wall,-Wextra$(if $(WERROR),$(comma)-Werror)
CUDA_HOME := $(patsubst %/bin/nvcc,%,$(NVCC))
GPU_TESTBIN := $(BUILD)/hyb-gpu-tests
# With nvcc the programs carry the CUDA code: the strong hyb_device_cuda_open,
# hyb_cuda_cache_open and hybd's hyb_copydev_cuda_* replace the weak "built
# without CUDA" ones (libhyb/device/device.c, libhyb/box/gpucache.c,
# daemon/copydev_nocuda.c).
ifneq ($(NVCC),)
LIB_CUDA  := $(LIB_CU_SRCS:%.cu=$(BUILD)/%.o)
HYBD_CUDA := $(HYBD_CU_SRCS:%.cu=$(BUILD)/%.o)
CUDA_LIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart -lstdc++
endif
GPU_TEST_OBJS := $(patsubst %.c,$(BUILD)/%.o,$(wildcard tests/gpu/*.c))

.PHONY: all run test bench bench-gpu test-gpu install clean deps cuda cudaemu amxemu fuzz module module-clean \
	dkms-install dkms-uninstall
all: $(LIB) $(SOLIB) $(BUILD)/hyb.pc $(TOOLS) $(TESTBIN) $(BENCHBIN) cuda

deps:
	@bash tools/install-deps.sh

$(BUILD)/%.o: %.c
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(CFLAGS) -c $< -o $@
$(BUILD)/kernels/cpu/%_avx2.o: kernels/cpu/%_avx2.c
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(CFLAGS) -O3 $(ISA_avx2) -c $< -o $@
$(BUILD)/kernels/cpu/%_avx512.o: kernels/cpu/%_avx512.c
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(CFLAGS) -O3 $(ISA_avx512) -c $< -o $@
$(BUILD)/kernels/cpu/%_avx512vnni.o: kernels/cpu/%_avx512vnni.c
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(CFLAGS) -O3 $(ISA_avx512vnni) -c $< -o $@
$(BUILD)/kernels/cpu/%_amx.o: kernels/cpu/%_amx.c
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(CFLAGS) -O3 $(ISA_amx) -c $< -o $@
$(BUILD)/kernels/cpu/%.o: kernels/cpu/%.c
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(CFLAGS) -O3 -c $< -o $@

$(LIB): $(LIB_OBJS)
	@rm -f $@
	ar rcs $@ $^
$(PLANLIB): $(PLAN_OBJS)
	@rm -f $@
	ar rcs $@ $^
$(HYBDLIB): $(HYBD_OBJS)
	@rm -f $@
	ar rcs $@ $^
# The shared library exports hyb_* only (libhyb/libhyb.map) under a soname.
$(SOLIB): $(LIB_OBJS) $(LIB_CUDA) libhyb/libhyb.map
	$(CC) -shared -Wl,-soname,libhyb.so.$(ABI_VERSION) -Wl,--version-script=libhyb/libhyb.map \
		-Wl,--no-undefined $(CFLAGS) $(LIB_OBJS) $(LIB_CUDA) $(CUDA_LIBS) $(LDLIBS) -o $@
	ln -sf libhyb.so.$(ABI_VERSION) $(BUILD)/libhyb.so
$(BUILD)/hyb.pc: libhyb/hyb.pc.in Makefile
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|$(ABI_VERSION)|' \
		-e 's|@LIBS@|$(strip $(LDLIBS))|' $< > $@

$(BUILD)/hyb: $(HYB_OBJS) $(LIB_CUDA) $(LIB)
	$(CC) $(CFLAGS) $^ $(CUDA_LIBS) $(SERVE_LIBS) $(LDLIBS) -o $@
$(BUILD)/hybctl: $(CTL_OBJS) $(PLANLIB) $(LIB)
	$(CC) $(CFLAGS) $^ $(PLAN_LIBS) $(LDLIBS) -o $@
$(BUILD)/hybd: $(BUILD)/daemon/hybd.o $(HYBD_CUDA) $(LIB_CUDA) $(HYBDLIB) $(LIB)
	$(CC) $(CFLAGS) $^ $(CUDA_LIBS) $(LDLIBS) -o $@
# hyb serve's text rules (and the UTF-8 helpers they use) are tested alone (test_serve_text.c)
$(TESTBIN): $(TEST_OBJS) $(BUILD)/tools/hyb/serve_text.o $(BUILD)/tools/hyb/cli_utf8.o $(HYBDLIB) $(PLANLIB) $(LIB)
	$(CC) $(CFLAGS) $^ $(PLAN_LIBS) $(SERVE_LIBS) $(LDLIBS) -o $@
# bench_reload --upload cuda times hybd's CUDA copy engine: the benches carry it too
$(BUILD)/bench_%: $(BUILD)/tests/bench/bench_%.o $(HYBD_CUDA) $(LIB_CUDA) $(HYBDLIB) $(PLANLIB) $(LIB)
	$(CC) $(CFLAGS) $^ $(CUDA_LIBS) $(PLAN_LIBS) $(LDLIBS) -o $@

# libFuzzer target for the GGUF parser (clang); `make test` runs it briefly.
FUZZ_SRCS := tests/fuzz/fuzz_gguf.c libhyb/format/gguf_read.c libhyb/format/map_guard.c \
	     libhyb/format/tensor_type.c libhyb/util/error.c
$(FUZZ): $(FUZZ_SRCS) libhyb/include/hyb/gguf.h libhyb/format/map_guard.h libhyb/util/error.h
	@mkdir -p $(@D)
	clang $(CPPFLAGS) $(INTERNAL) -std=c11 -g -O1 -pthread -fsanitize=fuzzer,address,undefined \
		-fno-sanitize-recover=undefined $(FUZZ_SRCS) -o $@
# ... and for the model loader over it: the loader's files instrumented, the
# rest of libhyb as built (the linker takes the instrumented copies first).
FUZZ_MODEL_SRCS := tests/fuzz/fuzz_model.c $(FUZZ_SRCS:tests/fuzz/fuzz_gguf.c=) \
	     libhyb/model/model_load.c $(wildcard libhyb/model/arch_*.c) \
	     $(wildcard libhyb/tokenizer/*.c)
$(BUILD)/fuzz_model: $(FUZZ_MODEL_SRCS) $(LIB)
	@mkdir -p $(@D)
	clang $(CPPFLAGS) $(INTERNAL) -std=c11 -g -O1 -pthread -fsanitize=fuzzer,address,undefined \
		-fno-sanitize-recover=undefined $(FUZZ_MODEL_SRCS) $(LIB) $(LDLIBS) -o $@
# ... and for hyb serve's request parser (the JSON of /v1/completions and chat)
FUZZ_SERVE_SRCS := tests/fuzz/fuzz_serve.c tools/hyb/serve_json.c tools/hyb/serve_text.c \
		   tools/hyb/cli_utf8.c
$(BUILD)/fuzz_serve: $(FUZZ_SERVE_SRCS) tools/hyb/serve.h $(LIB)
	@mkdir -p $(@D)
	clang $(CPPFLAGS) $(INTERNAL) $(SERVE_CFLAGS) -Itools/hyb -std=c11 -g -O1 -pthread \
		-fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
		$(FUZZ_SERVE_SRCS) $(LIB) $(SERVE_LIBS) $(LDLIBS) -o $@
# ... and for the manifest reader (what apps take from hybd before mapping its pools)
FUZZ_MANIFEST_SRCS := tests/fuzz/fuzz_manifest.c libhyb/box/manifest.c
$(BUILD)/fuzz_manifest: $(FUZZ_MANIFEST_SRCS) libhyb/include/hyb/manifest.h $(LIB)
	@mkdir -p $(@D)
	clang $(CPPFLAGS) $(INTERNAL) -std=c11 -g -O1 -pthread -fsanitize=fuzzer,address,undefined \
		-fno-sanitize-recover=undefined $(FUZZ_MANIFEST_SRCS) $(LIB) $(LDLIBS) -o $@
# ... and for the tokenizers and chat templates (the text users send)
FUZZ_TEXT_SRCS := tests/fuzz/fuzz_text.c $(wildcard libhyb/tokenizer/*.c) \
		  $(wildcard libhyb/chat/*.c)
$(BUILD)/fuzz_text: $(FUZZ_TEXT_SRCS) $(LIB)
	@mkdir -p $(@D)
	clang $(CPPFLAGS) $(INTERNAL) -std=c11 -g -O1 -pthread -fsanitize=fuzzer,address,undefined \
		-fno-sanitize-recover=undefined $(FUZZ_TEXT_SRCS) $(LIB) $(LDLIBS) -o $@
fuzz: $(FUZZ) $(BUILD)/fuzz_model $(BUILD)/fuzz_serve $(BUILD)/fuzz_manifest $(BUILD)/fuzz_text

ifneq ($(NVCC),)
$(BUILD)/%.o: %.cu
	@mkdir -p $(@D)
	$(NVCC) $(NVFLAGS) -MMD -MP $(CPPFLAGS) $(INTERNAL) -Ikernels/cuda -c $< -o $@
cuda: $(GPU_TESTBIN)
$(GPU_TEST_OBJS): CPPFLAGS += $(INTERNAL) -I. -I$(CUDA_HOME)/include -Ikernels/cuda -Itests/unit
$(GPU_TESTBIN): $(BUILD)/tests/unit/runner.o $(BUILD)/tests/unit/plan_fixture.o \
		$(BUILD)/tests/unit/rows_fixture.o $(GPU_TEST_OBJS) \
		$(HYBD_CUDA) $(LIB_CUDA) $(HYBDLIB) $(LIB)
	$(CC) $(CFLAGS) $^ $(CUDA_LIBS) $(LDLIBS) -o $@
else
cuda:
	@echo "hyb: CUDA toolkit not found (no nvcc on PATH or in /usr/local/cuda): CUDA kernels skipped"
endif

# The CUDA code without a GPU (docs/CUDAEMU.md): g++ compiles the .cu files,
# launches rewritten by launch.sed, against cudaemu, a host emulation of the
# CUDA runtime and of kernel execution; the GPU tests run on it in make test.
# No nvcc is needed.
CXX      ?= g++
EMU      := $(BUILD)/cudaemu
EMU_BIN  := $(BUILD)/hyb-gpu-tests-emu
EMU_INC  := -Itests/cudaemu/include -include tests/cudaemu/cudaemu.h
EMU_CXXFLAGS := -std=c++17 $(OPT) -g -Wall -Wextra -Wno-unknown-pragmas $(WERROR) -pthread -MMD -MP
EMU_CU_OBJS  := $(patsubst %.cu,$(EMU)/%.o,$(LIB_CU_SRCS) $(HYBD_CU_SRCS) tests/cudaemu/selftest_kernels.cu)
EMU_TEST_OBJS := $(patsubst %.c,$(EMU)/%.o,$(wildcard tests/gpu/*.c tests/cudaemu/*.c))
$(EMU)/%.cc: %.cu tests/cudaemu/launch.sed
	@mkdir -p $(@D)
	sed -f tests/cudaemu/launch.sed $< > $@
$(EMU)/%.o: $(EMU)/%.cc tests/cudaemu/cudaemu.h
	$(CXX) $(CPPFLAGS) $(INTERNAL) -Ikernels/cuda -I$(dir $*) $(EMU_INC) $(EMU_CXXFLAGS) -c $< -o $@
$(EMU)/tests/cudaemu/cudaemu.o: tests/cudaemu/cudaemu.cc tests/cudaemu/cudaemu.h
	@mkdir -p $(@D)
	$(CXX) -D_GNU_SOURCE $(EMU_CXXFLAGS) -c $< -o $@
$(EMU)/tests/%.o: tests/%.c
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(INTERNAL) -I. -Ikernels/cuda -Itests/unit -Itests/cudaemu/include $(CFLAGS) -c $< -o $@
$(EMU_BIN): $(BUILD)/tests/unit/runner.o $(BUILD)/tests/unit/plan_fixture.o \
		$(BUILD)/tests/unit/rows_fixture.o $(BUILD)/tests/unit/shell_fixture.o $(EMU_TEST_OBJS) $(EMU_CU_OBJS) \
		$(EMU)/tests/cudaemu/cudaemu.o $(HYBDLIB) $(LIB)
	$(CC) $(CFLAGS) $^ -lstdc++ $(LDLIBS) -o $@
# hyb itself on cudaemu: its --device cuda paths, end to end (tests/cudaemu/test_cudaemu.c)
$(EMU)/hyb: $(HYB_OBJS) $(patsubst %.cu,$(EMU)/%.o,$(LIB_CU_SRCS)) $(EMU)/tests/cudaemu/cudaemu.o $(LIB)
	$(CC) $(CFLAGS) $^ -lstdc++ $(SERVE_LIBS) $(LDLIBS) -o $@
cudaemu: $(EMU_BIN) $(EMU)/hyb
# the rewritten .cu files stay: compiler messages name them
.SECONDARY: $(patsubst %.o,%.cc,$(EMU_CU_OBJS))

# The AMX level without an AMX CPU (docs/AMXEMU.md): its two files compiled
# again with the tile intrinsics emulated (tests/amxemu), linked ahead of
# libhyb.a with amxemu's hyb_cpu_amx_usable(), into a second test binary.
AMXEMU     := $(BUILD)/amxemu
AMXEMU_BIN := $(AMXEMU)/hyb-tests
AMXEMU_OBJS := $(AMXEMU)/kernels/cpu/gemm_q_amx.o $(AMXEMU)/kernels/cpu/gemm_k_extra_amx.o \
	$(AMXEMU)/tests/amxemu/amxemu.o $(AMXEMU)/tests/amxemu/test_amxemu.o
$(AMXEMU)/kernels/cpu/%_amx.o: kernels/cpu/%_amx.c tests/amxemu/amxemu.h
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(INTERNAL) -I. $(CFLAGS) -O3 $(ISA_avx512vnni) -include tests/amxemu/amxemu.h \
		-c $< -o $@
$(AMXEMU)/tests/amxemu/%.o: tests/amxemu/%.c tests/amxemu/amxemu.h
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(INTERNAL) -I. -Itests/unit $(CFLAGS) -c $< -o $@
$(AMXEMU_BIN): $(AMXEMU_OBJS) $(TEST_OBJS) $(BUILD)/tools/hyb/serve_text.o $(BUILD)/tools/hyb/cli_utf8.o \
		$(HYBDLIB) $(PLANLIB) $(LIB)
	$(CC) $(CFLAGS) $^ $(PLAN_LIBS) $(SERVE_LIBS) $(LDLIBS) -o $@
amxemu: $(AMXEMU_BIN)

# hybpool.ko against the running kernel's headers, or KDIR=...; the VM bench
# (tests/vm/run.sh, run by `make test`) builds it against Debian's kernel.
KDIR ?= /lib/modules/$(shell uname -r)/build
module:
	$(MAKE) -C $(KDIR) M=$(CURDIR) W=1 modules
module-clean:
	$(MAKE) -C $(KDIR) M=$(CURDIR) clean

# DKMS (dkms.conf): the module rebuilt for every installed kernel and on upgrades.
# Version: the module's ABI version (.0); DKMS_KERNEL=KVER builds for that
# kernel only (default: the running one).
DKMS_VERSION := $(shell sed -n 's/^\#define HYB_ABI_VERSION[[:space:]]*\([0-9]*\).*/\1/p' \
		  kmod/include/uapi/linux/hybpool.h).0
DKMS_SRC := /usr/src/hybpool-$(DKMS_VERSION)
DKMS_K := $(if $(DKMS_KERNEL),-k $(DKMS_KERNEL))
dkms-install:
	@command -v dkms >/dev/null || { echo "hyb: dkms is not installed (apt-get install dkms)" >&2; exit 1; }
	-dkms remove -m hybpool -v $(DKMS_VERSION) --all >/dev/null 2>&1
	rm -rf $(DKMS_SRC)
	mkdir -p $(DKMS_SRC)/kmod
	cp Kbuild $(DKMS_SRC)/
	cp kmod/Kbuild kmod/*.c kmod/*.h kmod/60-hybpool.rules $(DKMS_SRC)/kmod/
	cp -r kmod/include $(DKMS_SRC)/kmod/
	sed 's/@VERSION@/$(DKMS_VERSION)/' dkms.conf > $(DKMS_SRC)/dkms.conf
	dkms add -m hybpool -v $(DKMS_VERSION)
	dkms build -m hybpool -v $(DKMS_VERSION) $(DKMS_K)
	dkms install -m hybpool -v $(DKMS_VERSION) $(DKMS_K)
dkms-uninstall:
	-dkms remove -m hybpool -v $(DKMS_VERSION) --all
	rm -rf $(DKMS_SRC)

models/demo.gguf: $(BUILD)/hybctl
	@mkdir -p models
	$(BUILD)/hybctl synth -o $@ --hidden 512 --ffn 1376 --layers 8 --heads 8 --vocab 4096 --type Q8_0 --seed 1

# The demo: a real model (SmolLM2-135M-Instruct from its PyPI package, cached
# in models/) answers a question through its chat template; offline, the
# synthetic model generates from a plain prompt instead.
RUN_QUESTION := Why is the sky blue? Explain in two or three sentences.
run: deps
	@$(MAKE) --no-print-directory -j$$(nproc) all
	@if [ -n "$(MODEL)" ]; then \
		set -x; $(BUILD)/hyb run -m "$(MODEL)" -p "$(or $(PROMPT),Once upon a time)" -n $(N); \
	elif m=$$(bash tests/data/fetch-models.sh smollm2 2>/dev/null); then \
		set -x; $(BUILD)/hyb run -m "$$m" --chat -p "$(or $(PROMPT),$(RUN_QUESTION))" -n $(N); \
	else \
		echo "hyb: SmolLM2 cannot be fetched (offline?): the synthetic demo model instead"; \
		$(MAKE) --no-print-directory models/demo.gguf && set -x && \
		$(BUILD)/hyb run -m models/demo.gguf -p "$(or $(PROMPT),Once upon a time)" -n $(N); \
	fi

test: deps
	@$(MAKE) --no-print-directory -j$$(nproc) all fuzz cudaemu amxemu
	$(TESTBIN)
	# the AMX level on amxemu (docs/AMXEMU.md): its kernels against the VNNI level's
	# bits, and the golden logits of llama.cpp and PowerInfer with prompts on the tiles
	$(AMXEMU_BIN) amx kern_gemm exact_ real_ moe pi_
	# the CUDA code on cudaemu (docs/CUDAEMU.md): the GPU tests, smaller shapes
	HYB_GPU_TEST_SMALL=1 HYB_DEVICE_STRICT=0 $(EMU_BIN)
	# ... the kernels' own tests again with the threads in another order
	HYB_CUDAEMU_SEED=2 HYB_GPU_TEST_SMALL=1 HYB_DEVICE_STRICT=0 $(EMU_BIN) _odd matvec attention \
		teal ffn_act gpu_pred cudaemu_barrier cudaemu_warp
	# ... and hybd's copy engine where the GPU cannot register host memory read-only
	HYB_CUDAEMU_NO_READONLY_REGISTER=1 $(EMU_BIN) copydev_cuda

bench: deps
	@bash tools/install-deps.sh bench
	@$(MAKE) --no-print-directory -j$$(nproc) all
	bash tests/bench/run.sh

bench-gpu:
ifneq ($(NVCC),)
	@$(MAKE) --no-print-directory -j$$(nproc) all
	-$(BUILD)/bench_reload --upload cuda
	HYBRID_DEVICE=cuda HYBRID_LAYERS=$${HYBRID_LAYERS:-32} bash tests/bench/hybrid.sh
else
	@echo "hyb: CUDA toolkit not found: no GPU benchmark"
endif

test-gpu:
ifneq ($(NVCC),)
	@$(MAKE) --no-print-directory -j$$(nproc) all
	# the CPU device is only the reference here: its strict checks of the engine ran in make test
	HYB_DEVICE_STRICT=0 $(GPU_TESTBIN)
else
	@echo "hyb: CUDA toolkit not found: nothing to test on a GPU"
endif

install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib/pkgconfig \
		$(DESTDIR)$(PREFIX)/include/hyb
	install -m 755 $(TOOLS) $(DESTDIR)$(PREFIX)/bin/
	install -m 644 $(LIB) $(PLANLIB) $(DESTDIR)$(PREFIX)/lib/
	install -m 755 $(SOLIB) $(DESTDIR)$(PREFIX)/lib/
	ln -sf libhyb.so.$(ABI_VERSION) $(DESTDIR)$(PREFIX)/lib/libhyb.so
	install -m 644 $(BUILD)/hyb.pc $(DESTDIR)$(PREFIX)/lib/pkgconfig/
	install -m 644 libhyb/include/hyb/*.h $(DESTDIR)$(PREFIX)/include/hyb/
	install -D -m 644 daemon/hybd.service $(DESTDIR)$(PREFIX)/lib/systemd/system/hybd.service
	install -D -m 644 daemon/hyb-serve.service \
		$(DESTDIR)$(PREFIX)/lib/systemd/system/hyb-serve.service

clean:
	rm -rf $(BUILD)

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
