#include "collectives/shm_segment.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "gradcomm/errors.h"

namespace gradcomm::detail {
namespace {

[[noreturn]] void fail(const std::string& name, const char* what, int error) {
  throw TransportError(fmt::format("shared memory segment {}: {}: {}", name, what, std::strerror(error)));
}

uint8_t* map(int fd, const std::string& name, size_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const int error = errno;
    ::close(fd);
    fail(name, "mmap", error);
  }
  ::close(fd);  // the mapping keeps the segment
  return static_cast<uint8_t*>(p);
}

}  // namespace

ShmSegment ShmSegment::create(const std::string& name, size_t bytes) {
  if (bytes == 0) throw InvalidArgument(fmt::format("shared memory segment {}: size 0", name));
  const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) fail(name, "shm_open (create)", errno);
  // The size, then the pages reserved (posix_fallocate): a full /dev/shm is an error here
  // rather than a SIGBUS at the first touch inside a collective.
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int error = errno;
    ::close(fd);
    ::shm_unlink(name.c_str());
    fail(name, "ftruncate", error);
  }
  if (const int error = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes)); error != 0) {
    ::close(fd);
    ::shm_unlink(name.c_str());
    fail(name, fmt::format("reserving {} bytes", bytes).c_str(), error);
  }
  try {
    return ShmSegment(name, map(fd, name, bytes), bytes);
  } catch (...) {
    ::shm_unlink(name.c_str());
    throw;
  }
}

ShmSegment ShmSegment::open(const std::string& name, size_t bytes) {
  const int fd = ::shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) fail(name, "shm_open", errno);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int error = errno;
    ::close(fd);
    fail(name, "fstat", error);
  }
  if (static_cast<size_t>(st.st_size) != bytes) {
    ::close(fd);
    throw TransportError(fmt::format("shared memory segment {} holds {} bytes, expected {}: not this job's", name,
                                     static_cast<long long>(st.st_size), bytes));
  }
  ShmSegment segment(name, map(fd, name, bytes), bytes);
  segment.unlinked_ = true;  // the creator owns the name
  return segment;
}

ShmSegment::~ShmSegment() { release(); }

ShmSegment::ShmSegment(ShmSegment&& other) noexcept
    : name_(std::move(other.name_)), data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)), unlinked_(std::exchange(other.unlinked_, true)) {}

ShmSegment& ShmSegment::operator=(ShmSegment&& other) noexcept {
  if (this != &other) {
    release();
    name_ = std::move(other.name_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    unlinked_ = std::exchange(other.unlinked_, true);
  }
  return *this;
}

bool ShmSegment::unlink() {
  if (unlinked_ || name_.empty()) return false;
  unlinked_ = true;
  return ::shm_unlink(name_.c_str()) == 0;
}

void ShmSegment::release() {
  unlink();  // a creator that never got to unlink still leaves nothing behind
  if (data_ != nullptr) ::munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
}

}  // namespace gradcomm::detail
