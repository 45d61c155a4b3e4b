// The per-call host path of cutlass_ops.int8_gemm in C++ (a torch extension): check the epilogue
// tensors and D, allocate D, patch the operand pointers into a prepared Params and launch. And the
// eager forward of QuantLinear(mode="w8a8_channel") in one call (run_channel): the per-token
// quantization kernel (quant_token.cu) into fresh A_q and s, then the registered dequant GEMM. An N the
// kernel cannot store runs here too once Python padded that weight (register_padded): the GEMM on
// B's padded copy into a fresh D_pad, then unpad_rows.cu into D.
//
// Why: the same steps in Python cost 8-10 us per call (about 25 tensor-method calls and the
// bookkeeping around them); here they cost about one. Python keeps every rule and every error
// message: run() returns None whenever anything is not the plain case (a missing or extra input, a
// wrong dtype, size, device or alignment, an input asking for a gradient, a per-column input not yet
// checked for NaN / Inf, `out` overlapping A or B, a shape whose Params were never prepared), and the caller
// then takes the Python path, which raises the precise error or prepares the shape and registers
// it here. The Params of a shape are registered only after Python verified that patching their
// pointer words gives the same bytes as building them afresh.
#include <torch/csrc/autograd/python_variable.h>
#include <torch/extension.h>

#include "launch_config.h"
#include "recipe_launch.h"
#include "tensor_refs.h"

#include <cuda.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <unordered_map>
#include <vector>

