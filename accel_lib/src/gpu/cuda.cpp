#include "caracal/accel/gpu/cuda.hpp"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <thread>
#include <vector>

#include "caracal/mqueue/shm.hpp"
#include "caracal/mqueue/validate.hpp"

#if defined(CARACAL_HAVE_NVML)
#include <nvml.h>
#endif

namespace caracal::accel::gpu {

Status cuda_status(cudaError_t error, const std::string& what) {
  if (error == cudaSuccess) return Status::ok_status();
  return Status(StatusCode::kUnavailable,
                what + ": " + cudaGetErrorName(error) + ": " + cudaGetErrorString(error));
}

namespace {

// The driver API, reached through the runtime's entry-point query rather than by linking
// libcuda: an agent built with the CUDA backend still starts on a host without the NVIDIA
// driver (and serves from its CPU there).
template <class Fn>
Result<Fn> driver_function(const char* symbol, int version) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  CARACAL_RETURN_IF_ERROR(
      cuda_status(cudaGetDriverEntryPointByVersion(symbol, &fn, version, cudaEnableDefault, &found),
                  std::string("looking up ") + symbol));
  if (found != cudaDriverEntryPointSuccess || fn == nullptr) {
    return Status(StatusCode::kUnavailable,
                  std::string("the CUDA driver has no ") + symbol + " (driver too old?)");
  }
  return reinterpret_cast<Fn>(fn);
}

Status driver_status(CUresult r, const std::string& what) {
  if (r == CUDA_SUCCESS) return Status::ok_status();
  return Status(StatusCode::kUnavailable,
                what + ": CUresult " + std::to_string(static_cast<int>(r)));
}

}  // namespace

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver or no device: clear the error, report none
    return 0;
  }
  return n;
}

Status use_device(int device) {
  const int n = device_count();
  if (device < 0 || device >= n) {
    return Status(StatusCode::kUnavailable, "gpu:" + std::to_string(device) +
                                                ": no such device (this host has " +
                                                std::to_string(n) + " CUDA device(s))");
  }
  return cuda_status(cudaSetDevice(device), "gpu:" + std::to_string(device) + ": cudaSetDevice");
}

std::string DeviceInfo::str() const {
  return "gpu:" + std::to_string(index) + " (" + name + ", sm_" + std::to_string(compute_major) +
         std::to_string(compute_minor) + ", " + std::to_string(multiprocessors) + " SMs, " +
         pci_bus_id + ")";
}

Result<DeviceInfo> describe_device(int device) {
  CARACAL_RETURN_IF_ERROR(use_device(device));
  cudaDeviceProp prop{};
  CARACAL_RETURN_IF_ERROR(
      cuda_status(cudaGetDeviceProperties(&prop, device),
                  "gpu:" + std::to_string(device) + ": cudaGetDeviceProperties"));
  DeviceInfo info;
  info.index = device;
  info.name = prop.name;
  char bus[32] = {};
  if (cudaDeviceGetPCIBusId(bus, sizeof(bus), device) == cudaSuccess) info.pci_bus_id = bus;
  info.multiprocessors = prop.multiProcessorCount;
  info.compute_major = prop.major;
  info.compute_minor = prop.minor;
  info.unified_addressing = prop.unifiedAddressing != 0;
  return info;
}

// --- owned memory and streams ---------------------------------------------------------------

namespace detail {
void FreeDevice::operator()(const DeviceAllocation& a) const {
  cudaFree(a.data);
}
void FreeHost::operator()(const HostMapping& m) const {
  cudaFreeHost(m.host);
}
void UnregisterHost::operator()(const HostMapping& m) const {
  cudaHostUnregister(m.host);
}
void DestroyStream::operator()(cudaStream_t s) const {
  cudaStreamDestroy(s);
}
}  // namespace detail

Result<DeviceBuffer> DeviceBuffer::allocate(uint64_t bytes, const std::string& what) {
  void* p = nullptr;
  CARACAL_RETURN_IF_ERROR(cuda_status(
      cudaMalloc(&p, bytes), what + ": cudaMalloc of " + std::to_string(bytes) + " bytes"));
  DeviceBuffer b;
  b.owned_ = decltype(b.owned_)({static_cast<std::byte*>(p), bytes});
  CARACAL_RETURN_IF_ERROR(cuda_status(cudaMemset(p, 0, bytes), what + ": cudaMemset"));
  return b;
}

