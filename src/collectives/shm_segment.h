// A POSIX shared-memory segment mapped into this process (shm_open + mmap): the memory the
// ranks of one node reduce in (node_collectives.h, issue 46). The creator makes the name with
// O_EXCL, so a stale segment or another job's is never taken over; every rank maps it, and
// the name is unlinked as soon as every rank has mapped it, so the segment dies with the
// last mapping whatever happens to the processes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace gradcomm::detail {

class ShmSegment {
 public:
  // A new segment of `bytes` (zero-filled) under `name` ("/..."); TransportError naming it
  // when the name exists or the memory cannot be had.
  static ShmSegment create(const std::string& name, size_t bytes);
  // Maps the existing segment `name`, which must hold exactly `bytes` (TransportError
  // otherwise: a segment of another size is someone else's).
  static ShmSegment open(const std::string& name, size_t bytes);

  ShmSegment() = default;
  ~ShmSegment();
  ShmSegment(ShmSegment&& other) noexcept;
  ShmSegment& operator=(ShmSegment&& other) noexcept;
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  // Removes the name (the mappings stay); idempotent. Returns false when it was gone.
  bool unlink();

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }

 private:
  ShmSegment(std::string name, uint8_t* data, size_t size) : name_(std::move(name)), data_(data), size_(size) {}
  void release();

  std::string name_;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  bool unlinked_ = false;
};

}  // namespace gradcomm::detail