namespace {


constexpr int kMaxPointers = 16;

struct Input {
  py::str name;
  int kind;       // 0: per row [M], 1: per column [N], 2: matrix [M, N]
  int slot;       // index in the kernel's pointer list
  bool required;
};

struct Key {
  int64_t M, N, K, nonnull;
  int device;
  bool operator==(const Key& o) const {
    return M == o.M && N == o.N && K == o.K && nonnull == o.nonnull && device == o.device;
  }
};
struct KeyHash {
  size_t operator()(const Key& k) const {
    uint64_t h = static_cast<uint64_t>(k.M) * 0x9E3779B97F4A7C15ull;
    h ^= static_cast<uint64_t>(k.N) + 0x7F4A7C159E3779B9ull + (h << 6) + (h >> 2);
    h ^= static_cast<uint64_t>(k.K) + (h << 6) + (h >> 2);
    h ^= static_cast<uint64_t>(k.nonnull) + (h << 6) + (h >> 2);
    return h ^ static_cast<uint64_t>(k.device);
  }
};

struct Pointers {
  uint64_t p[kMaxPointers];
  bool operator==(const Pointers& o) const { return std::memcmp(p, o.p, sizeof(p)) == 0; }
};
struct PointersHash {
  size_t operator()(const Pointers& k) const {
    uint64_t h = 0xCBF29CE484222325ull;
    for (uint64_t v : k.p) h = (h ^ v) * 0x100000001B3ull;
    return h;
  }
};
// Bounds as in cutlass_ops/cutlass/kernel.py: Params kept per shape for kernels that need them rebuilt (a
// model's layers of one shape each bring their own weight pointer), per plan over all its shapes, and shapes.
constexpr size_t kRebuiltKept = 64;
constexpr size_t kRebuiltTotal = 2048;
constexpr size_t kShapesKept = 1024;  // shapes per plan; past that the table starts over (those calls
                                      // then stay on the Python path, which is correct, only slower)

struct State {
  bool patch;                                        // true: one Params, pointer words patched per call
  std::vector<uint64_t> params;                      // patch: Params as 8-byte words
  void* args[1];                                     // patch: kernelParams, the address of params
  std::vector<std::pair<int, int>> words;            // patch: (word in params, pointer slot)
  // !patch (Sm90: TMA descriptors hold the pointers): Params built by Python per pointer set
  std::unordered_map<Pointers, std::vector<uint64_t>, PointersHash> rebuilt;
  CUfunction function;
  CUlaunchAttribute attrs[2];
  CUlaunchConfig config;
};

struct Plan {
  int slot_A, slot_B, slot_C, slot_D;
  bool c_is_d;
  int64_t always;  // pointer bits every call sets
  int align_D;
  at::ScalarType out_dtype;
  std::vector<Input> inputs;
  std::unordered_map<Key, std::unique_ptr<State>, KeyHash> states;
  size_t rebuilt_total = 0;  // rebuilt Params over all states (an upper bound: replaced states are not subtracted)
};

// Never destroyed: its Python strings must not be released after the interpreter has finalized.
std::vector<std::unique_ptr<Plan>>& g_plans = *new std::vector<std::unique_ptr<Plan>>();

// Per-output-channel inputs Python found free of NaN / Inf (cutlass_ops/finite_check.py), at the in-place
// version it checked. The weak reference keeps the TensorImpl's memory (not its storage) alive, so while
// an entry exists no other tensor can have its address: a hit is the same tensor.
struct Checked {
  WeakImpl ref;
  int64_t version;
};
std::unordered_map<const c10::TensorImpl*, Checked>& g_finite =
    *new std::unordered_map<const c10::TensorImpl*, Checked>();
constexpr size_t kFiniteKept = 4096;  // as finite_check.KEPT; past that the table starts over


bool finite_checked(const at::Tensor& t) {
  auto hit = g_finite.find(t.unsafeGetTensorImpl());
  return hit != g_finite.end() && hit->second.version == version_of(t);
}

// Weight-side padded copies Python made for an N the kernels cannot store (cutlass_ops/cutlass/padding.py:
// B [N_pad, K] and per-column inputs [N_pad], kept there per tensor version), by (tensor, N_pad). The copy is
// held weakly: Python's memo owns it, so it is freed with the tensor as before; a lookup that finds it gone
// or the tensor changed in place hands the call back to Python.
struct PaddedKey {
  const c10::TensorImpl* impl;
  int64_t rows;
  bool operator==(const PaddedKey& o) const { return impl == o.impl && rows == o.rows; }
};
struct PaddedKeyHash {
  size_t operator()(const PaddedKey& k) const {
    return std::hash<const void*>()(k.impl) ^ (static_cast<uint64_t>(k.rows) * 0x9E3779B97F4A7C15ull);
  }
};
struct PaddedCopy {
  WeakImpl of;  // keeps the padded tensor's impl memory: a hit is the same tensor
  int64_t version;
  WeakImpl copy;
};
std::unordered_map<PaddedKey, PaddedCopy, PaddedKeyHash>& g_padded =
    *new std::unordered_map<PaddedKey, PaddedCopy, PaddedKeyHash>();
constexpr size_t kPaddedKept = 4096;  // as padding.KEPT; past that the table starts over

// The registered copy of t with `rows` rows (B) or elements (a per-column input), or an undefined tensor.
at::Tensor padded_copy(const at::Tensor& t, int64_t rows) {
  auto hit = g_padded.find(PaddedKey{t.unsafeGetTensorImpl(), rows});
  if (hit == g_padded.end() || hit->second.version != version_of(t)) return at::Tensor();
  auto strong = hit->second.copy.lock();
  if (!strong) return at::Tensor();
  return at::Tensor(std::move(strong));
}

// unpad_rows (custom_kernels/kernels/unpad_rows.cu) per (device, load width): D = D_pad[:, :N].
struct UnpadLaunch {
  Launch1D launch;     // blocks of 256 threads
  int64_t max_blocks;  // one 16-byte vector per thread and trip
};
std::unordered_map<int64_t, UnpadLaunch>& g_unpad = *new std::unordered_map<int64_t, UnpadLaunch>();

int64_t unpad_key(int64_t device, int64_t width) { return device * 32 + width; }

// D = D_pad[:, :N] on the stream, after the GEMM that wrote D_pad [M, N_pad] (D [..., N], contiguous).
CUresult launch_unpad(const UnpadLaunch& u, const at::Tensor& D_pad, const at::Tensor& D, int64_t stream) {
  const int64_t size = D.element_size();
  uint64_t src = reinterpret_cast<uint64_t>(D_pad.data_ptr()), dst = reinterpret_cast<uint64_t>(D.data_ptr());
  int64_t total = D.numel() * size;
  int32_t row = static_cast<int32_t>(D.size(-1) * size), pitch = static_cast<int32_t>(D_pad.size(1) * size);
  void* args[] = {&src, &dst, &total, &row, &pitch};  // padding.UnpadRowsArgs' order
  const int64_t vecs = (total + 15) / 16;
  return u.launch(std::max<int64_t>(1, std::min((vecs + 255) / 256, u.max_blocks)), stream, args);
}

// The padded problem of an N that plan p's kernel cannot store: N rounded up to its alignment, Python's kept copy
// of B [rows, K] and the unpad_rows launch of D's row width. found() is false where Python has not prepared them
// (the call then goes to Python).
struct PaddedN {
  int64_t rows = 0;
  at::Tensor B;
  const UnpadLaunch* unpad = nullptr;
  bool found() const { return unpad != nullptr; }
};
PaddedN padded_problem(const Plan& p, const at::Tensor& B, int64_t N, int64_t device) {
  PaddedN r;
  r.rows = (N + p.align_D - 1) / p.align_D * p.align_D;
  auto u = g_unpad.find(unpad_key(device, std::gcd<int64_t>(N * at::elementSize(p.out_dtype), 16)));
  r.B = padded_copy(B, r.rows);
  if (u != g_unpad.end() && r.B.defined() && r.B.size(1) == B.size(1)) r.unpad = &u->second;
  return r;
}

// Whether the byte spans of two contiguous tensors intersect (`out` must not alias A or B).
bool overlaps(uint64_t a, int64_t a_bytes, uint64_t b, int64_t b_bytes) {
  return a < b + static_cast<uint64_t>(b_bytes) && b < a + static_cast<uint64_t>(a_bytes);
}

bool float_input_ok(const at::Tensor& t, int kind, int64_t M, int64_t N, int device) {
  if (t.scalar_type() != at::kFloat || !t.is_contiguous() || t.get_device() != device) return false;
  if (kind == 2) return t.dim() == 2 && t.size(0) == M && t.size(1) == N;
  return t.numel() == (kind == 0 ? M : N);
}

// The registered state of plan p for this problem, or nullptr (a shape Python has not prepared yet).
State* find_state(Plan& p, int64_t M, int64_t N, int64_t K, int64_t nonnull, int dev) {
  auto found = p.states.find(Key{M, N, K, nonnull, dev});
  return found == p.states.end() ? nullptr : found->second.get();
}

// The kernelParams of state s for these pointers: its Params patched with them, or (Sm90: the pointers
// live in TMA descriptors) the Params Python built for this pointer set, through `rebuilt`; nullptr
// when Python has not built those yet.
void** kernel_params(State& s, const uint64_t (&ptr)[kMaxPointers], void*& rebuilt) {
  if (s.patch) {
    for (const auto& [word, slot] : s.words) s.params[word] = ptr[slot];
    return s.args;
  }
  Pointers key{};
  std::memcpy(key.p, ptr, sizeof(ptr));
  auto hit = s.rebuilt.find(key);
  if (hit == s.rebuilt.end()) return nullptr;
  rebuilt = hit->second.data();
  return &rebuilt;
}

CUresult launch(State& s, void** args, int64_t stream) {
  s.config.hStream = reinterpret_cast<CUstream>(stream);
  return g_launch(&s.config, s.function, args, nullptr);
}

}  // namespace

