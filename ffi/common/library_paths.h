// Paths of the libraries our CUDA handlers dlopen (libcublasLt, libcudnn), set once from Python
// (jax_gpuext/_ext.py set_library_path, which takes them from jax_gpuext/_libs.py) instead of
// riding on every custom call as a string attribute: the path then stays out of the HLO and out
// of compilation-cache keys, so one compiled program serves machines with different layouts.
#pragma once

#include <string>
#include <string_view>

namespace gpuext {

// name: "cublaslt" or "cudnn". Thread-safe. An empty path clears the entry.
void SetLibraryPath(const std::string& name, const std::string& path);

// The path set for `name`, or "" when Python never set one (the loaders then return an error
// that says which library is missing).
std::string LibraryPath(std::string_view name);

}  // namespace gpuext
