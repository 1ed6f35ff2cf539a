// Checkpoint serialization and the atomic write (format in checkpoint.h).
#include "trainer/checkpoint.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>  // mkostemp
#include <cstring>
#include <filesystem>
#include <system_error>

#include "gradcomm/errors.h"
#include "checksum.h"  // base/: detail::fnv1a64, the checksum of the communicator's state too

namespace gradcomm::train {
namespace {

constexpr char kMagic[8] = {'G', 'C', 'T', 'R', 'C', 'K', 'P', 'T'};
constexpr uint32_t kVersion = 1;
constexpr uint32_t kMaxConfigBytes = 1 << 16;

class Writer {
 public:
  template <class T>
  void put(const T& value) {
    const auto* p = reinterpret_cast<const uint8_t*>(&value);
    bytes.insert(bytes.end(), p, p + sizeof value);
  }
  void put_bytes(const void* data, size_t size) {
    const auto* p = static_cast<const uint8_t*>(data);
    bytes.insert(bytes.end(), p, p + size);
  }
  std::vector<uint8_t> bytes;
};

class Reader {
 public:
  Reader(std::span<const uint8_t> bytes, const std::string& path) : bytes_(bytes), path_(path) {}
  template <class T>
  T get(const char* what) {
    T value;
    std::memcpy(&value, take(sizeof value, what), sizeof value);
    return value;
  }
  const uint8_t* take(uint64_t size, const char* what) {
    if (size > bytes_.size() - offset_) {
      fail(fmt::format("truncated reading {} ({} bytes needed, {} left)", what, size, bytes_.size() - offset_));
    }
    const uint8_t* p = bytes_.data() + offset_;
    offset_ += size;
    return p;
  }
  std::vector<float> floats(const char* what) {
    const auto count = get<uint64_t>(what);
    if (count > (bytes_.size() - offset_) / sizeof(float)) {
      fail(fmt::format("{} claims {} floats, only {} bytes left", what, count, bytes_.size() - offset_));
    }
    std::vector<float> out(count);
    const uint8_t* p = take(count * sizeof(float), what);
    // memcpy with the null data() of an empty vector is undefined, even for 0 bytes.
    if (count > 0) std::memcpy(out.data(), p, count * sizeof(float));
    return out;
  }
  [[noreturn]] void fail(const std::string& what) const {
    throw CorruptPayload(fmt::format("checkpoint {}: corrupt at byte {}: {}; refusing to resume from it (delete it "
                                     "to start over)",
                                     path_, offset_, what));
  }
  size_t remaining() const { return bytes_.size() - offset_; }