void set_launch_function(int64_t address) { g_launch = reinterpret_cast<LaunchKernelEx>(address); }

// Remember that Python checked these per-column inputs for NaN / Inf at their current version.
void mark_finite(const std::vector<at::Tensor>& tensors) {
  for (const at::Tensor& t : tensors) {
    if (g_finite.size() >= kFiniteKept) g_finite.clear();
    g_finite.insert_or_assign(t.unsafeGetTensorImpl(), Checked{WeakImpl(t.getIntrusivePtr()), version_of(t)});
  }
}

int64_t finite_count() { return static_cast<int64_t>(g_finite.size()); }

// Python's padded copy of t (B with N_pad rows, or a per-column input of N_pad elements) at t's current version.
void register_padded(const at::Tensor& t, int64_t rows, const at::Tensor& copy) {
  if (g_padded.size() >= kPaddedKept) g_padded.clear();
  g_padded.insert_or_assign(PaddedKey{t.unsafeGetTensorImpl(), rows},
                            PaddedCopy{WeakImpl(t.getIntrusivePtr()), version_of(t), WeakImpl(copy.getIntrusivePtr())});
}

int64_t padded_count() { return static_cast<int64_t>(g_padded.size()); }

// The unpad_rows function built with LOAD_BYTES = width for `device` (padding.unpad_rows' launch).
void register_unpad(int64_t device, int64_t width, int64_t function, int64_t max_blocks, bool pdl) {
  TORCH_CHECK(function != 0 && max_blocks > 0 && (width == 1 || width == 2 || width == 4 || width == 8 || width == 16),
              "register_unpad: bad launch parameters");
  g_unpad[unpad_key(device, width)] = UnpadLaunch{Launch1D(reinterpret_cast<CUfunction>(function), 256, pdl), max_blocks};
}

