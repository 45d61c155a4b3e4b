/* A stand-in for libcuda.so.1 in the CPU tests of custom_kernels/libcuda.py (tests/test_libcuda.py). It is not a
 * driver and checks nothing about one: it is built against cuda.h, so the compiler holds each function to the
 * header's prototype and the exported symbol is what cuda.h's #defines make of the name (cuCtxPushCurrent is
 * cuCtxPushCurrent_v2); each function answers with values made from its arguments, so a test sees whether ctypes
 * passed every argument, at its full width, where the C side reads it. The real driver is checked by
 * tests/gpu/test_libcuda_gpu.py. */
#include <cuda.h>
#include <stdint.h>
#include <string.h>

#define CONTEXT_BASE 0x7f0000000000ull  /* handles above 2^32: a truncated pointer shows */
#define MODULE_BASE 0x7e0000000000ull

static __thread CUcontext current = NULL;  /* one context stack per thread, as the driver keeps */
static __thread CUcontext saved[16];
static __thread int depth = 0;

static const char *error_name(CUresult error) {
  switch (error) {
    case CUDA_SUCCESS: return "CUDA_SUCCESS";
    case CUDA_ERROR_INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE";
    case CUDA_ERROR_INVALID_DEVICE: return "CUDA_ERROR_INVALID_DEVICE";
    case CUDA_ERROR_INVALID_CONTEXT: return "CUDA_ERROR_INVALID_CONTEXT";
    case CUDA_ERROR_INVALID_IMAGE: return "CUDA_ERROR_INVALID_IMAGE";
    case CUDA_ERROR_INVALID_HANDLE: return "CUDA_ERROR_INVALID_HANDLE";
    case CUDA_ERROR_NOT_FOUND: return "CUDA_ERROR_NOT_FOUND";
    default: return NULL;
  }
}

CUresult cuGetErrorName(CUresult error, const char **pStr) {
  *pStr = error_name(error);  /* the driver's answer to a code it does not know: NULL and INVALID_VALUE */
  return *pStr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult error, const char **pStr) {
  *pStr = error_name(error) ? "described by the stub" : NULL;
  return *pStr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuInit(unsigned int Flags) { return Flags == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; }

CUresult cuDeviceGet(CUdevice *device, int ordinal) {
  if (ordinal < 0 || ordinal > 1) return CUDA_ERROR_INVALID_DEVICE;
  *device = 100 + ordinal;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev) {
  *pi = 1000 * (int)attrib + dev;
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
  *pctx = (CUcontext)(uintptr_t)(CONTEXT_BASE + 0x1000ull * (unsigned)dev);
  return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext *pctx) {
  *pctx = current;
  return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext ctx) {
  current = ctx;
  return CUDA_SUCCESS;
}

CUresult cuCtxPushCurrent(CUcontext ctx) {
  if (ctx == NULL || depth == 16) return CUDA_ERROR_INVALID_VALUE;
  saved[depth++] = current;
  current = ctx;
  return CUDA_SUCCESS;
}

CUresult cuCtxPopCurrent(CUcontext *pctx) {
  if (depth == 0) return CUDA_ERROR_INVALID_CONTEXT;
  *pctx = current;
  current = saved[--depth];
  return CUDA_SUCCESS;
}

CUresult cuModuleLoadData(CUmodule *module, const void *image) {
  const unsigned char *bytes = (const unsigned char *)image;
  if (current == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  if (memcmp(bytes, "\x7f" "ELF", 4) != 0) return CUDA_ERROR_INVALID_IMAGE;
  *module = (CUmodule)(uintptr_t)(MODULE_BASE + 0x100ull * bytes[4]);  /* the image's fifth byte shows */
  return CUDA_SUCCESS;
}

CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name) {
  if (((uintptr_t)hmod & ~0xffffull) != MODULE_BASE) return CUDA_ERROR_INVALID_HANDLE;
  if (strcmp(name, "missing") == 0) return CUDA_ERROR_NOT_FOUND;
  *hfunc = (CUfunction)((uintptr_t)hmod + strlen(name));
  return CUDA_SUCCESS;
}

static int is_function(CUfunction f) { return ((uintptr_t)f & ~0xffffull) == MODULE_BASE; }

CUresult cuFuncSetAttribute(CUfunction hfunc, CUfunction_attribute attrib, int value) {
  if (!is_function(hfunc)) return CUDA_ERROR_INVALID_HANDLE;
  if (attrib != CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES || value < 0 || value > 232448)
    return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}

CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *numBlocks, CUfunction func, int blockSize,
                                                     size_t dynamicSMemSize) {
  if (!is_function(func)) return CUDA_ERROR_INVALID_HANDLE;
  *numBlocks = 1000 * (int)(dynamicSMemSize >> 32) + blockSize / 32;  /* the size_t's high word shows */
  return CUDA_SUCCESS;
}