 private:
  std::span<const uint8_t> bytes_;
  const std::string& path_;
  size_t offset_ = 0;
};

[[noreturn]] void io_error(const std::string& what, const std::string& path) {
  throw InvalidArgument(fmt::format("checkpoint: {} {}: {}", what, path, std::strerror(errno)));
}

}  // namespace

std::vector<uint8_t> serialize_checkpoint(const TrainState& s, int rank, int world_size) {
  Writer w;
  w.put_bytes(kMagic, sizeof kMagic);
  w.put(kVersion);
  w.put(static_cast<uint32_t>(rank));
  w.put(static_cast<uint32_t>(world_size));
  w.put(uint32_t{0});
  w.put(static_cast<uint32_t>(s.config.size()));
  w.put_bytes(s.config.data(), s.config.size());
  w.put(s.epoch);
  w.put(s.step_in_epoch);
  w.put(s.global_step);
  w.put(s.skipped_steps);
  for (uint64_t word : s.epoch_rng) w.put(word);
  w.put(s.loss_sum);
  w.put(s.loss_batches);
  w.put(s.wire_bytes);
  w.put(s.dense_bytes);
  w.put(s.epoch_skipped);
  w.put(static_cast<uint64_t>(s.params.size()));
  w.put_bytes(s.params.data(), s.params.size() * sizeof(float));
  w.put(static_cast<uint64_t>(s.momentum.size()));
  w.put_bytes(s.momentum.data(), s.momentum.size() * sizeof(float));
  w.put(static_cast<uint64_t>(s.comm_state.size()));
  w.put_bytes(s.comm_state.data(), s.comm_state.size());
  w.put(detail::fnv1a64(w.bytes));
  return std::move(w.bytes);
}

TrainState parse_checkpoint(std::span<const uint8_t> bytes, const std::string& path, int rank, int world_size) {
  Reader r(bytes, path);
  // Checksum first: a flipped bit anywhere is reported as such, not as whatever
  // field it happened to land in.
  if (bytes.size() < sizeof kMagic + sizeof(uint64_t)) r.fail(fmt::format("only {} bytes", bytes.size()));
  if (std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0) r.fail("bad magic (not a gradcomm-train checkpoint)");
  uint64_t stored;
  std::memcpy(&stored, bytes.data() + bytes.size() - sizeof stored, sizeof stored);
  const uint64_t computed = detail::fnv1a64(bytes.first(bytes.size() - sizeof stored));
  if (stored != computed) {
    r.fail(fmt::format("checksum mismatch (stored {:016x}, computed {:016x})", stored, computed));
  }
  r.take(sizeof kMagic, "magic");
  const auto version = r.get<uint32_t>("version");
  if (version != kVersion) r.fail(fmt::format("format version {}, this build reads {}", version, kVersion));
  const auto file_rank = r.get<uint32_t>("rank");
  const auto file_world = r.get<uint32_t>("world size");
  r.get<uint32_t>("reserved");
  if (file_rank != static_cast<uint32_t>(rank) || file_world != static_cast<uint32_t>(world_size)) {
    throw InvalidArgument(fmt::format("checkpoint {}: written by rank {} of {}, but this is rank {} of {}", path,
                                      file_rank, file_world, rank, world_size));
  }
  TrainState s;
  const auto config_len = r.get<uint32_t>("config length");
  if (config_len > kMaxConfigBytes) r.fail(fmt::format("config length {} over {}", config_len, kMaxConfigBytes));
  const uint8_t* config = r.take(config_len, "config");
  s.config.assign(reinterpret_cast<const char*>(config), config_len);
  s.epoch = r.get<int64_t>("epoch");
  s.step_in_epoch = r.get<int64_t>("step_in_epoch");
  s.global_step = r.get<int64_t>("global_step");
  s.skipped_steps = r.get<int64_t>("skipped_steps");
  if (s.epoch < 0 || s.step_in_epoch < 0 || s.global_step < 0 || s.skipped_steps < 0) {
    r.fail("negative epoch or step counter");
  }
  for (uint64_t& word : s.epoch_rng) word = r.get<uint64_t>("epoch_rng");
  s.loss_sum = r.get<double>("loss_sum");
  s.loss_batches = r.get<int64_t>("loss_batches");
  s.wire_bytes = r.get<uint64_t>("wire_bytes");
  s.dense_bytes = r.get<uint64_t>("dense_bytes");
  s.epoch_skipped = r.get<int64_t>("epoch_skipped");
  s.params = r.floats("params");
  s.momentum = r.floats("momentum");
  if (s.params.size() != s.momentum.size()) {
    r.fail(fmt::format("{} parameters but {} momentum values", s.params.size(), s.momentum.size()));
  }
  const auto state_len = r.get<uint64_t>("communicator state length");
  const uint8_t* state = r.take(state_len, "communicator state");
  s.comm_state.assign(state, state + state_len);
  r.get<uint64_t>("checksum");
  if (r.remaining() != 0) r.fail(fmt::format("{} trailing bytes", r.remaining()));
  return s;
}

std::string checkpoint_path(const std::string& dir, int rank) { return fmt::format("{}/rank{}.ckpt", dir, rank); }

void write_checkpoint(const std::string& dir, int rank, std::span<const uint8_t> bytes) {
  const std::string path = checkpoint_path(dir, rank);
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) io_error("cannot create", tmp);
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(fd);
      io_error("cannot write", tmp);
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    ::close(fd);
    io_error("cannot fsync", tmp);
  }
  if (::close(fd) != 0) io_error("cannot close", tmp);
  // Keep the previous checkpoint: ranks killed at different moments may have
  // completed different steps, and resume picks the newest step all ranks hold.
  if (::rename(path.c_str(), (path + ".prev").c_str()) != 0 && errno != ENOENT) io_error("cannot rename", path);
  if (::rename(tmp.c_str(), path.c_str()) != 0) io_error("cannot rename into place", tmp);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);  // makes the renames durable; best effort (some filesystems refuse)
    ::close(dfd);
  }
}

void check_checkpoint_dir(const std::string& dir) {
  const auto fail = [&](const std::string& what, int error) {
    throw InvalidArgument(fmt::format("--checkpoint-dir {}: {}: {}", dir, what, std::strerror(error)));
  };
  std::error_code ec;
  // Ranks creating it at once: mkdir's EEXIST for a directory is no error here.
  std::filesystem::create_directories(dir, ec);
  if (ec) fail("cannot create directory", ec.value());  // ENOTDIR too, where DIR is a file
  std::string probe = dir + "/.gradcomm-train-probe-XXXXXX";
  const int fd = ::mkostemp(probe.data(), O_CLOEXEC);
  if (fd < 0) fail("cannot create a file in it", errno);
  ::close(fd);
  if (::unlink(probe.c_str()) != 0) fail("cannot remove the probe file " + probe, errno);
}

std::optional<std::vector<uint8_t>> read_file_if_exists(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return std::nullopt;
    io_error("cannot open", path);
  }
  std::vector<uint8_t> out;
  uint8_t chunk[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::close(fd);
      io_error("cannot read", path);
    }
    if (n == 0) break;
    out.insert(out.end(), chunk, chunk + n);
  }
  ::close(fd);
  return out;
}

}  // namespace gradcomm::train
