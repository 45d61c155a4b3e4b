// The per-call host path of cutlass_ops.int8_gemm in C++ (a torch extension): check the epilogue
// tensors and D, allocate D, patch the operand pointers into a prepared Params and launch.
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

#include <cuda.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

using LaunchKernelEx = CUresult (*)(const CUlaunchConfig*, CUfunction, void**, void**);
LaunchKernelEx g_launch = nullptr;  // libcuda's cuLaunchKernelEx, handed over by Python

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
using WeakImpl = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;
struct Checked {
  WeakImpl ref;
  int64_t version;
};
std::unordered_map<const c10::TensorImpl*, Checked>& g_finite =
    *new std::unordered_map<const c10::TensorImpl*, Checked>();
constexpr size_t kFiniteKept = 4096;  // as finite_check.KEPT; past that the table starts over

// Inference tensors have no version counter (-1, as plan_cache.version).
int64_t version_of(const at::Tensor& t) { return t.is_inference() ? -1 : static_cast<int64_t>(t._version()); }

bool finite_checked(const at::Tensor& t) {
  auto hit = g_finite.find(t.unsafeGetTensorImpl());
  return hit != g_finite.end() && hit->second.version == version_of(t);
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
  unsigned n_attrs = 0;
  if (cluster[0] * cluster[1] * cluster[2] != 1) {
    s->attrs[n_attrs].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    s->attrs[n_attrs].value.clusterDim.x = static_cast<unsigned>(cluster[0]);
    s->attrs[n_attrs].value.clusterDim.y = static_cast<unsigned>(cluster[1]);
    s->attrs[n_attrs].value.clusterDim.z = static_cast<unsigned>(cluster[2]);
    ++n_attrs;
  }
  if (pdl) {
    s->attrs[n_attrs].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    s->attrs[n_attrs].value.programmaticStreamSerializationAllowed = 1;
    ++n_attrs;
  }
  CUlaunchConfig& c = s->config;
  c.gridDimX = static_cast<unsigned>(grid[0]);
  c.gridDimY = static_cast<unsigned>(grid[1]);
  c.gridDimZ = static_cast<unsigned>(grid[2]);
  c.blockDimX = static_cast<unsigned>(block[0]);
  c.blockDimY = static_cast<unsigned>(block[1]);
  c.blockDimZ = static_cast<unsigned>(block[2]);
  c.sharedMemBytes = static_cast<unsigned>(smem);
  c.hStream = nullptr;
  c.attrs = n_attrs ? s->attrs : nullptr;
  c.numAttrs = n_attrs;
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
py::object run(int64_t plan_id, const at::Tensor& A, const at::Tensor& B, int64_t device, py::handle out_obj,
               py::dict inputs, int64_t stream, bool need_finite) {
  Plan& p = *g_plans[plan_id];
  const int64_t M = A.size(0), K = A.size(1), N = B.size(0);
  if (M == 0 || N == 0 || K == 0 || K % 16 || N % p.align_D || g_launch == nullptr) return py::none();
  const int dev = static_cast<int>(device);
  uint64_t ptr[kMaxPointers] = {0};
  ptr[p.slot_A] = reinterpret_cast<uint64_t>(A.data_ptr());
  ptr[p.slot_B] = reinterpret_cast<uint64_t>(B.data_ptr());
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
    const uint64_t q = reinterpret_cast<uint64_t>(t.data_ptr());
    ptr[in.slot] = q;
    misaligned |= q;
    nonnull |= int64_t{1} << in.slot;
  }
  if (given != PyDict_Size(inputs.ptr())) return py::none();  // an input this epilogue does not take
  auto found = p.states.find(Key{M, N, K, nonnull, dev});
  if (found == p.states.end()) return py::none();
  at::Tensor out;
  if (out_obj.is_none()) {
    out = at::empty({M, N}, A.options().dtype(p.out_dtype));
  } else {
    if (!THPVariable_Check(out_obj.ptr())) return py::none();
    out = THPVariable_Unpack(out_obj.ptr());
    if (out.scalar_type() != p.out_dtype || out.dim() != 2 || out.size(0) != M || out.size(1) != N ||
        !out.is_contiguous() || out.get_device() != dev)
      return py::none();
    const uint64_t d = reinterpret_cast<uint64_t>(out.data_ptr());
    if (overlaps(d, out.nbytes(), ptr[p.slot_A], A.nbytes()) || overlaps(d, out.nbytes(), ptr[p.slot_B], B.nbytes()))
      return py::none();  // Python raises: the kernel would read what it writes
  }
  ptr[p.slot_D] = reinterpret_cast<uint64_t>(out.data_ptr());
  misaligned |= ptr[p.slot_D];
  if (p.c_is_d) ptr[p.slot_C] = ptr[p.slot_D];  // 2.x LinearCombination reads C only when beta != 0
  if (misaligned & 15) return py::none();
  State& s = *found->second;
  void* rebuilt_args[1];
  void** args = s.args;
  if (s.patch) {
    for (const auto& [word, slot] : s.words) s.params[word] = ptr[slot];
  } else {
    Pointers key{};
    std::memcpy(key.p, ptr, sizeof(ptr));
    auto hit = s.rebuilt.find(key);
    if (hit == s.rebuilt.end()) return py::none();  // Python builds (and registers) them
    rebuilt_args[0] = hit->second.data();
    args = rebuilt_args;
  }
  s.config.hStream = reinterpret_cast<CUstream>(stream);
  const CUresult err = g_launch(&s.config, s.function, args, nullptr);
  if (err != CUDA_SUCCESS) return py::int_(static_cast<int>(err));
  return py::cast(out);
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
  m.def("state_count", &state_count);
}
