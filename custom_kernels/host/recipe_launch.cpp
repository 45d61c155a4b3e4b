// Recorded launch sequences ("recipes") of the NVRTC kernel families, replayed per call by C++.
//
// A recipe is what one eager call of a quantized layer launches for one problem (weight, device, x dtype,
// M, K, activation, bias or not): each kernel's function, launch shape and argument block, recorded by
// Python (custom_kernels/recipe.py) from the same plans its own path launches, with the addresses known
// only per call (x, the output, the bias, a workspace; TMA maps of them) left as patches. run_recipe checks
// x, allocates the output and one workspace, patches and launches: one C++ call instead of the Python
// path's checks, plan lookups, allocations and ctypes launches (QuantLinear's per-K-block W8A8 layer on an
// H200 host: 50 us of host time per call through Python, 14.6 through here; scripts/bench_llama.py --host-only).
//
// As in int8_gemm_launch.cpp, Python keeps every rule and error: run_recipe returns None for anything but
// the plain case it was registered for (then the Python path runs, raises the precise error or registers).
// Recipes are found by the identity of the weight's tensors (qweight, scale, offset); those and the tensors
// a recipe's arguments point at (the prepared weight data) are held by weak reference and checked at every
// call, so a weight or plan that is gone or changed sends the call back to Python instead of reading freed
// or stale memory.
#include "recipe_launch.h"

#include "launch_config.h"
#include "tensor_refs.h"

#include <torch/csrc/autograd/python_variable.h>

#include <cuda.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <unordered_map>
#include <vector>