Result<MappedBuffer> MappedBuffer::allocate(uint64_t bytes, const std::string& what) {
  void* host = nullptr;
  CARACAL_RETURN_IF_ERROR(
      cuda_status(cudaHostAlloc(&host, bytes, cudaHostAllocMapped),
                  what + ": cudaHostAlloc of " + std::to_string(bytes) + " bytes"));
  MappedBuffer b;
  b.owned_ = decltype(b.owned_)({static_cast<std::byte*>(host), nullptr, bytes});  // freed on error
  std::fill(b.host(), b.host() + bytes, std::byte{0});
  void* dev = nullptr;
  CARACAL_RETURN_IF_ERROR(
      cuda_status(cudaHostGetDevicePointer(&dev, host, 0), what + ": cudaHostGetDevicePointer"));
  b.owned_.get().device = static_cast<std::byte*>(dev);
  return b;
}

Result<MappedHostRange> MappedHostRange::register_range(std::byte* host, uint64_t bytes) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  if (reinterpret_cast<uintptr_t>(host) % page != 0 || bytes % page != 0 || bytes == 0) {
    return invalid_argument("cannot register host memory with CUDA: " + std::to_string(bytes) +
                            " bytes at a range that is not page-aligned");
  }
  CARACAL_RETURN_IF_ERROR(cuda_status(
      cudaHostRegister(host, bytes, cudaHostRegisterMapped),
      "cudaHostRegister of " + std::to_string(bytes) + " bytes of shared memory (mapped)"));
  MappedHostRange r;
  r.owned_ = decltype(r.owned_)({host, nullptr, bytes});  // unregistered from here on on error
  void* dev = nullptr;
  CARACAL_RETURN_IF_ERROR(cuda_status(cudaHostGetDevicePointer(&dev, host, 0),
                                      "cudaHostGetDevicePointer of registered shared memory"));
  r.owned_.get().device = static_cast<std::byte*>(dev);
  return r;
}

Result<Stream> Stream::create(const std::string& what) {
  cudaStream_t stream = nullptr;
  CARACAL_RETURN_IF_ERROR(cuda_status(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                                      what + ": cudaStreamCreateWithFlags"));
  Stream s;
  s.owned_ = decltype(s.owned_)(stream);
  return s;
}

