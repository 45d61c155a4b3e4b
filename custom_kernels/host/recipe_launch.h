// Recorded launch sequences of the NVRTC kernel families, replayed per call (recipe_launch.cpp).
#pragma once

#include <torch/extension.h>

// Adds set_tensor_map_function, register_recipe, has_recipe, recipe_count and run_recipe to the module.
void bind_recipes(pybind11::module& m);