namespace {

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
EncodeTiled g_encode = nullptr;  // libcuda's cuTensorMapEncodeTiled, handed over by Python

// Where a patched address comes from (custom_kernels/recipe.py: Source).
enum Source : int { kX = 0, kOut = 1, kBias = 2, kWorkspace = 3, kSources = 4 };

struct Patch {
  int64_t offset;  // byte offset of the 8-byte pointer in the argument block
  int source;
  int64_t addend;  // bytes past the source's start
};

// A CUtensorMap argument of an int8 row-major [rows, cols] matrix at a patched address, re-encoded per
// call exactly as cutlass_ops/w8a8/tma.py encodes it (128-byte swizzle, zero fill).
struct MapPatch {
  int64_t offset;
  int source;
  int64_t addend;
  uint64_t rows, cols;
  uint32_t box_rows, box_cols;
};

struct Step {
  CUfunction function;
  std::vector<uint64_t> params;  // the argument block (8-byte words: aligned for every parameter type)
  std::vector<void*> args;       // kernelParams: each parameter's address inside params
  std::vector<Patch> patches;
  std::vector<MapPatch> maps;
  CUlaunchAttribute attrs[2];
  CUlaunchConfig config;
};

struct Recipe {
  explicit Recipe(const at::Tensor& w) : weight(w.getIntrusivePtr()) {}
  WeakImpl weight;                // keeps the TensorImpl's memory (not its storage): its address stays unique
  int64_t version;                // the weight's in-place version when recorded
  std::vector<WeakImpl> keep;     // tensors the arguments point at (alive and unchanged, or back to Python)
  std::vector<int64_t> keep_versions;
  int64_t N;
  int64_t workspace_bytes;
  at::ScalarType bias_dtype;  // what the kernels read the bias as (the caller converts)
  bool maps = false;  // some step re-encodes a tensor map
  std::vector<std::unique_ptr<Step>> steps;
};

// The weight is its three tensors (qweight, scale, offset or none): a layer whose scale tensor is replaced while
// its qweight stays finds no recipe (the old scale may still be alive elsewhere, unchanged).
struct Key {
  const c10::TensorImpl *weight, *scale, *offset;
  int device, dtype, act;
  int64_t M, K;
  bool bias;
  bool operator==(const Key& o) const {
    return weight == o.weight && scale == o.scale && offset == o.offset && device == o.device && dtype == o.dtype &&
           act == o.act && M == o.M && K == o.K && bias == o.bias;
  }
};
struct KeyHash {
  size_t operator()(const Key& k) const {
    uint64_t h = reinterpret_cast<uint64_t>(k.weight) * 0x9E3779B97F4A7C15ull;
    for (int64_t v : {reinterpret_cast<int64_t>(k.scale), reinterpret_cast<int64_t>(k.offset), int64_t{k.device},
                      int64_t{k.dtype}, int64_t{k.act}, k.M, k.K, int64_t{k.bias}})
      h ^= static_cast<uint64_t>(v) + 0x7F4A7C159E3779B9ull + (h << 6) + (h >> 2);
    return h;
  }
};

// Recipes kept; past that the table starts over (those calls run through Python until registered again).
constexpr size_t kRecipesKept = 4096;

// Never destroyed: the weak references must not be released after the interpreter has finalized.
std::unordered_map<Key, std::unique_ptr<Recipe>, KeyHash>& g_recipes =
    *new std::unordered_map<Key, std::unique_ptr<Recipe>, KeyHash>();

std::unique_ptr<Step> make_step(const py::tuple& s) {
  // (function, grid[3], block[3], smem, cluster[3], pdl, params bytes, field offsets, patches, maps)
  TORCH_CHECK(s.size() == 10, "register_recipe: a step is a 10-tuple");
  auto step = std::make_unique<Step>();
  step->function = reinterpret_cast<CUfunction>(s[0].cast<int64_t>());
  const auto grid = s[1].cast<std::vector<int64_t>>(), block = s[2].cast<std::vector<int64_t>>(),
             cluster = s[4].cast<std::vector<int64_t>>();
  TORCH_CHECK(grid.size() == 3 && block.size() == 3 && cluster.size() == 3, "register_recipe: dims of 3");
  const std::string bytes = s[6].cast<py::bytes>();
  step->params.assign((bytes.size() + 7) / 8, 0);
  std::memcpy(step->params.data(), bytes.data(), bytes.size());
  auto* base = reinterpret_cast<char*>(step->params.data());
  for (int64_t offset : s[7].cast<std::vector<int64_t>>()) {
    TORCH_CHECK(offset >= 0 && offset < static_cast<int64_t>(bytes.size()), "register_recipe: field offset");
    step->args.push_back(base + offset);
  }
  for (const auto& [offset, source, addend] : s[8].cast<std::vector<std::tuple<int64_t, int64_t, int64_t>>>()) {
    TORCH_CHECK(offset >= 0 && offset + 8 <= static_cast<int64_t>(bytes.size()) && source >= 0 && source < kSources,
                "register_recipe: bad pointer patch");
    step->patches.push_back(Patch{offset, static_cast<int>(source), addend});
  }
  for (const py::handle& m : s[9].cast<py::list>()) {
    const auto t = m.cast<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>>();
    const auto [offset, source, addend, rows, cols, box_rows, box_cols] = t;
    const int64_t size = static_cast<int64_t>(bytes.size()), map_bytes = static_cast<int64_t>(sizeof(CUtensorMap));
    TORCH_CHECK(offset >= 0 && offset + map_bytes <= size && source >= 0 && source < kSources && rows > 0 &&
                    cols > 0 && box_rows > 0 && box_cols > 0,
                "register_recipe: bad tensor map patch");
    step->maps.push_back(MapPatch{offset, static_cast<int>(source), addend, static_cast<uint64_t>(rows),
                                  static_cast<uint64_t>(cols), static_cast<uint32_t>(box_rows),
                                  static_cast<uint32_t>(box_cols)});
  }
  fill_launch_config(step->config, step->attrs, grid, block, s[3].cast<int64_t>(), cluster, s[5].cast<bool>());
  return step;
}

// Whether a recipe may still run: its weight and every tensor its arguments point at alive and unchanged.
bool valid(const Recipe& r) {
  if (!unchanged(r.weight, r.version)) return false;
  for (size_t i = 0; i < r.keep.size(); ++i)
    if (!unchanged(r.keep[i], r.keep_versions[i])) return false;
  return true;
}

// The TensorImpl of an optional tensor argument (None: nullptr); false when it is neither.
bool impl_of(py::handle obj, const c10::TensorImpl*& impl) {
  impl = nullptr;
  if (obj.is_none()) return true;
  if (!THPVariable_Check(obj.ptr())) return false;
  impl = THPVariable_Unpack(obj.ptr()).unsafeGetTensorImpl();
  return true;
}

Key key_of(const at::Tensor& weight, const at::Tensor& scale, const c10::TensorImpl* offset, int64_t device,
           int64_t dtype, int64_t M, int64_t K, int64_t act, bool bias) {
  return Key{weight.unsafeGetTensorImpl(), scale.unsafeGetTensorImpl(), offset, static_cast<int>(device),
             static_cast<int>(dtype), static_cast<int>(act), M, K, bias};
}

}  // namespace

