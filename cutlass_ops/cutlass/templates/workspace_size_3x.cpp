// CUTLASS 3 (Sm90): the extern "C" workspace size (the tile scheduler's). Spliced into
// host_entry_points.cpp.
// @template
  unsigned long long ${operation_name}_cutlass_ops_workspace_size(${operation_name}_base::Arguments const* args) {
    return ${operation_name}_base::get_workspace_size(*args);
  }