Status wait_stream(cudaStream_t stream, std::chrono::milliseconds timeout, const std::string& what,
                   bool* timed_out) {
  if (timed_out != nullptr) *timed_out = false;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const cudaError_t e = cudaStreamQuery(stream);
    if (e == cudaSuccess) return Status::ok_status();
    if (e != cudaErrorNotReady) return cuda_status(e, what);
    if (std::chrono::steady_clock::now() >= deadline) {
      if (timed_out != nullptr) *timed_out = true;
      return Status(StatusCode::kUnavailable,
                    what + ": still running after " + std::to_string(timeout.count()) + " ms");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

// --- device-memory regions for rdma ---------------------------------------------------------

std::string RdmaCapabilities::str() const {
  const char* ordering = writes_ordering >= CU_GPU_DIRECT_RDMA_WRITES_ORDERING_ALL_DEVICES
                             ? "all devices"
                         : writes_ordering >= CU_GPU_DIRECT_RDMA_WRITES_ORDERING_OWNER ? "owner"
                                                                                       : "none";
  return std::string("GPUDirect RDMA ") + (gpudirect_rdma ? "yes" : "no") + ", dma-buf " +
         (dma_buf ? "yes" : "no") + ", remote-write ordering " + ordering + ", flush options " +
         std::to_string(flush_options);
}

Result<RdmaCapabilities> query_rdma_capabilities(int device) {
  CARACAL_RETURN_IF_ERROR(use_device(device));
  const std::string who = "gpu:" + std::to_string(device) + ": ";
  RdmaCapabilities caps;
  int rdma = 0;
  CARACAL_RETURN_IF_ERROR(
      cuda_status(cudaDeviceGetAttribute(&rdma, cudaDevAttrGPUDirectRDMASupported, device),
                  who + "GPUDirect RDMA support"));
  CARACAL_RETURN_IF_ERROR(cuda_status(
      cudaDeviceGetAttribute(&caps.writes_ordering, cudaDevAttrGPUDirectRDMAWritesOrdering, device),
      who + "GPUDirect RDMA writes ordering"));
  CARACAL_RETURN_IF_ERROR(
      cuda_status(cudaDeviceGetAttribute(&caps.flush_options,
                                         cudaDevAttrGPUDirectRDMAFlushWritesOptions, device),
                  who + "GPUDirect RDMA flush options"));
  // dma-buf support has no runtime attribute: ask the driver.
  Result<PFN_cuDeviceGetAttribute_v2000> get_attribute =
      driver_function<PFN_cuDeviceGetAttribute_v2000>("cuDeviceGetAttribute", 2000);
  if (!get_attribute.ok()) return get_attribute.status();
  int dmabuf = 0;
  CARACAL_RETURN_IF_ERROR(
      driver_status((*get_attribute)(&dmabuf, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED,
                                     static_cast<CUdevice>(device)),
                    who + "CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED"));
  caps.gpudirect_rdma = rdma != 0;
  caps.dma_buf = dmabuf != 0;
  return caps;
}

Status check_rdma_capabilities(const RdmaCapabilities& caps, int device) {
  const std::string who = "gpu:" + std::to_string(device);
  if (!caps.gpudirect_rdma) {
    return Status(StatusCode::kUnavailable,
                  who +
                      " does not support GPUDirect RDMA, so a NIC cannot write a region in its "
                      "memory; use transport shm (a region in host memory) on this host");
  }
  if (!caps.dma_buf) {
    return Status(StatusCode::kUnavailable,
                  who +
                      " cannot export its memory as a dma-buf (CU_DEVICE_ATTRIBUTE_DMA_BUF_"
                      "SUPPORTED is 0; it needs the open kernel modules and Linux 5.12 or "
                      "later), so ibv_reg_dmabuf_mr cannot register a region there");
  }
  if (caps.writes_ordering < CU_GPU_DIRECT_RDMA_WRITES_ORDERING_OWNER) {
    return Status(StatusCode::kUnavailable,
                  who +
                      " does not order remote writes for its own kernels "
                      "(CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING is " +
                      std::to_string(caps.writes_ordering) +
                      "): a kernel could see a queue index before the message it publishes; "
                      "the rdma transport refuses such a device");
  }
  return Status::ok_status();
}

Result<DeviceRegion> DeviceRegion::create(int device, const mqueue::RegionGeometry& geometry,
                                          uint64_t epoch) {
  CARACAL_RETURN_IF_ERROR(mqueue::validate_geometry(geometry));
  CARACAL_RETURN_IF_ERROR(use_device(device));
  DeviceRegion r;
  r.device_ = device;
  r.header_ = mqueue::compute_layout(geometry, epoch);
  constexpr uint64_t kLargePage = 2ull << 20;
  const uint64_t bytes = mqueue::round_up(r.header_.region_bytes, kLargePage);
  Result<DeviceBuffer> memory = DeviceBuffer::allocate(bytes, "device-memory region");
  if (!memory.ok()) return memory.status();
  r.memory_ = std::move(memory).value();
  // The header page and the control area are all the initialisation there is (the rings start
  // zeroed); write them from a host image.
  const uint64_t init_bytes = r.header_.rings_offset;
  std::vector<std::byte> image(init_bytes, std::byte{0});
  mqueue::initialize_region(image.data(), r.header_);  // writes below rings_offset only
  CARACAL_RETURN_IF_ERROR(
      cuda_status(cudaMemcpy(r.memory_.data(), image.data(), init_bytes, cudaMemcpyHostToDevice),
                  "device-memory region: writing the header"));
  return r;
}

Result<int> DeviceRegion::export_dma_buf() const {
  Result<PFN_cuMemGetHandleForAddressRange_v11070> get_handle =
      driver_function<PFN_cuMemGetHandleForAddressRange_v11070>("cuMemGetHandleForAddressRange",
                                                                11070);
  if (!get_handle.ok()) return get_handle.status();
  int fd = -1;
  CARACAL_RETURN_IF_ERROR(
      driver_status((*get_handle)(&fd, reinterpret_cast<CUdeviceptr>(memory_.data()),
                                  memory_.size(), CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0),
                    "gpu:" + std::to_string(device_) + ": exporting the region as a dma-buf"));
  return fd;
}

// --- other processes on the GPU -------------------------------------------------------------

#if defined(CARACAL_HAVE_NVML)
namespace {

// NVML, opened at run time: the driver installs libnvidia-ml.so.1 next to libcuda, and an agent
// on a host without them must still start.
class Nvml {
 public:
  Nvml() {
    lib_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib_ == nullptr) {
      error_ = std::string("cannot load NVML (libnvidia-ml.so.1): ") + dlerror();
      return;
    }
    if (!bind(init_, "nvmlInit_v2") || !bind(shutdown_, "nvmlShutdown") ||
        !bind(error_string_, "nvmlErrorString") ||
        !bind(by_bus_id_, "nvmlDeviceGetHandleByPciBusId_v2") ||
        !bind(processes_, "nvmlDeviceGetComputeRunningProcesses_v3")) {
      return;
    }
    if (nvmlReturn_t r = init_(); r != NVML_SUCCESS) {
      error_ = std::string("NVML: ") + error_string_(r);
      return;
    }
    ready_ = true;
  }
  ~Nvml() {
    if (ready_) shutdown_();
    if (lib_ != nullptr) dlclose(lib_);
  }
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  bool ready() const { return ready_; }
  const std::string& error() const { return error_; }
  const char* text(nvmlReturn_t r) const { return error_string_(r); }
  nvmlReturn_t by_bus_id(const char* bus, nvmlDevice_t* d) const { return by_bus_id_(bus, d); }
  nvmlReturn_t processes(nvmlDevice_t d, unsigned* n, nvmlProcessInfo_t* out) const {
    return processes_(d, n, out);
  }

 private:
  template <class Fn>
  bool bind(Fn*& fn, const char* symbol) {
    fn = reinterpret_cast<Fn*>(dlsym(lib_, symbol));
    if (fn == nullptr) error_ = std::string("NVML has no ") + symbol + " (driver too old?)";
    return fn != nullptr;
  }

  void* lib_ = nullptr;
  bool ready_ = false;
  std::string error_;
  decltype(nvmlInit_v2)* init_ = nullptr;
  decltype(nvmlShutdown)* shutdown_ = nullptr;
  decltype(nvmlErrorString)* error_string_ = nullptr;
  decltype(nvmlDeviceGetHandleByPciBusId_v2)* by_bus_id_ = nullptr;
  decltype(nvmlDeviceGetComputeRunningProcesses_v3)* processes_ = nullptr;
};

}  // namespace
#endif

Result<std::vector<GpuProcess>> other_gpu_processes(int device) {
#if defined(CARACAL_HAVE_NVML)
  Result<DeviceInfo> info = describe_device(device);
  if (!info.ok()) return info.status();
  const Nvml nvml;
  if (!nvml.ready()) return Status(StatusCode::kUnavailable, nvml.error());
  nvmlDevice_t handle{};
  if (nvmlReturn_t r = nvml.by_bus_id(info->pci_bus_id.c_str(), &handle); r != NVML_SUCCESS) {
    return Status(StatusCode::kUnavailable,
                  "NVML: no device at " + info->pci_bus_id + ": " + nvml.text(r));
  }
  std::vector<nvmlProcessInfo_t> procs(64);
  unsigned count = static_cast<unsigned>(procs.size());
  nvmlReturn_t r = nvml.processes(handle, &count, procs.data());
  if (r == NVML_ERROR_INSUFFICIENT_SIZE) {
    procs.resize(count + 16);
    count = static_cast<unsigned>(procs.size());
    r = nvml.processes(handle, &count, procs.data());
  }
  if (r != NVML_SUCCESS) {
    return Status(StatusCode::kUnavailable,
                  std::string("NVML: listing compute processes: ") + nvml.text(r));
  }
  std::vector<GpuProcess> others;
  const unsigned self = static_cast<unsigned>(getpid());
  for (unsigned i = 0; i < count; ++i) {
    if (procs[i].pid == self) continue;
    GpuProcess p;
    p.pid = procs[i].pid;
    p.used_memory =
        procs[i].usedGpuMemory == static_cast<unsigned long long>(NVML_VALUE_NOT_AVAILABLE)
            ? 0
            : procs[i].usedGpuMemory;
    std::ifstream comm("/proc/" + std::to_string(p.pid) + "/comm");
    if (!std::getline(comm, p.name)) p.name = "?";
    others.push_back(std::move(p));
  }
  return others;
#else
  (void)device;
  return Status(StatusCode::kUnavailable,
                "this build has no NVML support (nvml.h was not found), so it cannot list the "
                "processes on the GPU");
#endif
}

}  // namespace caracal::accel::gpu