void set_tensor_map_function(int64_t address) { g_encode = reinterpret_cast<EncodeTiled>(address); }

// Record the launches of one problem (cutlass_ops/recipes.py: register). `keep`: the tensors the argument
// blocks point at, checked alive and unchanged at every call. No steps: the problem is known to have no recipe
// (its calls stay on the Python path without asking to record it again).
void register_recipe(const at::Tensor& weight, const at::Tensor& scale, py::handle offset_obj, int64_t device,
                     const at::Tensor& x_example, int64_t M, int64_t K, int64_t act, bool bias, int64_t N,
                     int64_t workspace_bytes, const at::Tensor& bias_example, const std::vector<at::Tensor>& keep,
                     const std::vector<py::tuple>& steps) {
  TORCH_CHECK(M > 0 && K > 0 && N > 0 && workspace_bytes >= 0, "register_recipe: bad problem");
  const c10::TensorImpl* offset;
  TORCH_CHECK(impl_of(offset_obj, offset), "register_recipe: offset must be a tensor or None");
  // the weight's own tensors are checked alive and unchanged like the prepared data (they key the recipe)
  std::vector<at::Tensor> checked = {scale};
  if (offset != nullptr) checked.push_back(THPVariable_Unpack(offset_obj.ptr()));
  checked.insert(checked.end(), keep.begin(), keep.end());
  auto recipe = std::make_unique<Recipe>(weight);
  recipe->version = version_of(weight);
  for (const at::Tensor& t : checked) {
    recipe->keep.emplace_back(t.getIntrusivePtr());
    recipe->keep_versions.push_back(version_of(t));
  }
  recipe->N = N;
  recipe->workspace_bytes = workspace_bytes;
  recipe->bias_dtype = bias_example.scalar_type();
  for (const py::tuple& s : steps) {
    recipe->steps.push_back(make_step(s));
    recipe->maps |= !recipe->steps.back()->maps.empty();
  }
  if (g_recipes.size() >= kRecipesKept) g_recipes.clear();
  // drop the recipes of weights that are gone (their weak references hold only TensorImpl memory)
  for (auto it = g_recipes.begin(); it != g_recipes.end();)
    it = it->second->weight.expired() ? g_recipes.erase(it) : std::next(it);
  g_recipes[key_of(weight, scale, offset, device, static_cast<int64_t>(x_example.scalar_type()), M, K, act, bias)] =
      std::move(recipe);
}

bool has_recipe(const at::Tensor& weight, const at::Tensor& scale, py::handle offset_obj, int64_t device,
                const at::Tensor& x_example, int64_t M, int64_t K, int64_t act, bool bias) {
  const c10::TensorImpl* offset;
  if (!impl_of(offset_obj, offset)) return false;
  auto found = g_recipes.find(
      key_of(weight, scale, offset, device, static_cast<int64_t>(x_example.scalar_type()), M, K, act, bias));
  return found != g_recipes.end() && valid(*found->second);
}

int64_t recipe_count() { return static_cast<int64_t>(g_recipes.size()); }

