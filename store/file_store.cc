// File store: one file per key in a directory every rank can see.
//
//  - File names. A key becomes "k_" + its percent-encoding (bytes other than
//    [A-Za-z0-9_-] as %XX), so any key, "../x" and "" included, names exactly one
//    file inside the directory. When that name would pass kMaxEncodedName (file
//    systems cap names at 255 bytes) it is "h_" + SHA-256(key) in hex instead.
//    Temporary files start with ".tmp.", lock files with "l".
//  - set() writes a temporary file in the same directory, fsyncs it, renames it
//    over the key's file and fsyncs the directory. rename() is atomic, so a reader
//    sees the old value, the new one, or no file; never a partial value.
//  - get() polls with backoff (1 ms doubling to 50 ms, store/poll.h) until the file exists.
//  - add() holds flock(LOCK_EX) on the key's lock file ("l" + file name) while it
//    reads the counter and writes the new value the same way set() does. flock is
//    advisory: the lock only orders add()s, which is all it must do.
//  - erase_prefix() lists the directory and unlinks the "k_" files whose name
//    decodes to a key with that prefix (and their lock files). A key stored under
//    its hash cannot be matched and stays.
// The directory is not otherwise cleaned: a fresh directory per job keeps an
// earlier job's keys from being read as this job's.
#include <fcntl.h>
#include <openssl/sha.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <filesystem>
#include <optional>
#include <random>
#include <thread>

#include "env.h"
#include "gradcomm/errors.h"
#include "store/poll.h"
#include "store/socket_util.h"
#include "store/store_backends.h"

namespace gradcomm::detail {

namespace {

constexpr size_t kMaxEncodedName = 200;

// "k_" + percent-encoding, or "h_" + SHA-256 hex when that would be too long.
// The prefixes keep the two kinds (and the lock and temporary files) apart.
std::string key_file_name(const std::string& key) {
  std::string name = "k_";
  for (unsigned char ch : key) {
    if (std::isalnum(ch) || ch == '_' || ch == '-') {
      name += static_cast<char>(ch);
    } else {
      name += fmt::format("%{:02X}", ch);
    }
    if (name.size() > kMaxEncodedName) break;
  }
  if (name.size() <= kMaxEncodedName) return name;
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(key.data()), key.size(), digest);
  name = "h_";
  for (unsigned char byte : digest) name += fmt::format("{:02x}", byte);
  return name;
}

// The key a "k_" file name encodes; nullopt for any other name (hashed keys,
// lock and temporary files, strangers).
std::optional<std::string> key_of_file_name(const std::string& name) {
  if (!name.starts_with("k_")) return std::nullopt;
  std::string key;
  for (size_t i = 2; i < name.size(); ++i) {
    if (name[i] != '%') {
      key += name[i];
      continue;
    }
    unsigned value = 0;
    const char* hex = name.data() + i + 1;
    if (i + 2 >= name.size() || std::from_chars(hex, hex + 2, value, 16).ptr != hex + 2) return std::nullopt;
    key += static_cast<char>(value);
    i += 2;
  }
  return key;
}

class FileStore final : public Store {
 public:
  FileStore(std::filesystem::path dir, std::chrono::milliseconds timeout)
      : dir_(std::move(dir)), timeout_(clamp_store_wait(timeout)), address_("file://" + dir_.string()) {
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    if (ec || !std::filesystem::is_directory(dir_)) {
      throw InvalidArgument(fmt::format("store {}: cannot create or use directory '{}': {}", address_, dir_.string(),
                                        ec ? ec.message() : "not a directory"));
    }
  }

  void set(const std::string& key, std::span<const uint8_t> value) override {
    write_atomically(value_path(key), value, key);
  }

  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) override {
    timeout = clamp_store_wait(timeout);
    const auto path = value_path(key);
    std::optional<std::vector<uint8_t>> value;
    if (!poll_until_ready([&] { return (value = read_if_present(path, key)).has_value(); }, timeout)) {
      throw TimeoutError(fmt::format("store {}: get('{}') timed out after {} ms: no rank set the key (no file {})",
                                     address_, key, timeout.count(), path.string()));
    }
    return std::move(*value);
  }

