// CUTLASS 2.x (Sm75, Sm80): Params from Arguments, the split-K semaphore pointed at the workspace,
// the grid from the threadblock swizzle. Spliced into host_entry_points.cpp.
// @template
__attribute__((noinline)) int build(${operation_name}_base::Arguments const* args, void* workspace,
                                    char* params_out, int* launch_out) {
  using Kernel = ${operation_name}_base;
  if (Kernel::can_implement(*args) != cutlass::Status::kSuccess) return 1;
  Kernel::Params params(*args, -1, -1);
  params.semaphore = static_cast<int*>(workspace);
  std::memcpy(params_out, &params, sizeof(params));
  dim3 grid = typename Kernel::ThreadblockSwizzle().get_grid_shape(params.grid_tiled_shape);
  launch_out[0] = grid.x; launch_out[1] = grid.y; launch_out[2] = grid.z;
  launch_out[3] = Kernel::kThreadCount; launch_out[4] = 1; launch_out[5] = 1;
  return 0;
}
