// What the C++ per-call paths remember of a tensor between calls: a weak reference to its TensorImpl (which
// keeps the impl's memory, not its storage, so while the reference lives no other tensor can have its address)
// and its in-place version; and whether a call would need autograd (then Python takes it).
#pragma once

#include <torch/extension.h>

#include <cstdint>

using WeakImpl = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;

// Inference tensors have no version counter (-1, as plan_cache.version).
inline int64_t version_of(const at::Tensor& t) { return t.is_inference() ? -1 : static_cast<int64_t>(t._version()); }

inline int64_t version_of(c10::TensorImpl& t) {
  return t.is_inference() ? -1 : static_cast<int64_t>(t.version_counter().current_version());
}

// Whether a weakly held tensor is still the one recorded: alive, at the same in-place version.
inline bool unchanged(const WeakImpl& ref, int64_t version) {
  auto strong = ref.lock();
  return strong && version_of(*strong) == version;
}

inline bool no_grad_wanted(const at::Tensor& t) { return !(t.requires_grad() && at::GradMode::is_enabled()); }
