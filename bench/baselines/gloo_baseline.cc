#include "baselines/gloo_baseline.h"

#include <unistd.h>

#include <gloo/algorithm.h>
#include <gloo/allgather_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/common/error.h>
#include <gloo/config.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <fmt/format.h>

#include <climits>

#include "env.h"
#include "gradcomm/errors.h"

namespace gradcomm::bench {

namespace {

constexpr const char* kKeyPrefix = "bench/gloo/";

// Gloo's rendezvous interface over a gradcomm store. Gloo calls wait() before
// get(), and get() only for keys that exist, so both map onto the store's
// blocking get; the deadline is the job's timeout.
class GlooStoreAdapter : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(detail::Store& store, std::chrono::milliseconds timeout) : store_(store), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    store_.set(kKeyPrefix + key, std::span(reinterpret_cast<const uint8_t*>(data.data()), data.size()));
  }
  std::vector<char> get(const std::string& key) override {
    auto bytes = store_.get(kKeyPrefix + key, timeout_);
    return std::vector<char>(bytes.begin(), bytes.end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    for (const auto& key : keys) store_.get(kKeyPrefix + key, timeout);
  }

 private:
  detail::Store& store_;
  std::chrono::milliseconds timeout_;
};

// "tcp://host:port" → "host" ("[::1]" → "::1"); empty for other schemes.
std::string store_host(const std::string& url) {
  constexpr std::string_view kScheme = "tcp://";
  if (url.rfind(kScheme, 0) != 0) return {};
  std::string rest = url.substr(kScheme.size());
  if (!rest.empty() && rest.front() == '[') return rest.substr(1, rest.find(']') - 1);
  return rest.substr(0, rest.rfind(':'));
}

bool is_loopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

std::string bind_host(const std::string& store_url) {
  // The address Gloo binds (one variable, declared here next to its use).
  if (auto host = detail::env_string("GRADCOMM_BENCH_GLOO_HOST")) return *host;
  std::string host = store_host(store_url);
  if (host.empty()) host = detail::env_string("MASTER_ADDR").value_or("127.0.0.1");
  if (is_loopback(host)) return host == "localhost" ? "127.0.0.1" : host;
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "127.0.0.1";
  return name;
}

template <class T>
std::unique_ptr<gloo::Algorithm> make_algorithm(const std::shared_ptr<gloo::Context>& context, BenchOp op, void* in,
                                                void* out, int count) {
  T* in_ptr = static_cast<T*>(in);
  if (op == BenchOp::kAllreduce) {
    return std::make_unique<gloo::AllreduceRingChunked<T>>(context, std::vector<T*>{in_ptr}, count);
  }
  return std::make_unique<gloo::AllgatherRing<T>>(context, std::vector<const T*>{in_ptr}, static_cast<T*>(out),
                                                  count);
}

}  // namespace

GlooBaseline::GlooBaseline(const BaselineSetup& setup) {
  std::string host = bind_host(setup.store_url);
  try {
    gloo::transport::tcp::attr attr(host.c_str());
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(setup.rank, setup.world_size);
    context->setTimeout(setup.timeout);
    GlooStoreAdapter store(*setup.store, setup.timeout);
    context->connectFullMesh(store, device);
    context_ = std::move(context);
  } catch (const gloo::Exception& e) {
    throw TransportError(fmt::format("--baseline gloo: connecting the TCP mesh on {} failed: {}", host, e.what()));
  }
  description_ = fmt::format("Gloo {}.{}.{} AllreduceRingChunked / AllgatherRing, TCP transport on {}",
                             GLOO_VERSION_MAJOR, GLOO_VERSION_MINOR, GLOO_VERSION_PATCH, host);
}

GlooBaseline::~GlooBaseline() = default;

void GlooBaseline::validate(BenchOp op, DType dtype) const {
  if (op == BenchOp::kReduceScatter) {
    throw Unsupported("--baseline gloo: the bench runs Gloo's allreduce and allgather; for reduce_scatter use "
                      "--baseline mpi");
  }
  switch (dtype) {
    case DType::kFloat32: case DType::kFloat64: case DType::kInt32: case DType::kInt64: case DType::kUInt8: return;
    default:
      throw Unsupported(fmt::format(
          "--baseline gloo: the bench runs Gloo on float32, float64, int32, int64 and uint8, not {}",
          dtype_name(dtype)));
  }
}

void GlooBaseline::prepare(BenchOp op, DType dtype, void* in, void* out, int64_t count) {
  validate(op, dtype);
  if (count > INT_MAX) {
    throw Unsupported(fmt::format("--baseline gloo: {} elements exceed Gloo's int count", count));
  }
  int n = static_cast<int>(count);
  algorithm_.reset();  // frees the previous size's inboxes first
  try {
    switch (dtype) {
      case DType::kFloat32: algorithm_ = make_algorithm<float>(context_, op, in, out, n); break;
      case DType::kFloat64: algorithm_ = make_algorithm<double>(context_, op, in, out, n); break;
      case DType::kInt32: algorithm_ = make_algorithm<int32_t>(context_, op, in, out, n); break;
      case DType::kInt64: algorithm_ = make_algorithm<int64_t>(context_, op, in, out, n); break;
      case DType::kUInt8: algorithm_ = make_algorithm<uint8_t>(context_, op, in, out, n); break;
      default: break;  // validate() above has thrown
    }
  } catch (const gloo::Exception& e) {
    throw TransportError(fmt::format("--baseline gloo: setting up {}: {}", bench_op_name(op), e.what()));
  }
}

void GlooBaseline::run() {
  try {
    algorithm_->run();
  } catch (const gloo::Exception& e) {
    throw TransportError(fmt::format("--baseline gloo: {}", e.what()));
  }
}

}  // namespace gradcomm::bench
