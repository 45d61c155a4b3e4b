// Our host entry points of an emitted CUTLASS GEMM, appended (by cutlass_ops/cutlass/emit.py) to the
// host library's source after the interface's HostTemplate. They write Params into the caller's
// buffer (the interface's get_params leaks a `new char[]` per call) and report the launch.
// Params are compared byte for byte across builds (pointer patching), and their padding bytes come
// from whatever was on the stack; the builder therefore runs in a frame over freshly zeroed stack.
// ${build_params} is build_params_<api>.cpp, ${workspace_size} workspace_size_<api>.cpp (api: 2x for
// CUTLASS 2 kernels, 3x for Sm90). Everything above the marker line is dropped when emitted (the
// text below it is part of every kernel's build-cache key: change it only with BUILD_FORMAT).
// @template

#include <cstring>
namespace ${operation_name}_cutlass_ops {
__attribute__((noinline)) void scrub_stack() {
  char region[1 << 15];
  std::memset(region, 0, sizeof(region));
  asm volatile("" : : "r"(region) : "memory");  // keep the memset: the region is "used"
}
}  // namespace

namespace ${operation_name}_cutlass_ops {
${build_params}}  // namespace
extern "C" {
  // cutlass_ops: Params of `args` into `params_out`; grid and block into launch_out[0..5].
  int ${operation_name}_cutlass_ops_params(${operation_name}_base::Arguments const* args, void* workspace,
                                           char* params_out, int* launch_out) {
    ${operation_name}_cutlass_ops::scrub_stack();
    return ${operation_name}_cutlass_ops::build(args, workspace, params_out, launch_out);
  }
${workspace_size}}