int64_t register_plan(int64_t slot_A, int64_t slot_B, int64_t slot_C, int64_t slot_D, bool c_is_d, int64_t always,
                      int64_t align_D, const at::Tensor& out_example,
                      const std::vector<std::tuple<std::string, int64_t, int64_t, bool>>& inputs) {
  for (int64_t slot : {slot_A, slot_B, slot_D})
    TORCH_CHECK(slot >= 0 && slot < kMaxPointers, "pointer slot out of range");
  TORCH_CHECK(slot_C < kMaxPointers && (!c_is_d || slot_C >= 0), "pointer slot of C out of range");
  auto plan = std::make_unique<Plan>();
  plan->slot_A = static_cast<int>(slot_A);
  plan->slot_B = static_cast<int>(slot_B);
  plan->slot_C = static_cast<int>(slot_C);
  plan->slot_D = static_cast<int>(slot_D);
  plan->c_is_d = c_is_d;
  plan->always = always;
  plan->align_D = static_cast<int>(align_D);
  plan->out_dtype = out_example.scalar_type();
  for (const auto& [name, kind, slot, required] : inputs) {
    TORCH_CHECK(slot >= 0 && slot < kMaxPointers, "pointer slot out of range");
    plan->inputs.push_back(Input{py::str(name), static_cast<int>(kind), static_cast<int>(slot), required});
  }
  g_plans.push_back(std::move(plan));
  return static_cast<int64_t>(g_plans.size() - 1);
}

void register_state(int64_t plan_id, int64_t M, int64_t N, int64_t K, int64_t nonnull, int64_t device,
                    const py::bytes& params, const std::vector<std::pair<int64_t, int64_t>>& words, int64_t function,
                    const std::vector<int64_t>& grid, const std::vector<int64_t>& block, int64_t smem,
                    const std::vector<int64_t>& cluster, bool pdl) {
  TORCH_CHECK(plan_id >= 0 && plan_id < static_cast<int64_t>(g_plans.size()), "unknown plan");
  const std::string bytes = params;
  auto s = std::make_unique<State>();
  s->patch = !words.empty();
  s->params.assign((bytes.size() + 7) / 8, 0);
  std::memcpy(s->params.data(), bytes.data(), bytes.size());
  s->args[0] = s->params.data();
  for (const auto& [word, slot] : words) {
    TORCH_CHECK(word >= 0 && word < static_cast<int64_t>(s->params.size()) && slot >= 0 && slot < kMaxPointers,
                "pointer word out of range");
    s->words.emplace_back(static_cast<int>(word), static_cast<int>(slot));
  }
  s->function = reinterpret_cast<CUfunction>(function);
  fill_launch_config(s->config, s->attrs, grid, block, smem, cluster, pdl);
  Plan& plan = *g_plans[plan_id];
  auto& states = plan.states;
  if (states.size() >= kShapesKept) {
    states.clear();
    plan.rebuilt_total = 0;
  }
  states[Key{M, N, K, nonnull, static_cast<int>(device)}] = std::move(s);
}

// Params built for one pointer set of a registered shape whose Params cannot be patched.
// False when the shape is not registered (any more): the caller registers it again.
bool register_params(int64_t plan_id, int64_t M, int64_t N, int64_t K, int64_t nonnull, int64_t device,
                     const std::vector<int64_t>& pointers, const py::bytes& params) {
  Plan& plan = *g_plans.at(plan_id);
  auto& states = plan.states;
  auto found = states.find(Key{M, N, K, nonnull, static_cast<int>(device)});
  if (found == states.end()) return false;
  TORCH_CHECK(!found->second->patch, "register_params: this shape's Params are patched, not rebuilt");
  TORCH_CHECK(pointers.size() <= kMaxPointers, "too many pointers");
  Pointers key{};
  for (size_t i = 0; i < pointers.size(); ++i) key.p[i] = static_cast<uint64_t>(pointers[i]);
  const std::string bytes = params;
  std::vector<uint64_t> words((bytes.size() + 7) / 8, 0);
  std::memcpy(words.data(), bytes.data(), bytes.size());
  if (plan.rebuilt_total >= kRebuiltTotal) {  // the plan's bound: start over for every shape
    for (auto& entry : states) entry.second->rebuilt.clear();
    plan.rebuilt_total = 0;
  }
  auto& rebuilt = found->second->rebuilt;
  if (rebuilt.size() >= kRebuiltKept) {
    plan.rebuilt_total -= rebuilt.size();
    rebuilt.clear();
  }
  plan.rebuilt_total += rebuilt.insert_or_assign(key, std::move(words)).second ? 1 : 0;
  return true;
}

