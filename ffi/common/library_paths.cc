#include "ffi/common/library_paths.h"

#include <map>
#include <mutex>

namespace gpuext {
namespace {

std::mutex g_mu;

std::map<std::string, std::string, std::less<>>& Paths() {
  static auto* paths = new std::map<std::string, std::string, std::less<>>();  // never destroyed
  return *paths;
}

}  // namespace

void SetLibraryPath(const std::string& name, const std::string& path) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (path.empty()) {
    Paths().erase(name);
  } else {
    Paths()[name] = path;
  }
}

std::string LibraryPath(std::string_view name) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = Paths().find(name);
  return it == Paths().end() ? std::string() : it->second;
}

}  // namespace gpuext