// The registered recipe's output [..., N] in x's dtype for this call, or None (the Python path): x CUDA on
// `device` (the current one), contiguous, 16-byte aligned, not asking for a gradient; bias None or a
// contiguous [N] tensor of the recipe's bias dtype (the caller's copy). A failed launch: (step index, CUresult).
py::object run_recipe(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scale, py::handle offset_obj,
                      py::handle bias_obj, int64_t act, int64_t device, int64_t stream) {
  if (g_launch == nullptr || x.get_device() != device || x.dim() < 1 || !x.is_contiguous() || !no_grad_wanted(x) ||
      reinterpret_cast<uint64_t>(x.data_ptr()) % 16)
    return py::none();
  const int64_t K = x.size(-1);
  if (K == 0) return py::none();
  const int64_t M = x.numel() / K;
  at::Tensor bias;
  if (!bias_obj.is_none()) {
    if (!THPVariable_Check(bias_obj.ptr())) return py::none();
    bias = THPVariable_Unpack(bias_obj.ptr());
  }
  const c10::TensorImpl* offset;
  if (!impl_of(offset_obj, offset) || !no_grad_wanted(scale) ||
      (offset != nullptr && !no_grad_wanted(THPVariable_Unpack(offset_obj.ptr()))))
    return py::none();  // a gradient of the weight is asked for: Python's autograd op raises
  auto found = g_recipes.find(
      key_of(weight, scale, offset, device, static_cast<int64_t>(x.scalar_type()), M, K, act, bias.defined()));
  if (found == g_recipes.end()) return py::none();
  const Recipe& r = *found->second;
  if (r.steps.empty() || !valid(r)) return py::none();
  if (bias.defined() && (bias.scalar_type() != r.bias_dtype || !bias.is_contiguous() || bias.numel() != r.N ||
                         bias.get_device() != device || !no_grad_wanted(bias) ||
                         reinterpret_cast<uint64_t>(bias.data_ptr()) % 16))
    return py::none();
  if (r.maps && g_encode == nullptr) return py::none();

  std::vector<int64_t> out_sizes(x.sizes().begin(), x.sizes().end());
  out_sizes.back() = r.N;
  at::Tensor out = at::empty(out_sizes, x.options());
  at::Tensor workspace;
  if (r.workspace_bytes) workspace = at::empty({r.workspace_bytes}, x.options().dtype(at::kByte));
  const uint64_t sources[kSources] = {
      reinterpret_cast<uint64_t>(x.data_ptr()), reinterpret_cast<uint64_t>(out.data_ptr()),
      bias.defined() ? reinterpret_cast<uint64_t>(bias.data_ptr()) : 0,
      workspace.defined() ? reinterpret_cast<uint64_t>(workspace.data_ptr()) : 0};
  for (size_t i = 0; i < r.steps.size(); ++i) {
    Step& s = *r.steps[i];
    auto* base = reinterpret_cast<char*>(s.params.data());
    for (const Patch& p : s.patches) {
      const uint64_t address = sources[p.source] ? sources[p.source] + p.addend : 0;
      std::memcpy(base + p.offset, &address, sizeof(address));
    }
    for (const MapPatch& m : s.maps) {
      // encoded into aligned storage (CUtensorMap is 64-byte aligned), then copied into the argument block
      CUtensorMap map;
      const cuuint64_t dims[2] = {m.cols, m.rows}, strides[1] = {m.cols};  // innermost first
      const cuuint32_t box[2] = {m.box_cols, m.box_rows}, element_strides[2] = {1, 1};
      void* address = reinterpret_cast<void*>(sources[m.source] + m.addend);
      CUresult err = g_encode(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, address, dims, strides, box, element_strides,
                              CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                              CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
      if (err != CUDA_SUCCESS) return py::make_tuple(static_cast<int>(i), static_cast<int>(err));
      std::memcpy(base + m.offset, &map, sizeof(map));
    }
    s.config.hStream = reinterpret_cast<CUstream>(stream);
    CUresult err = g_launch(&s.config, s.function, s.args.data(), nullptr);
    if (err != CUDA_SUCCESS) return py::make_tuple(static_cast<int>(i), static_cast<int>(err));
  }
  return py::cast(out);
}

void bind_recipes(py::module& m) {
  m.def("set_tensor_map_function", &set_tensor_map_function);
  m.def("register_recipe", &register_recipe);
  m.def("has_recipe", &has_recipe);
  m.def("recipe_count", &recipe_count);
  m.def("run_recipe", &run_recipe);
}
