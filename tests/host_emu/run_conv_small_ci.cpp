// Runs one conv_small_ci_* entry point of custom_kernels/kernels/conv_small_ci.cu on the CPU (tests only):
//   run_conv_small_ci DIR
// DIR/launch.txt: kernel name, grid x y, block x, dynamic smem bytes, out_shift, the 18 CUOPS_CONV_INT_ARGS;
// DIR/{x,qweight,scale,offset,out}.bin (and bias.bin if present): the buffers, each copied into a heap
// block of exactly its size (out shifted by out_shift elements, to reach the unaligned-store path), so
// that AddressSanitizer reports any access past one. Shared memory past the launch's bytes is poisoned,
// and the launch's bytes are NaN-filled before each block. Writes DIR/out.bin back.
#include "cuda_host_shim.h"

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

constexpr size_t kSmemCapacity = 256 * 1024;
namespace cuops::conv::small_ci {
alignas(16) unsigned char conv_small_ci_smem[kSmemCapacity];  // the kernel's extern __shared__ array
}

namespace {

using Args18 = int[18];

template <typename T>
using Entry = void (*)(const T*, const uint8_t*, const float*, const float*, const T*, T*, int, int, int, int, int,
                       int, int, int, int, int, int, int, int, int, int, int, int, int);

struct Named {
  const char* name;
  int elem;  // bytes of T
  void* fn;
};

#define EMU_ENTRY(NAME, BYTES) {#NAME, BYTES, reinterpret_cast<void*>(&NAME)}
const Named kEntries[] = {
    EMU_ENTRY(conv_small_ci_f32_w4_nchw, 4),  EMU_ENTRY(conv_small_ci_f32_w4_nhwc, 4),
    EMU_ENTRY(conv_small_ci_f32_w8_nchw, 4),  EMU_ENTRY(conv_small_ci_f32_w8_nhwc, 4),
    EMU_ENTRY(conv_small_ci_f16_w4_nchw, 2),  EMU_ENTRY(conv_small_ci_f16_w4_nhwc, 2),
    EMU_ENTRY(conv_small_ci_f16_w8_nchw, 2),  EMU_ENTRY(conv_small_ci_f16_w8_nhwc, 2),
    EMU_ENTRY(conv_small_ci_bf16_w4_nchw, 2), EMU_ENTRY(conv_small_ci_bf16_w4_nhwc, 2),
    EMU_ENTRY(conv_small_ci_bf16_w8_nchw, 2), EMU_ENTRY(conv_small_ci_bf16_w8_nhwc, 2),
};

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

template <typename T>
void run_block(void* fn, unsigned char* const bufs[6], const Args18& a, unsigned bx, unsigned by, unsigned tid) {
  threadIdx = make_uint3(tid, 0, 0);
  blockIdx = make_uint3(bx, by, 0);
  reinterpret_cast<Entry<T>>(fn)(reinterpret_cast<const T*>(bufs[0]), bufs[1], reinterpret_cast<const float*>(bufs[2]),
                                 reinterpret_cast<const float*>(bufs[3]), reinterpret_cast<const T*>(bufs[4]),
                                 reinterpret_cast<T*>(bufs[5]), a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8],
                                 a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16], a[17]);
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
  unsigned grid_x = 0, grid_y = 0, threads = 0;
  size_t smem = 0, out_shift = 0;
  Args18 args;
  launch >> name >> grid_x >> grid_y >> threads >> smem >> out_shift;
  for (int& v : args) launch >> v;
  if (!launch || smem > kSmemCapacity) {
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
    const size_t shift = i == 5 ? out_shift * entry->elem : 0;
    heap[i] = load(dir, names[i], shift, &sizes[i], i != 4);
    bufs[i] = heap[i] == nullptr ? nullptr : heap[i] + shift;
  }

  unsigned char* smem_base = cuops::conv::small_ci::conv_small_ci_smem;
  EMU_POISON(smem_base + smem, kSmemCapacity - smem);
  blockDim = dim3(threads, 1, 1);
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
        const unsigned bx = blk % grid_x, by = blk / grid_x;
        if (entry->elem == 4) {
          run_block<float>(entry->fn, bufs, args, bx, by, tid);
        } else if (name.find("_f16_") != std::string::npos) {
          run_block<__half>(entry->fn, bufs, args, bx, by, tid);
        } else {
          run_block<__nv_bfloat16>(entry->fn, bufs, args, bx, by, tid);
        }
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