// D for operands the caller checked (int8, 2-D, contiguous, same K, A and B on `device`), or None
// for the Python path; an int is a failed launch's CUresult.
// need_finite: cutlass_ops.int8_gemm's call, whose per-column inputs must have been checked for NaN / Inf
// (the library's own callers pass false: their inputs are module buffers checked where they are made).
// padded: an N this kernel cannot store may run on its padded problem (Python's rule: Int8Gemm.any_n_for
// chose no any-N kernel, and no CUDA graph is being captured, since the copies are kept per tensor).
py::object run(int64_t plan_id, const at::Tensor& A, const at::Tensor& B, int64_t device, py::handle out_obj,
               py::dict inputs, int64_t stream, bool need_finite, bool padded) {
  Plan& p = *g_plans[plan_id];
  const int64_t M = A.size(0), K = A.size(1), N = B.size(0);
  if (M == 0 || N == 0 || K == 0 || K % 16 || g_launch == nullptr) return py::none();
  const int dev = static_cast<int>(device);
  PaddedN padded_N;  // the padded problem (N_pad rows, B's kept copy, the unpad launch) of an N p cannot store
  if (N % p.align_D) {
    if (!padded) return py::none();
    padded_N = padded_problem(p, B, N, device);
    if (!padded_N.found()) return py::none();
  }
  const bool pad = padded_N.found();
  const int64_t N_pad = pad ? padded_N.rows : N;
  const at::Tensor& B_pad = padded_N.B;
  at::Tensor kept[kMaxPointers];  // the padded per-column inputs, alive until the launch
  uint64_t ptr[kMaxPointers] = {0};
  ptr[p.slot_A] = reinterpret_cast<uint64_t>(A.data_ptr());
  ptr[p.slot_B] = reinterpret_cast<uint64_t>((pad ? B_pad : B).data_ptr());
  uint64_t misaligned = ptr[p.slot_A] | ptr[p.slot_B];
  int64_t nonnull = p.always;
  Py_ssize_t given = 0;
  for (const Input& in : p.inputs) {
    PyObject* v = PyDict_GetItem(inputs.ptr(), in.name.ptr());  // borrowed; null if absent
    if (v == nullptr || v == Py_None) {
      given += v != nullptr;
      if (in.required) return py::none();
      continue;
    }
    ++given;
    if (!THPVariable_Check(v)) return py::none();
    const at::Tensor& t = THPVariable_Unpack(v);
    if (!float_input_ok(t, in.kind, M, N, dev)) return py::none();
    // Python raises for these: an input asking for a gradient, a per-column input not yet checked.
    if (t.requires_grad() && at::GradMode::is_enabled()) return py::none();
    if (need_finite && in.kind == 1 && !finite_checked(t)) return py::none();
    uint64_t q = reinterpret_cast<uint64_t>(t.data_ptr());
    if (pad && in.kind != 0) {  // per-column inputs: their kept copies; matrix inputs are padded per call (Python)
      if (in.kind == 2) return py::none();
      kept[in.slot] = padded_copy(t, N_pad);
      if (!kept[in.slot].defined()) return py::none();
      q = reinterpret_cast<uint64_t>(kept[in.slot].data_ptr());
    }
    ptr[in.slot] = q;
    misaligned |= q;
    nonnull |= int64_t{1} << in.slot;
  }
  if (given != PyDict_Size(inputs.ptr())) return py::none();  // an input this epilogue does not take
  State* state = find_state(p, M, N_pad, K, nonnull, dev);
  if (state == nullptr) return py::none();
  // D_pad before D, as the Python path allocates them: a Sm90 pointer set it registered comes back
  at::Tensor D_pad = pad ? at::empty({M, N_pad}, A.options().dtype(p.out_dtype)) : at::Tensor();
  const bool row_view = pad && M == 1 && out_obj.is_none();  // D is D_pad's one row, contiguous as it is
  at::Tensor out;
  if (out_obj.is_none()) {
    if (!row_view) out = at::empty({M, N}, A.options().dtype(p.out_dtype));
  } else {
    if (!THPVariable_Check(out_obj.ptr())) return py::none();
    out = THPVariable_Unpack(out_obj.ptr());
    if (out.scalar_type() != p.out_dtype || out.dim() != 2 || out.size(0) != M || out.size(1) != N ||
        !out.is_contiguous() || out.get_device() != dev)
      return py::none();
    const uint64_t d = reinterpret_cast<uint64_t>(out.data_ptr());
    if (overlaps(d, out.nbytes(), ptr[p.slot_A], A.nbytes()) ||
        overlaps(d, out.nbytes(), reinterpret_cast<uint64_t>(B.data_ptr()), B.nbytes()))
      return py::none();  // Python raises: the kernel would read what it writes
  }
  if (!pad) D_pad = out;
  if (pad && !row_view) misaligned |= reinterpret_cast<uint64_t>(out.data_ptr());  // unpad_rows: 16-byte stores
  ptr[p.slot_D] = reinterpret_cast<uint64_t>(D_pad.data_ptr());
  misaligned |= ptr[p.slot_D];
  if (p.c_is_d) ptr[p.slot_C] = ptr[p.slot_D];  // 2.x LinearCombination reads C only when beta != 0
  if (misaligned & 15) return py::none();
  void* rebuilt = nullptr;
  void** args = kernel_params(*state, ptr, rebuilt);
  if (args == nullptr) return py::none();  // Python builds (and registers) them
  CUresult err = launch(*state, args, stream);
  if (err != CUDA_SUCCESS) return py::int_(static_cast<int>(err));
  if (!pad) return py::cast(out);
  if (row_view) return py::cast(D_pad.narrow(1, 0, N));
  err = launch_unpad(*padded_N.unpad, D_pad, out, stream);
  if (err != CUDA_SUCCESS) return py::int_(static_cast<int>(err));
  return py::cast(out);
}

