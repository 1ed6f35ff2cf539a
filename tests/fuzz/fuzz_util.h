// Shared pieces of the libFuzzer targets (built by tests/fuzz/run.sh with clang,
// ASan and UBSan; not part of the CMake build).
//
//  - ByteReader: takes the harness's own control fields from the front of the input.
//  - GuardedFloats: an output buffer whose last element sits right before an
//    inaccessible page, so a decoder writing past `n` faults even for n too large for
//    the ASan heap (sparse payloads with u64 indices describe n >= 2^32).
//  - check(): an invariant that must hold; prints and traps so libFuzzer saves the input.
//  - Seeds: run a target with GRADCOMM_FUZZ_WRITE_SEEDS=<dir> and it writes its seed
//    inputs there (through write_seeds, which each target defines) and exits.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace gradcomm::fuzz {

#define GRADCOMM_FUZZ_CHECK(cond, ...)                                                         \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      std::fprintf(stderr, "fuzz invariant failed at %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                                       \
      std::fprintf(stderr, "\n");                                                              \
      __builtin_trap();                                                                        \
    }                                                                                          \
  } while (0)

class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  // Little-endian integer from the next sizeof(T) bytes; missing bytes read as zero.
  template <class T>
  T take() {
    T value{};
    uint8_t raw[sizeof(T)] = {};
    const size_t n = std::min(sizeof(T), size_ - offset_);
    std::memcpy(raw, data_ + offset_, n);
    offset_ += n;
    std::memcpy(&value, raw, sizeof value);
    return value;
  }
  const uint8_t* rest() const { return data_ + offset_; }
  size_t remaining() const { return size_ - offset_; }
  bool empty() const { return offset_ == size_; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t offset_ = 0;
};

// n floats, zero-filled, ending exactly at a PROT_NONE page. Reserved with
// MAP_NORESERVE, so only the pages a decoder touches cost memory.
class GuardedFloats {
 public:
  explicit GuardedFloats(uint64_t n) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t data_bytes = (n * sizeof(float) + page - 1) / page * page;
    map_bytes_ = data_bytes + page;
    void* p = mmap(nullptr, map_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      std::fprintf(stderr, "GuardedFloats: mmap of %zu bytes failed\n", map_bytes_);
      std::abort();
    }
    base_ = static_cast<uint8_t*>(p);
    if (mprotect(base_ + data_bytes, page, PROT_NONE) != 0) std::abort();
    data_ = reinterpret_cast<float*>(base_ + data_bytes - n * sizeof(float));
  }
  ~GuardedFloats() { munmap(base_, map_bytes_); }
  GuardedFloats(const GuardedFloats&) = delete;
  GuardedFloats& operator=(const GuardedFloats&) = delete;
  float* data() { return data_; }

 private:
  uint8_t* base_ = nullptr;
  size_t map_bytes_ = 0;
  float* data_ = nullptr;
};

// Bitwise equal, or both NaN, or both zero (0 + -0 is +0 in a scatter-add).
inline bool same_float(float a, float b) {
  if (a != a && b != b) return true;
  if (a == 0.0f && b == 0.0f) return true;
  uint32_t ua, ub;
  std::memcpy(&ua, &a, 4);
  std::memcpy(&ub, &b, 4);
  return ua == ub;
}

class SeedWriter {
 public:
  explicit SeedWriter(std::string dir) : dir_(std::move(dir)) {}
  void add(const std::string& name, const std::vector<uint8_t>& bytes) {
    std::ofstream f(dir_ + "/" + name, std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    if (!f) {
      std::fprintf(stderr, "cannot write seed %s/%s\n", dir_.c_str(), name.c_str());
      std::exit(1);
    }
  }
  void add(const std::string& name, const std::string& text) {
    add(name, std::vector<uint8_t>(text.begin(), text.end()));
  }

 private:
  std::string dir_;
};

// Appends `value` little-endian.
template <class T>
void put(std::vector<uint8_t>& out, T value) {
  uint8_t raw[sizeof value];
  std::memcpy(raw, &value, sizeof value);
  out.insert(out.end(), raw, raw + sizeof value);
}

// The framing of the checksummed-file targets (state, checkpoint): the first input
// byte holds flags, the rest is the file. Flag 1 appends the file's correct FNV-1a
// checksum, so mutations reach the fields behind it; flag 2 takes the rank and world
// size the loader expects from the file's own u32 fields at `rank_at` / `world_at`,
// so they match it.
struct ChecksummedFile {
  std::vector<uint8_t> bytes;
  int rank = 0, world = 1;
};
template <class Checksum>
ChecksummedFile checksummed_file(const uint8_t* data, size_t size, size_t rank_at, size_t world_at,
                                 Checksum checksum) {
  ChecksummedFile f;
  const uint8_t flags = data[0];
  f.bytes.assign(data + 1, data + size);
  if (flags & 1) put(f.bytes, checksum(f.bytes));
  if ((flags & 2) && f.bytes.size() >= std::max(rank_at, world_at) + 4) {
    uint32_t rank, world;
    std::memcpy(&rank, f.bytes.data() + rank_at, 4);
    std::memcpy(&world, f.bytes.data() + world_at, 4);
    f.rank = static_cast<int>(rank);
    f.world = static_cast<int>(world);
  }
  return f;
}

}  // namespace gradcomm::fuzz

// Each target defines this; it writes the target's seed corpus.
void write_seeds(gradcomm::fuzz::SeedWriter& seeds);

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* dir = std::getenv("GRADCOMM_FUZZ_WRITE_SEEDS")) {
    gradcomm::fuzz::SeedWriter seeds(dir);
    write_seeds(seeds);
    std::exit(0);
  }
  return 0;
}