CUresult cuTensorMapEncodeTiled(CUtensorMap *tensorMap, CUtensorMapDataType tensorDataType, cuuint32_t tensorRank,
                                void *globalAddress, const cuuint64_t *globalDim, const cuuint64_t *globalStrides,
                                const cuuint32_t *boxDim, const cuuint32_t *elementStrides,
                                CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
                                CUtensorMapL2promotion l2Promotion, CUtensorMapFloatOOBfill oobFill) {
  cuuint64_t *words = tensorMap->opaque;
  cuuint32_t i;
  if ((uintptr_t)tensorMap % 64 != 0 || tensorRank != 2) return CUDA_ERROR_INVALID_VALUE;  /* cuda.h: aligned */
  /* the arguments, in order, one 64-bit word each (the rank's arrays innermost first) */
  words[0] = tensorDataType;
  words[1] = tensorRank;
  words[2] = (uintptr_t)globalAddress;
  for (i = 0; i < 2; ++i) words[3 + i] = globalDim[i];
  words[5] = globalStrides[0];
  for (i = 0; i < 2; ++i) words[6 + i] = boxDim[i];
  for (i = 0; i < 2; ++i) words[8 + i] = elementStrides[i];
  words[10] = interleave;
  words[11] = swizzle;
  words[12] = l2Promotion;
  words[13] = oobFill;
  words[14] = 0;
  words[15] = 0x5757;
  return CUDA_SUCCESS;
}

/* Writes what it was handed into the kernel's first parameter, a pointer to 16 host words: function, grid,
 * block, shared memory, stream, the attributes (id and first value word each, at most two) and the
 * second parameter (a 32-bit int). A grid of zero blocks is refused, as the driver refuses it. */
CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra) {
  uint64_t *out;
  unsigned i;
  if (current == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  if (!is_function(f) || extra != NULL) return CUDA_ERROR_INVALID_HANDLE;
  if (config->gridDimX == 0 || config->numAttrs > 2) return CUDA_ERROR_INVALID_VALUE;
  out = *(uint64_t **)kernelParams[0];
  out[0] = (uintptr_t)f;
  out[1] = config->gridDimX; out[2] = config->gridDimY; out[3] = config->gridDimZ;
  out[4] = config->blockDimX; out[5] = config->blockDimY; out[6] = config->blockDimZ;
  out[7] = config->sharedMemBytes;
  out[8] = (uintptr_t)config->hStream;
  out[9] = config->numAttrs;
  for (i = 0; i < config->numAttrs; ++i) {
    out[10 + 2 * i] = config->attrs[i].id;
    out[11 + 2 * i] = config->attrs[i].value.clusterDim.x;  /* the value union's first 32-bit word */
  }
  out[14] = (uint64_t)(int64_t)*(int32_t *)kernelParams[1];
  out[15] = (uintptr_t)current;
  return CUDA_SUCCESS;
}
