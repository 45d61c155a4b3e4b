// How the C++ per-call paths (int8_gemm_launch.cpp, recipe_launch.cpp) launch: libcuda's cuLaunchKernelEx,
// handed over by Python once (set_launch_function), on a CUlaunchConfig per launch shape (grid, block, dynamic
// shared memory and the launch attributes: a thread-block cluster, programmatic dependent launch) as
// custom_kernels/launch.py builds them. hStream is set per call.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <cstring>
#include <vector>

using LaunchKernelEx = CUresult (*)(const CUlaunchConfig*, CUfunction, void**, void**);
inline LaunchKernelEx g_launch = nullptr;  // one for the extension (an inline variable: both files see it)

inline void fill_launch_config(CUlaunchConfig& c, CUlaunchAttribute (&attrs)[2], const std::vector<int64_t>& grid,
                               const std::vector<int64_t>& block, int64_t smem, const std::vector<int64_t>& cluster,
                               bool pdl) {
  unsigned n_attrs = 0;
  if (cluster[0] * cluster[1] * cluster[2] != 1) {
    attrs[n_attrs].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attrs[n_attrs].value.clusterDim.x = static_cast<unsigned>(cluster[0]);
    attrs[n_attrs].value.clusterDim.y = static_cast<unsigned>(cluster[1]);
    attrs[n_attrs].value.clusterDim.z = static_cast<unsigned>(cluster[2]);
    ++n_attrs;
  }
  if (pdl) {
    attrs[n_attrs].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attrs[n_attrs].value.programmaticStreamSerializationAllowed = 1;
    ++n_attrs;
  }
  std::memset(&c, 0, sizeof(c));
  c.gridDimX = static_cast<unsigned>(grid[0]);
  c.gridDimY = static_cast<unsigned>(grid[1]);
  c.gridDimZ = static_cast<unsigned>(grid[2]);
  c.blockDimX = static_cast<unsigned>(block[0]);
  c.blockDimY = static_cast<unsigned>(block[1]);
  c.blockDimZ = static_cast<unsigned>(block[2]);
  c.sharedMemBytes = static_cast<unsigned>(smem);
  c.attrs = n_attrs ? attrs : nullptr;
  c.numAttrs = n_attrs;
}

// A one-dimensional launch (blocks of `threads`, no dynamic shared memory, optionally a programmatic dependent) whose
// CUlaunchConfig fill_launch_config builds once; a call sets only the grid and the stream, on a copy (callers may
// share one). attrs lives in the object, so the copy is pointed at it per call (the object may have been copied
// into a table since its config was built).
struct Launch1D {
  CUfunction function = nullptr;
  CUlaunchConfig config{};
  CUlaunchAttribute attrs[2]{};

  Launch1D() = default;
  Launch1D(CUfunction f, int64_t threads, bool pdl) : function(f) {
    fill_launch_config(config, attrs, {1, 1, 1}, {threads, 1, 1}, 0, {1, 1, 1}, pdl);
  }
  CUresult operator()(int64_t grid, int64_t stream, void** args) const {
    CUlaunchConfig c = config;
    c.gridDimX = static_cast<unsigned>(grid);
    c.hStream = reinterpret_cast<CUstream>(stream);
    c.attrs = c.numAttrs ? const_cast<CUlaunchAttribute*>(attrs) : nullptr;
    return g_launch(&c, function, args, nullptr);
  }
};