  int64_t add(const std::string& key, int64_t delta) override {
    const auto lock_path = dir_ / ("l" + key_file_name(key));
    UniqueFd lock(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
    if (!lock.valid()) fail("open", lock_path, key);
    acquire(lock.get(), lock_path, key);
    // Unlocked when `lock` closes, after the new value is in place.
    int64_t current = 0;
    if (auto value = read_if_present(value_path(key), key)) {
      const char* first = reinterpret_cast<const char*>(value->data());
      const char* last = first + value->size();
      auto [end, ec] = std::from_chars(first, last, current);
      if (value->empty() || ec != std::errc() || end != last) {
        throw InvalidArgument(fmt::format("store {}: add('{}'): the key holds {} bytes that are not a decimal integer",
                                          address_, key, value->size()));
      }
    }
    int64_t updated = 0;
    if (__builtin_add_overflow(current, delta, &updated)) {
      throw InvalidArgument(fmt::format("store {}: add('{}'): {} + {} overflows int64", address_, key, current, delta));
    }
    std::string text = std::to_string(updated);
    write_atomically(value_path(key), {reinterpret_cast<const uint8_t*>(text.data()), text.size()}, key);
    return updated;
  }

  std::string address() const override { return address_; }

  size_t erase_prefix(const std::string& prefix) override {
    std::vector<std::string> names;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(dir_, ec)) {
      std::string name = entry.path().filename().string();
      if (auto key = key_of_file_name(name); key && key->starts_with(prefix)) names.push_back(std::move(name));
    }
    if (ec) {
      throw TransportError(fmt::format("store {}: erase_prefix('{}'): listing '{}': {}", address_, prefix,
                                       dir_.string(), ec.message()));
    }
    size_t erased = 0;
    for (const std::string& name : names) {
      if (::unlink((dir_ / name).c_str()) == 0) ++erased;  // ENOENT: another rank erased it first
      ::unlink((dir_ / ("l" + name)).c_str());              // its add() lock, if it had one
    }
    return erased;
  }

 private:
  std::filesystem::path value_path(const std::string& key) const { return dir_ / key_file_name(key); }

  [[noreturn]] void fail(std::string_view what, const std::filesystem::path& path, const std::string& key) const {
    throw TransportError(
        fmt::format("store {}: key '{}': {} '{}': {}", address_, key, what, path.string(), errno_text(errno)));
  }

  // flock with LOCK_NB and backoff: the kernel releases a dead holder's lock, but a
  // live, stuck holder must give a TimeoutError rather than a hang.
  void acquire(int fd, const std::filesystem::path& path, const std::string& key) const {
    const auto locked = [&] {
      if (::flock(fd, LOCK_EX | LOCK_NB) == 0) return true;
      if (errno != EWOULDBLOCK && errno != EINTR) fail("flock", path, key);
      return false;
    };
    if (!poll_until_ready(locked, timeout_)) {
      throw TimeoutError(fmt::format("store {}: add('{}'): lock '{}' still held by another process after {} ms",
                                     address_, key, path.string(), timeout_.count()));
    }
  }

  std::optional<std::vector<uint8_t>> read_if_present(const std::filesystem::path& path,
                                                      const std::string& key) const {
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) {
      if (errno == ENOENT) return std::nullopt;
      fail("open", path, key);
    }
    std::vector<uint8_t> value;
    uint8_t buffer[64 * 1024];
    for (;;) {
      ssize_t n = ::read(fd.get(), buffer, sizeof(buffer));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) fail("read", path, key);
      if (n == 0) return value;
      value.insert(value.end(), buffer, buffer + n);
    }
  }

  void write_atomically(const std::filesystem::path& path, std::span<const uint8_t> value,
                        const std::string& key) const {
    static std::atomic<uint64_t> counter{0};
    thread_local std::mt19937_64 random{std::random_device{}()};
    const auto temp = dir_ / fmt::format(".tmp.{}.{}.{:016x}", ::getpid(), counter.fetch_add(1), random());
    UniqueFd fd(::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
    if (!fd.valid()) fail("create", temp, key);
    size_t done = 0;
    while (done < value.size()) {
      ssize_t n = ::write(fd.get(), value.data() + done, value.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        int saved = errno;
        ::unlink(temp.c_str());
        errno = saved;
        fail("write", temp, key);
      }
      done += static_cast<size_t>(n);
    }
    if (::fsync(fd.get()) != 0) {
      int saved = errno;
      ::unlink(temp.c_str());
      errno = saved;
      fail("fsync", temp, key);
    }
    fd.reset();
    if (::rename(temp.c_str(), path.c_str()) != 0) {
      int saved = errno;
      ::unlink(temp.c_str());
      errno = saved;
      fail("rename to", path, key);
    }
    // Make the rename itself durable; a failure here does not undo the visible write.
    UniqueFd dir(::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (dir.valid()) ::fsync(dir.get());
  }

  std::filesystem::path dir_;
  std::chrono::milliseconds timeout_;
  std::string address_;
};

}  // namespace

std::unique_ptr<Store> open_file_store(const std::string& dir, std::chrono::milliseconds timeout) {
  return std::make_unique<FileStore>(dir, timeout);
}

}  // namespace gradcomm::detail
