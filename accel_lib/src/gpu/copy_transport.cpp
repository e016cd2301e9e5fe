#include "caracal/accel/gpu/copy_transport.hpp"

#include <chrono>
#include <thread>

#include "caracal/accel/gpu/cuda.hpp"

namespace caracal::accel::gpu {

Result<CopyEngineTransport> CopyEngineTransport::create(std::byte* device_base, uint64_t bytes) {
  CopyEngineTransport t;
  t.device_ = device_base;
  t.bytes_ = bytes;
  void* staging = nullptr;
  CARACAL_RETURN_IF_ERROR(
      cuda_status(cudaHostAlloc(&staging, bytes, cudaHostAllocDefault),
                  "copy-engine transport: pinned staging of " + std::to_string(bytes) + " bytes"));
  t.staging_ = static_cast<std::byte*>(staging);
  void* cells = nullptr;
  CARACAL_RETURN_IF_ERROR(
      cuda_status(cudaHostAlloc(&cells, kIndexCells * sizeof(uint32_t), cudaHostAllocDefault),
                  "copy-engine transport: pinned index cells"));
  t.cells_ = static_cast<uint32_t*>(cells);
  t.cell_ticket_.assign(kIndexCells, 0);
  CARACAL_RETURN_IF_ERROR(cuda_status(cudaStreamCreateWithFlags(&t.stream_, cudaStreamNonBlocking),
                                      "copy-engine transport: stream"));
  return t;
}

CopyEngineTransport& CopyEngineTransport::operator=(CopyEngineTransport&& o) noexcept {
  if (this != &o) {
    release();
    device_ = std::exchange(o.device_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    staging_ = std::exchange(o.staging_, nullptr);
    cells_ = std::exchange(o.cells_, nullptr);
    cell_ticket_ = std::move(o.cell_ticket_);
    next_cell_ = o.next_cell_;
    stream_ = std::exchange(o.stream_, nullptr);
    in_flight_ = std::move(o.in_flight_);
    spare_events_ = std::move(o.spare_events_);
    posted_ = o.posted_;
    completed_ = o.completed_;
    error_ = std::move(o.error_);
  }
  return *this;
}

CopyEngineTransport::~CopyEngineTransport() {
  release();
}

void CopyEngineTransport::release() {
  if (stream_ != nullptr) {
    cudaStreamSynchronize(stream_);  // nothing may still read staging when it is freed
    cudaStreamDestroy(stream_);
    stream_ = nullptr;
  }
  for (auto& [ticket, event] : in_flight_)
    cudaEventDestroy(event);
  in_flight_.clear();
  for (cudaEvent_t e : spare_events_)
    cudaEventDestroy(e);
  spare_events_.clear();
  if (staging_ != nullptr) cudaFreeHost(staging_);
  if (cells_ != nullptr) cudaFreeHost(cells_);
  staging_ = nullptr;
  cells_ = nullptr;
}

uint64_t CopyEngineTransport::track(const char* what) {
  const uint64_t ticket = ++posted_;
  cudaEvent_t event = nullptr;
  if (!spare_events_.empty()) {
    event = spare_events_.back();
    spare_events_.pop_back();
  } else if (cudaError_t e = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
             e != cudaSuccess && error_.ok()) {
    error_ = cuda_status(e, std::string("copy-engine transport: event for a ") + what);
    return ticket;
  }
  if (cudaError_t e = cudaEventRecord(event, stream_); e != cudaSuccess && error_.ok()) {
    error_ = cuda_status(e, std::string("copy-engine transport: recording a ") + what);
  }
  in_flight_.emplace_back(ticket, event);
  return ticket;
}

uint64_t CopyEngineTransport::post_write(uint64_t offset, uint32_t length) {
  if (cudaError_t e = cudaMemcpyAsync(device_ + offset, staging_ + offset, length,
                                      cudaMemcpyHostToDevice, stream_);
      e != cudaSuccess && error_.ok()) {
    error_ = cuda_status(e, "copy-engine transport: write of " + std::to_string(length) +
                                " bytes at " + std::to_string(offset));
  }
  return track("write");
}

uint64_t CopyEngineTransport::post_read(uint64_t offset, uint32_t length) {
  if (cudaError_t e = cudaMemcpyAsync(staging_ + offset, device_ + offset, length,
                                      cudaMemcpyDeviceToHost, stream_);
      e != cudaSuccess && error_.ok()) {
    error_ = cuda_status(e, "copy-engine transport: read of " + std::to_string(length) +
                                " bytes at " + std::to_string(offset));
  }
  return track("read");
}

uint64_t CopyEngineTransport::publish_index(uint64_t offset, uint32_t value) {
  const uint32_t cell = next_cell_;
  next_cell_ = (next_cell_ + 1) % kIndexCells;
  // A cell is reused only once the copy that carried its previous value has completed.
  while (completed_ < cell_ticket_[cell] && error_.ok()) {
    if (!progress().ok()) break;
    std::this_thread::yield();
  }
  cells_[cell] = value;
  std::memcpy(staging_ + offset, &value, sizeof(value));  // what load_index reports
  if (cudaError_t e = cudaMemcpyAsync(device_ + offset, &cells_[cell], sizeof(uint32_t),
                                      cudaMemcpyHostToDevice, stream_);
      e != cudaSuccess && error_.ok()) {
    error_ = cuda_status(e, "copy-engine transport: index write at " + std::to_string(offset));
  }
  cell_ticket_[cell] = track("index write");
  return cell_ticket_[cell];
}

Status CopyEngineTransport::progress() {
  while (!in_flight_.empty()) {
    const cudaError_t e = cudaEventQuery(in_flight_.front().second);
    if (e == cudaErrorNotReady) break;
    if (e != cudaSuccess) {
      if (error_.ok()) error_ = cuda_status(e, "copy-engine transport: a copy failed");
      break;
    }
    completed_ = in_flight_.front().first;
    spare_events_.push_back(in_flight_.front().second);
    in_flight_.pop_front();
  }
  return error_;
}

}  // namespace caracal::accel::gpu
