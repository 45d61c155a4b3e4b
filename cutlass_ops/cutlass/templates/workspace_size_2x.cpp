// CUTLASS 2.x: the extern "C" workspace size (none). Spliced into host_entry_points.cpp.
// @template
  unsigned long long ${operation_name}_cutlass_ops_workspace_size(${operation_name}_base::Arguments const*) {
    return 0;  // GemmUniversal in mode kGemm with one split uses no workspace
  }
