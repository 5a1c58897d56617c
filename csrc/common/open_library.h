// dlopen of a GPU library that Python located (jax_gpuext._libs.path). Python normally hands over
// the exact file; an empty path (an executable deserialized and run without tracing, so Python
// never set one) falls back to the loader's search by soname, in the order given.
#pragma once

#include <dlfcn.h>

#include <initializer_list>
#include <string>

#include "csrc/common/status.h"

namespace gpuext {

// Opens `path`, or with an empty `path` the first of `sonames` the loader finds. RTLD_LOCAL: our
// symbol resolution must not change what other libraries bind to. `*opened` names what was opened.
inline Status OpenLibrary(const std::string& path, std::initializer_list<const char*> sonames, void** handle,
                          std::string* opened) {
  if (!path.empty()) {
    *handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (*handle == nullptr) return Status::Error("dlopen(" + path + ") failed: " + dlerror());
    *opened = path;
    return Status::Ok();
  }
  std::string tried;
  for (const char* soname : sonames) {
    *handle = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
    if (*handle != nullptr) {
      *opened = std::string(soname) + " (loader search)";
      return Status::Ok();
    }
    tried += std::string(tried.empty() ? "" : "; ") + dlerror();
  }
  return Status::Error("no library path from Python and the loader found none: " + tried);
}

}  // namespace gpuext
