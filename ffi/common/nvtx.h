// NVTX ranges in our own domain ("jax_gpuext"), so nsys shows which of our handlers ran.
// nvtx3 is header-only and costs a branch when no tool is attached.
#pragma once

#include <nvtx3/nvToolsExt.h>

namespace gpuext {

inline nvtxDomainHandle_t NvtxDomain() {
  static nvtxDomainHandle_t domain = nvtxDomainCreateA("jax_gpuext");
  return domain;
}

class NvtxRange {
 public:
  explicit NvtxRange(const char* name) {
    nvtxEventAttributes_t attr = {};
    attr.version = NVTX_VERSION;
    attr.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    attr.messageType = NVTX_MESSAGE_TYPE_ASCII;
    attr.message.ascii = name;
    nvtxDomainRangePushEx(NvtxDomain(), &attr);
  }
  ~NvtxRange() { nvtxDomainRangePop(NvtxDomain()); }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

}  // namespace gpuext
