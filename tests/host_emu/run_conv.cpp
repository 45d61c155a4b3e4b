// Runs one entry point of custom_kernels/kernels/conv_depthwise.cu or conv_small_ci.cu on the CPU (tests only):
//   run_conv DIR
// DIR/launch.txt: kernel name, grid x y, block x y, dynamic smem bytes, x_shift, out_shift (elements), the 18
// CUOPS_CONV_INT_ARGS; DIR/{x,qweight,scale,offset,out}.bin (and bias.bin if present): the buffers, each copied
// into a heap block of exactly its size (x and out shifted by their shifts, to reach the unaligned paths), so
// that AddressSanitizer reports any access past one. The kernel's shared-memory array is poisoned past the
// launch's bytes, and the launch's bytes are NaN-filled before each block. Writes DIR/out.bin back.
#include "cuda_host_shim.h"

#include "conv_depthwise.cu"
#include "conv_small_ci.cu"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define EMU_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#else
#define EMU_POISON(p, n) ((void)(p), (void)(n))
#endif

// The kernels' extern __shared__ arrays, each more than one block can get on any GPU (227 KiB on sm_90).
constexpr size_t kSmemBytes = 256 * 1024;
namespace cuops::conv::depthwise {
alignas(16) float cuops_depthwise_smem[kSmemBytes / sizeof(float)];
}
namespace cuops::conv::small_ci {
alignas(16) unsigned char conv_small_ci_smem[kSmemBytes];
}

namespace {

using Args18 = int[18];
using Runner = void (*)(void* fn, unsigned char* const bufs[6], const Args18& a, unsigned bx, unsigned by,
                        unsigned tid);

template <typename T>
using Entry = void (*)(const T*, const uint8_t*, const float*, const float*, const T*, T*, int, int, int, int, int,
                       int, int, int, int, int, int, int, int, int, int, int, int, int);

// One block's worth of one thread: threadIdx from the flat thread id, then the entry point with T its element type.
template <typename T>
void run_block(void* fn, unsigned char* const bufs[6], const Args18& a, unsigned bx, unsigned by, unsigned tid) {
  threadIdx = make_uint3(tid % blockDim.x, tid / blockDim.x, 0);
  blockIdx = make_uint3(bx, by, 0);
  reinterpret_cast<Entry<T>>(fn)(reinterpret_cast<const T*>(bufs[0]), bufs[1], reinterpret_cast<const float*>(bufs[2]),
                                 reinterpret_cast<const float*>(bufs[3]), reinterpret_cast<const T*>(bufs[4]),
                                 reinterpret_cast<T*>(bufs[5]), a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8],
                                 a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16], a[17]);
}

struct Named {
  const char* name;
  size_t elem;   // bytes of T
  void* fn;
  Runner run;    // run_block<T>
  unsigned char* smem;  // the kernel's extern __shared__ array (kSmemBytes)
};

unsigned char* const kDepthwiseSmem = reinterpret_cast<unsigned char*>(cuops::conv::depthwise::cuops_depthwise_smem);
unsigned char* const kSmallCiSmem = cuops::conv::small_ci::conv_small_ci_smem;