// ------------------------------------------------------------------------------------------------
// QuantLinear(mode="w8a8_channel"): per-token quantization + the dequant GEMM in one call
// ------------------------------------------------------------------------------------------------
//
// The Python path (cutlass_ops.torch_ops.linear_w8a8_channel_impl) quantizes x per token
// (cutlass_ops/w8a8/quant_token.py: two allocations and one launch) and runs the dequant GEMM with
// scale_row = s, scale_col = the weight's scale, bias = its float32 copy. After it ran, Python registers
// the quant_token launch of (device, x dtype, K) and the GEMM plan of (device, x dtype, activation) it
// used (cutlass_ops/w8a8/channel_fast.py); run_channel then does the same in one call, or returns None
// for anything not plain, before any launch.

namespace {

struct QuantKey {
  int device, dtype;
  int64_t K;
  bool operator==(const QuantKey& o) const { return device == o.device && dtype == o.dtype && K == o.K; }
};
struct QuantKeyHash {
  size_t operator()(const QuantKey& k) const {
    return (static_cast<uint64_t>(k.K) * 0x9E3779B97F4A7C15ull) ^ (static_cast<uint64_t>(k.dtype) << 8) ^
           static_cast<uint64_t>(k.device);
  }
};

// quant_token_<dtype> on one device for rows of K elements (quant_token.py: _plan).
struct QuantLaunch {
  Launch1D launch;
  int64_t rows_per_block;  // rows one block takes at a time (8 warps / warps_per_row)
  int32_t warps_per_row;
  int64_t grid_cap;        // blocks past which the grid strides over row groups
};
constexpr size_t kQuantKept = 256;  // as quant_token.MAX_PLANS; past that the table starts over

// A dequant GEMM plan the channel path may use, with the pointer slots of its three inputs.
struct ChannelGemm {
  int plan_id, slot_scale_row, slot_scale_col, slot_bias;
};
using ChannelKey = QuantKey;  // (device, x dtype, activation code)

std::unordered_map<QuantKey, QuantLaunch, QuantKeyHash>& g_quant =
    *new std::unordered_map<QuantKey, QuantLaunch, QuantKeyHash>();
// A plan per M bucket of the GEMM family (3) and the any-N plan: a shape's state lives in one of them.
std::unordered_map<ChannelKey, std::vector<ChannelGemm>, QuantKeyHash>& g_channel =
    *new std::unordered_map<ChannelKey, std::vector<ChannelGemm>, QuantKeyHash>();

bool is_token_dtype(at::ScalarType t) { return t == at::kHalf || t == at::kBFloat16 || t == at::kFloat; }


}  // namespace

void register_quant_token(int64_t device, const at::Tensor& x_example, int64_t K, int64_t function,
                          int64_t threads, int64_t rows_per_block, int64_t warps_per_row, int64_t grid_cap) {
  TORCH_CHECK(is_token_dtype(x_example.scalar_type()), "register_quant_token: x must be float16, bfloat16 or float32");
  TORCH_CHECK(function != 0 && threads > 0 && threads <= 1024 && rows_per_block > 0 && warps_per_row > 0 &&
                  grid_cap > 0, "register_quant_token: bad launch parameters");
  if (g_quant.size() >= kQuantKept) g_quant.clear();
  g_quant[QuantKey{static_cast<int>(device), static_cast<int>(x_example.scalar_type()), K}] =
      QuantLaunch{Launch1D(reinterpret_cast<CUfunction>(function), threads, false), rows_per_block,
                  static_cast<int32_t>(warps_per_row), grid_cap};
}

