/* The one symbol AOTInductor's generated C++ calls for genprobe::small_linear, in a library of its own.
 *
 * A compiled program finds `aoti_torch_cpu_small_linear` by name in the process's global symbol scope. Loading the
 * kernels' library itself with RTLD_GLOBAL would also put its dependencies there (glibc promotes the whole
 * dependency list), libtorch_cpu.so among them, whose exported oneDNN/MKL symbols then take the place of another
 * library's own copies: CTranslate2 loaded after it in the same process computed garbage. This library depends on
 * nothing; genprobe.engine.fast.kernels.build loads it globally and hands it the kernels' entry point. */
#include <stdint.h>

typedef int32_t AOTITorchError;
typedef struct AtenTensorOpaque* AtenTensorHandle;
typedef AOTITorchError (*small_linear_fn)(AtenTensorHandle, AtenTensorHandle, AtenTensorHandle*, AtenTensorHandle*,
                                          AtenTensorHandle*);

static small_linear_fn implementation;

__attribute__((visibility("default"))) void genprobe_set_small_linear(small_linear_fn fn) { implementation = fn; }

/* AOTI_TORCH_FAILURE (1) until the kernels' library is loaded: the wrapper turns it into an exception. */
__attribute__((visibility("default"))) AOTITorchError aoti_torch_cpu_small_linear(AtenTensorHandle x,
                                                                                  AtenTensorHandle weight,
                                                                                  AtenTensorHandle* bias,
                                                                                  AtenTensorHandle* block_scales,
                                                                                  AtenTensorHandle* ret0) {
  return implementation ? implementation(x, weight, bias, block_scales, ret0) : 1;
}

/* genprobe::small_linear_ggml (a weight in llama.cpp's blocks), the same way. */
typedef AOTITorchError (*small_linear_ggml_fn)(AtenTensorHandle, AtenTensorHandle, AtenTensorHandle*, int64_t,
                                               AtenTensorHandle*);

static small_linear_ggml_fn ggml_implementation;

__attribute__((visibility("default"))) void genprobe_set_small_linear_ggml(small_linear_ggml_fn fn) {
  ggml_implementation = fn;
}

__attribute__((visibility("default"))) AOTITorchError aoti_torch_cpu_small_linear_ggml(AtenTensorHandle x,
                                                                                       AtenTensorHandle weight,
                                                                                       AtenTensorHandle* bias,
                                                                                       int64_t ggml_type,
                                                                                       AtenTensorHandle* ret0) {
  return ggml_implementation ? ggml_implementation(x, weight, bias, ggml_type, ret0) : 1;
}
