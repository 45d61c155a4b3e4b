// CUTLASS 3 (Sm90): Params from to_underlying_arguments (TMA descriptors built here), grid and block
// from the kernel. Spliced into host_entry_points.cpp.
// @template
__attribute__((noinline)) int build(${operation_name}_base::Arguments const* args, void* workspace,
                                    char* params_out, int* launch_out) {
  using Kernel = ${operation_name}_base;
  if (!Kernel::can_implement(*args)) return 1;
  typename Kernel::Params params = Kernel::to_underlying_arguments(*args, workspace);
  std::memcpy(params_out, &params, sizeof(params));
  dim3 grid = Kernel::get_grid_shape(params);
  dim3 block = Kernel::get_block_shape();
  launch_out[0] = grid.x; launch_out[1] = grid.y; launch_out[2] = grid.z;
  launch_out[3] = block.x; launch_out[4] = block.y; launch_out[5] = block.z;
  return 0;
}