// Let run_channel use GEMM plan `plan_id` (a "dequant*" epilogue writing x's dtype) for x of this dtype
// and activation on `device`. False, registering nothing, when the plan's inputs are not exactly
// scale_row (per row, required), scale_col (per column, required), bias (per column, optional).
bool register_channel(int64_t device, const at::Tensor& x_example, int64_t act, int64_t plan_id) {
  TORCH_CHECK(plan_id >= 0 && plan_id < static_cast<int64_t>(g_plans.size()), "unknown plan");
  const Plan& p = *g_plans[plan_id];
  if (p.out_dtype != x_example.scalar_type() || !is_token_dtype(p.out_dtype) || p.inputs.size() != 3) return false;
  ChannelGemm g{static_cast<int>(plan_id), -1, -1, -1};
  for (const Input& in : p.inputs) {
    const std::string name = in.name.cast<std::string>();
    if (name == "scale_row" && in.kind == 0 && in.required) g.slot_scale_row = in.slot;
    else if (name == "scale_col" && in.kind == 1 && in.required) g.slot_scale_col = in.slot;
    else if (name == "bias" && in.kind == 1 && !in.required) g.slot_bias = in.slot;
  }
  if (g.slot_scale_row < 0 || g.slot_scale_col < 0 || g.slot_bias < 0) return false;
  auto& gemms = g_channel[ChannelKey{static_cast<int>(device), static_cast<int>(p.out_dtype), act}];
  for (const ChannelGemm& known : gemms)
    if (known.plan_id == g.plan_id) return true;
  if (gemms.size() >= 8) gemms.clear();  // more plans than M buckets: a stale set, start over
  gemms.push_back(g);
  return true;
}

