// create_store(): parses the store URL and builds the matching Store. For tcp://,
// rank 0 starts the server before connecting, so its own client finds it; the
// other ranks retry until the server is up or their timeout passes.
#include "store/store.h"

#include <fmt/format.h>

#include <openssl/crypto.h>
#include <pthread.h>

#include <charconv>
#include <map>
#include <mutex>

#include "gradcomm/errors.h"
#include "store/store_backends.h"

namespace gradcomm::detail {

namespace {

constexpr std::string_view kAcceptedForms =
    "accepted forms: tcp://host:port (port 1..65535; IPv6 as tcp://[::1]:port) or file:///absolute/dir";

[[noreturn]] void bad_url(const std::string& url, std::string_view problem) {
  throw InvalidArgument(fmt::format("store URL '{}': {}; {}", url, problem, kAcceptedForms));
}

struct TcpEndpoint {
  std::string host;
  uint16_t port = 0;
};

TcpEndpoint parse_tcp(const std::string& url, std::string_view rest) {
  TcpEndpoint endpoint;
  std::string_view port_text;
  if (!rest.empty() && rest.front() == '[') {
    size_t close = rest.find(']');
    if (close == std::string_view::npos) bad_url(url, "'[' without a matching ']' around the IPv6 address");
    endpoint.host = std::string(rest.substr(1, close - 1));
    std::string_view after = rest.substr(close + 1);
    if (after.empty() || after.front() != ':') bad_url(url, "expected ':port' after the IPv6 address");
    port_text = after.substr(1);
  } else {
    size_t colon = rest.rfind(':');
    if (colon == std::string_view::npos) bad_url(url, "no port (expected host:port)");
    endpoint.host = std::string(rest.substr(0, colon));
    if (endpoint.host.find(':') != std::string::npos) {
      bad_url(url, "an IPv6 address must be written in brackets");
    }
    port_text = rest.substr(colon + 1);
  }
  if (endpoint.host.empty()) bad_url(url, "empty host");
  if (endpoint.host.find_first_of("/?#@ ") != std::string::npos) bad_url(url, "host contains '/', '?', '#', '@' or a space");
  unsigned value = 0;
  auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), value);
  if (port_text.empty() || ec != std::errc() || end != port_text.data() + port_text.size() || value < 1 ||
      value > 65535) {
    bad_url(url, fmt::format("port '{}' is not an integer in 1..65535", port_text));
  }
  endpoint.port = static_cast<uint16_t>(value);
  return endpoint;
}

// Rank 0's server outlives the communicator that started it: a later create_store()
// in this process for the same address and token uses it again, until the process
// exits. Ranks that re-create their communicator before rank 0 has torn down its old
// one publish into this server (communicator generations, store/rendezvous.h); were
// it to stop with rank 0's old communicator, what they published would go with it.
class JobServers {
 public:
  static JobServers& instance() {
    static JobServers servers;
    return servers;
  }

  std::shared_ptr<TcpStoreServer> get(const TcpEndpoint& endpoint, const StoreOptions& options) {
    if (endpoint.port == 0) {  // an ephemeral port is nobody's to find again
      return std::make_shared<TcpStoreServer>(endpoint.host, endpoint.port, options.job_token, options.limits);
    }
    std::lock_guard lock(mutex_);
    auto key = std::make_pair(endpoint.host, endpoint.port);
    auto found = servers_.find(key);
    if (found != servers_.end()) {
      if (found->second.token == options.job_token) return found->second.server;
      servers_.erase(found);  // another job's token: its server goes, and the port with it
    }
    auto server = std::make_shared<TcpStoreServer>(endpoint.host, endpoint.port, options.job_token, options.limits);
    servers_[key] = Entry{server, options.job_token};
    return server;
  }

 private:
  struct Entry {
    std::shared_ptr<TcpStoreServer> server;
    std::string token;
  };
  using Map = std::map<std::pair<std::string, uint16_t>, Entry>;

  JobServers() {
    // OpenSSL first: its exit handler (which retires the per-thread state of threads
    // still running) is then registered before ours, so it runs after our destructor
    // has stopped the servers' threads, and their state is freed, not leaked.
    OPENSSL_init_crypto(OPENSSL_INIT_LOAD_CONFIG, nullptr);  // not 0: that returns before doing anything
    // A forked child has none of the servers' threads: it must never stop (join) them.
    ::pthread_atfork([] { instance().mutex_.lock(); }, [] { instance().mutex_.unlock(); },
                     [] {
                       JobServers& self = instance();
                       new Map(std::move(self.servers_));  // NOLINT: left alone on purpose
                       self.servers_.clear();
                       self.mutex_.unlock();
                     });
  }

  std::mutex mutex_;
  Map servers_;
};

}  // namespace

std::unique_ptr<Store> create_store(const StoreOptions& options) {
  const std::string& url = options.url;
  if (options.rank < 0) {
    throw InvalidArgument(fmt::format("create_store({}): rank {} (expected >= 0)", url, options.rank));
  }
  constexpr std::string_view kTcp = "tcp://";
  constexpr std::string_view kFile = "file://";
  if (url.starts_with(kTcp)) {
    TcpEndpoint endpoint = parse_tcp(url, std::string_view(url).substr(kTcp.size()));
    std::shared_ptr<TcpStoreServer> server;
    if (options.rank == 0) server = JobServers::instance().get(endpoint, options);
    return connect_tcp_store(endpoint.host, endpoint.port, options.job_token, options.timeout, std::move(server));
  }
  if (url.starts_with(kFile)) {
    std::string path = url.substr(kFile.size());
    if (path.empty() || path.front() != '/') {
      bad_url(url, "a file store needs an absolute directory (file:///dir: three slashes)");
    }
    return open_file_store(path, options.timeout);
  }
  bad_url(url, "unknown scheme");
}

}  // namespace gradcomm::detail