#define EMU_ENTRY(NAME, T, SMEM) {#NAME, sizeof(T), reinterpret_cast<void*>(&NAME), &run_block<T>, SMEM}
#define EMU_DEPTHWISE(TAG, BITS, T)                                                                 \
  EMU_ENTRY(conv_depthwise_##TAG##_w##BITS##_nchw, T, kDepthwiseSmem),                              \
      EMU_ENTRY(conv_depthwise_##TAG##_w##BITS##_nhwc_v1, T, kDepthwiseSmem),                       \
      EMU_ENTRY(conv_depthwise_##TAG##_w##BITS##_nhwc_v2, T, kDepthwiseSmem),                       \
      EMU_ENTRY(conv_depthwise_##TAG##_w##BITS##_nhwc_v4, T, kDepthwiseSmem),                       \
      EMU_ENTRY(conv_depthwise_##TAG##_w##BITS##_nhwc_v4_k3, T, kDepthwiseSmem),                    \
      EMU_ENTRY(conv_depthwise_##TAG##_w##BITS##_nhwc_v4_k5, T, kDepthwiseSmem),                    \
      EMU_ENTRY(conv_depthwise_##TAG##_w##BITS##_nhwc_v4_k7, T, kDepthwiseSmem)
#define EMU_SMALL_CI(TAG, BITS, T)                                   \
  EMU_ENTRY(conv_small_ci_##TAG##_w##BITS##_nchw, T, kSmallCiSmem), \
      EMU_ENTRY(conv_small_ci_##TAG##_w##BITS##_nhwc, T, kSmallCiSmem)
#define EMU_MODULE(TAG, BITS, T) EMU_DEPTHWISE(TAG, BITS, T), EMU_SMALL_CI(TAG, BITS, T)
const Named kEntries[] = {EMU_MODULE(f32, 4, float),         EMU_MODULE(f32, 8, float),
                          EMU_MODULE(f16, 4, __half),        EMU_MODULE(f16, 8, __half),
                          EMU_MODULE(bf16, 4, __nv_bfloat16), EMU_MODULE(bf16, 8, __nv_bfloat16)};

// A heap block of exactly `shift` bytes + the size of DIR/NAME.bin, holding the file after the shift
// (nullptr if absent): ASan's redzone starts right after it.
unsigned char* load(const std::string& dir, const char* name, size_t shift, size_t* size, bool required) {
  std::ifstream f(dir + "/" + name + ".bin", std::ios::binary);
  if (!f) {
    if (required) {
      std::fprintf(stderr, "missing %s.bin\n", name);
      std::exit(2);
    }
    return nullptr;
  }
  std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  auto* p = static_cast<unsigned char*>(std::malloc(bytes.size() + shift));
  std::memcpy(p + shift, bytes.data(), bytes.size());
  *size = bytes.size();
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  std::ifstream launch(dir + "/launch.txt");
  std::string name;
  unsigned grid_x = 0, grid_y = 0, block_x = 0, block_y = 0;
  size_t smem = 0, x_shift = 0, out_shift = 0;
  Args18 args;
  launch >> name >> grid_x >> grid_y >> block_x >> block_y >> smem >> x_shift >> out_shift;
  for (int& v : args) launch >> v;
  if (!launch || smem > kSmemBytes || smem % 4 != 0) {  // both kernels stage 4-byte words
    std::fprintf(stderr, "bad launch.txt\n");
    return 2;
  }
  const Named* entry = nullptr;
  for (const Named& e : kEntries)
    if (name == e.name) entry = &e;
  if (entry == nullptr) {
    std::fprintf(stderr, "unknown kernel %s\n", name.c_str());
    return 2;
  }

  const char* names[6] = {"x", "qweight", "scale", "offset", "bias", "out"};
  size_t sizes[6] = {};
  unsigned char* heap[6];
  unsigned char* bufs[6];
  for (int i = 0; i < 6; ++i) {
    const size_t shift = (i == 0 ? x_shift : i == 5 ? out_shift : 0) * entry->elem;
    heap[i] = load(dir, names[i], shift, &sizes[i], i != 4);
    bufs[i] = heap[i] == nullptr ? nullptr : heap[i] + shift;
  }

  unsigned char* smem_base = entry->smem;
  EMU_POISON(smem_base + smem, kSmemBytes - smem);
  const unsigned threads = block_x * block_y;
  blockDim = dim3(block_x, block_y, 1);
  gridDim = dim3(grid_x, grid_y, 1);
  std::barrier<> barrier(threads);
  emu::block_barrier = &barrier;
  const unsigned blocks = grid_x * grid_y;
  std::vector<std::thread> pool;
  for (unsigned tid = 0; tid < threads; ++tid) {
    pool.emplace_back([&, tid] {
      for (unsigned blk = 0; blk < blocks; ++blk) {
        if (tid == 0) {  // a fresh block finds garbage: NaN, so that an unstaged read shows in the output
          const float nan = std::nanf("");
          for (size_t i = 0; i + 4 <= smem; i += 4) std::memcpy(smem_base + i, &nan, 4);
        }
        barrier.arrive_and_wait();
        entry->run(entry->fn, bufs, args, blk % grid_x, blk / grid_x, tid);
        barrier.arrive_and_wait();  // every thread done before the next block's NaN fill
      }
    });
  }
  for (std::thread& t : pool) t.join();

  std::ofstream out(dir + "/out.bin", std::ios::binary);
  out.write(reinterpret_cast<const char*>(bufs[5]), static_cast<std::streamsize>(sizes[5]));
  for (unsigned char* p : heap) std::free(p);
  return out ? 0 : 1;
}