// act((quantize_per_token(x) @ B^T) * s * scale + bias) as [..., N] in x's dtype, or None for the Python
// path (which raises the precise error, or prepares what is missing and registers it); nothing is
// launched before every check passed. x [..., K] float16 / bfloat16 / float32, contiguous; B [N, K] int8;
// scale [N] (or [N, 1]) float32; bias None or float32 [N] (the caller's float32 copy). padded: an N the bucket's
// kernel cannot store may run on its registered padded copies (false while a CUDA graph is captured). On a
// failed launch, (0 for quant_token, 1 for the GEMM or 2 for unpad_rows, the CUresult).
py::object run_channel(const at::Tensor& x, const at::Tensor& B, const at::Tensor& scale, py::handle bias_obj,
                       int64_t act, int64_t stream, bool padded) {
  const int dev = static_cast<int>(x.get_device());  // -1 on the CPU
  if (g_launch == nullptr || dev < 0 || x.dim() < 1 || !is_token_dtype(x.scalar_type()) || !x.is_contiguous() ||
      !no_grad_wanted(x))
    return py::none();
  const int64_t K = x.size(-1), N = B.size(0);
  // K % 16 != 0: the GEMM runs on zero-padded operands, which only Python prepares
  if (K == 0 || K % 16 || K > INT32_MAX || B.scalar_type() != at::kChar || B.dim() != 2 || B.size(1) != K || N == 0 ||
      !B.is_contiguous() || B.get_device() != dev)
    return py::none();
  const int64_t M = x.numel() / K;
  if (M == 0 || M > INT32_MAX || !float_input_ok(scale, 1, M, N, dev) || !no_grad_wanted(scale)) return py::none();
  at::Tensor bias;
  if (!bias_obj.is_none()) {
    if (!THPVariable_Check(bias_obj.ptr())) return py::none();
    bias = THPVariable_Unpack(bias_obj.ptr());
    if (!float_input_ok(bias, 1, M, N, dev) || !no_grad_wanted(bias)) return py::none();
  }
  const int dtype = static_cast<int>(x.scalar_type());
  auto quant = g_quant.find(QuantKey{dev, dtype, K});
  auto gemms = g_channel.find(ChannelKey{dev, dtype, act});
  if (quant == g_quant.end() || gemms == g_channel.end()) return py::none();
  // The plan of M's bucket holds the state of this M, or (an N it cannot store) the any-N plan, or, where
  // Python ran the padded problem (padded: not while a graph is captured), the bucket's plan at N_pad.
  State* state = nullptr;
  const ChannelGemm* gemm = nullptr;
  int64_t N_pad = N;
  PaddedN padded_N;                // the padded problem of an N the plan cannot store (not found: not padded)
  at::Tensor scale_pad, bias_pad;  // the kept padded per-column inputs
  for (const ChannelGemm& g : gemms->second) {
    Plan& p = *g_plans[g.plan_id];
    int64_t rows = N;
    if (N % p.align_D) {
      if (!padded) continue;
      padded_N = padded_problem(p, B, N, dev);
      rows = padded_N.rows;
      scale_pad = padded_copy(scale, rows);
      bias_pad = bias.defined() ? padded_copy(bias, rows) : at::Tensor();
      if (!padded_N.found() || !scale_pad.defined() || (bias.defined() && !bias_pad.defined())) continue;
    }
    int64_t nonnull = p.always | (int64_t{1} << g.slot_scale_row) | (int64_t{1} << g.slot_scale_col);
    if (bias.defined()) nonnull |= int64_t{1} << g.slot_bias;
    state = find_state(p, M, rows, K, nonnull, dev);
    if (state != nullptr) {
      gemm = &g;
      N_pad = rows;
      break;
    }
  }
  if (state == nullptr) return py::none();
  const bool pad = N_pad != N;
  Plan& p = *g_plans[gemm->plan_id];
  // The Python path's allocations, in its order (A_q, s, D, or A_q, s, D_pad, D): a pointer set it registered
  // comes back.
  at::Tensor A_q = at::empty({M, K}, x.options().dtype(at::kChar));
  at::Tensor s = at::empty({M, 1}, x.options().dtype(at::kFloat));
  at::Tensor D_pad = pad ? at::empty({M, N_pad}, x.options()) : at::Tensor();
  std::vector<int64_t> out_sizes(x.sizes().begin(), x.sizes().end());
  out_sizes.back() = N;
  at::Tensor out = at::empty(out_sizes, x.options());
  if (!pad) D_pad = out;
  uint64_t ptr[kMaxPointers] = {0};
  ptr[p.slot_A] = reinterpret_cast<uint64_t>(A_q.data_ptr());
  ptr[p.slot_B] = reinterpret_cast<uint64_t>((pad ? padded_N.B : B).data_ptr());
  ptr[p.slot_D] = reinterpret_cast<uint64_t>(D_pad.data_ptr());
  if (p.c_is_d) ptr[p.slot_C] = ptr[p.slot_D];
  ptr[gemm->slot_scale_row] = reinterpret_cast<uint64_t>(s.data_ptr());
  ptr[gemm->slot_scale_col] = reinterpret_cast<uint64_t>((pad ? scale_pad : scale).data_ptr());
  if (bias.defined()) ptr[gemm->slot_bias] = reinterpret_cast<uint64_t>((pad ? bias_pad : bias).data_ptr());
  uint64_t misaligned = pad ? reinterpret_cast<uint64_t>(out.data_ptr()) : 0;  // unpad_rows: 16-byte stores
  for (uint64_t v : ptr) misaligned |= v;
  if (misaligned & 15) return py::none();  // Python raises (a bias or scale with a storage offset)
  void* rebuilt = nullptr;
  void** gemm_args = kernel_params(*state, ptr, rebuilt);
  if (gemm_args == nullptr) return py::none();  // a new Sm90 pointer set: Python builds its Params

  const QuantLaunch& q = quant->second;
  uint64_t x_ptr = reinterpret_cast<uint64_t>(x.data_ptr()), aq_ptr = reinterpret_cast<uint64_t>(A_q.data_ptr()),
           s_ptr = reinterpret_cast<uint64_t>(s.data_ptr());
  int64_t lda = K;
  int32_t M32 = static_cast<int32_t>(M), K32 = static_cast<int32_t>(K), w = q.warps_per_row;
  void* quant_args[] = {&x_ptr, &lda, &aq_ptr, &s_ptr, &M32, &K32, &w};  // QuantTokenArgs' order
  CUresult err = q.launch(std::min((M + q.rows_per_block - 1) / q.rows_per_block, q.grid_cap), stream, quant_args);
  if (err != CUDA_SUCCESS) return py::make_tuple(0, static_cast<int>(err));
  err = launch(*state, gemm_args, stream);
  if (err != CUDA_SUCCESS) return py::make_tuple(1, static_cast<int>(err));
  if (pad) {
    err = launch_unpad(*padded_N.unpad, D_pad, out, stream);
    if (err != CUDA_SUCCESS) return py::make_tuple(2, static_cast<int>(err));
  }
  return py::cast(out);
}

int64_t channel_count() {
  size_t n = g_quant.size();
  for (const auto& entry : g_channel) n += entry.second.size();
  return static_cast<int64_t>(n);
}

int64_t state_count(int64_t plan_id) { return static_cast<int64_t>(g_plans.at(plan_id)->states.size()); }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("set_launch_function", &set_launch_function);
  m.def("register_plan", &register_plan);
  m.def("register_state", &register_state);
  m.def("register_params", &register_params);
  m.def("run", &run);
  m.def("mark_finite", &mark_finite);
  m.def("finite_count", &finite_count);
  m.def("register_padded", &register_padded);
  m.def("padded_count", &padded_count);
  m.def("register_unpad", &register_unpad);
  m.def("state_count", &state_count);
  m.def("register_quant_token", &register_quant_token);
  m.def("register_channel", &register_channel);
  m.def("run_channel", &run_channel);
  m.def("channel_count", &channel_count);
  bind_recipes(m);
}
