// Communicator: the public face. Creation (launch config, store, transport,
// rendezvous) lives here; every call forwards to CommunicatorImpl.
#include <fmt/format.h>
#include <sched.h>

#include "comm_impl.h"
#include "communicator_factory.h"
#include "gradcomm/communicator.h"
#include "launch_config.h"
#include "logging.h"
#include "node_shm.h"
#include "spin.h"
#include "topology.h"
#include "store/rendezvous.h"
#include "transport/inproc/inproc_transport.h"
#include "transport/ucx/ucx_transport.h"

namespace gradcomm {

std::unique_ptr<Communicator> Communicator::create(const InitOptions& options) {
  return detail::create_communicator(options, nullptr);
}

std::unique_ptr<Communicator> detail::create_communicator(const InitOptions& options,
                                                          std::unique_ptr<detail::Store> external_store) {
  // An external store stands in for the URL: resolve_launch_config then does not
  // ask for one, and messages name the store by its address.
  InitOptions resolved_options = options;
  if (external_store && resolved_options.store.empty()) resolved_options.store = external_store->address();
  const detail::LaunchConfig config = detail::resolve_launch_config(resolved_options);
  if (config.world_size == 1) {
    auto transports = detail::create_inproc_transports(1);
    auto impl = std::make_unique<detail::CommunicatorImpl>(
        std::move(transports[0]), config.timeout, nullptr,
        detail::NodeMap::from_names({detail::this_node_name()}));
    impl->set_transport_preference(config.transport);  // how CUDA tensors travel (staging or NCCL)
    return std::make_unique<Communicator>(std::move(impl));
  }
#if !GRADCOMM_WITH_CUDA
  if (config.transport == "nccl") {
    throw Unsupported(fmt::format("rank {}: transport 'nccl' needs a gradcomm built with CUDA; use 'ucx' or 'auto'",
                                  config.rank));
  }
#endif
  detail::StoreOptions store_options;
  store_options.url = config.store;
  store_options.rank = config.rank;
  store_options.world_size = config.world_size;
  store_options.job_token = config.job_token;
  store_options.timeout = config.timeout;
  detail::UcxOptions ucx_options;
  ucx_options.timeout = config.timeout;
  ucx_options.key_prefix = "comm";  // inside the generation's namespace: gradcomm/g<G>/comm/ucx/addr/<r>
  try {
    // This communicator's generation of the job's store: its own keys, framed and
    // checked records, world-size and duplicate-rank errors, failing ranks reported
    // to the others, and the generation's keys retired (store/rendezvous.h).
    const bool hosts_store = !external_store && config.rank == 0 && config.store.starts_with("tcp://");
    auto store = std::make_unique<detail::RendezvousStore>(
        external_store ? std::move(external_store) : detail::create_store(store_options), config.rank,
        config.world_size, config.job_token, hosts_store);
    detail::RendezvousStore& rendezvous = *store;  // owned by the communicator from below
    std::unique_ptr<detail::Transport> transport;
    std::optional<detail::NodeMap> nodes;
    std::unique_ptr<detail::NodeShm> shm;
    try {
      // Which ranks share a node (topology.h): the transport keeps shared memory inside them.
      nodes = detail::exchange_node_names(rendezvous, ucx_options.key_prefix, config.rank, config.world_size,
                                          detail::this_node_name(), config.timeout);
      detail::check_launcher_local_ranks(*nodes, config.rank);
      for (int r = 0; r < config.world_size; ++r) ucx_options.same_node.push_back(nodes->same_node(config.rank, r));
      transport = detail::create_ucx_transport(config.rank, config.world_size, rendezvous, ucx_options);
      // The node's shared segment (node_shm.h): after the transport, so that a rank that
      // cannot connect fails before any segment is made.
      shm = detail::connect_node_shm(rendezvous, *nodes, config.rank, config.job_token, rendezvous.generation(),
                                     config.timeout);
    } catch (const Error& e) {
      rendezvous.report_failure(e);  // the others are waiting for this rank: tell them why it is not coming
      throw;
    }
    rendezvous.done_joining();
    const std::string name = transport->name();
    auto impl = std::make_unique<detail::CommunicatorImpl>(std::move(transport), config.timeout, std::move(store),
                                                           std::move(*nodes), std::move(shm));
    impl->set_transport_preference(config.transport);
    // Over the transport, not the store: once every rank is through, none needs
    // the store again, so rank 0 may exit at any later point without stranding a
    // rank that is still finishing its rendezvous. Every rank has then read the
    // generation's keys, and rank 0 (whose store it is) deletes them.
    impl->connect_barrier();
    rendezvous.retire();
    detail::log(detail::LogLevel::kInfo, "rank {}/{}: connected over {} via {}; topology: {}; node segment: {}",
                config.rank, config.world_size, name, config.store, impl->nodes().describe(),
                impl->node_shm() != nullptr ? fmt::format("shared by {} ranks", impl->node_shm()->members().size())
                                            : std::string("none"));
    return std::make_unique<Communicator>(std::move(impl));
  } catch (const Error& e) {
    // The store and transport do not know the rank: add it, and the phase.
    throw_error(e.code(), fmt::format("rank {} of {}: init via {}: {}", config.rank, config.world_size,
                                      config.store, e.what()));
  }
}

Communicator::Communicator(std::unique_ptr<detail::CommunicatorImpl> impl) : impl_(std::move(impl)) {}
Communicator::~Communicator() = default;

int Communicator::rank() const { return impl_->rank(); }
int Communicator::size() const { return impl_->size(); }
const Topology& Communicator::topology() const { return impl_->topology(); }

// ---- Work --------------------------------------------------------------------------

Work::Work(std::shared_ptr<detail::WorkState> state) : state_(std::move(state)) {}
Work::~Work() = default;

namespace {
// Counts the caller as waiting on the engine (Doorbell::waited_on) for its scope.
class Waiting {
 public:
  explicit Waiting(const std::shared_ptr<detail::Doorbell>& doorbell) : doorbell_(doorbell.get()) {
    if (doorbell_ != nullptr) doorbell_->enter_wait();
  }
  ~Waiting() {
    if (doorbell_ != nullptr) doorbell_->leave_wait();
  }
  Waiting(const Waiting&) = delete;
  Waiting& operator=(const Waiting&) = delete;

 private:
  detail::Doorbell* doorbell_;
};
}  // namespace

void Work::wait(Waiter waiter) {
  if (waiter == Waiter::kApplication) state_->note_wait();
  {
    // Done already (the engine finished it before the caller came to wait): nothing to ring
    // or wait for.
    std::lock_guard lock(state_->mutex);
    if (state_->done) {
      if (state_->error) std::rethrow_exception(state_->error);
      return;
    }
  }
  state_->ask_to_start();  // a fused group holding this call stops waiting for more
  const Waiting waiting(state_->doorbell);
  // Poll before sleeping on the condition variable (src/spin.h).
  for (const auto until = detail::Clock::now() + detail::spin_before_sleep(); detail::Clock::now() < until;
       sched_yield()) {
    std::lock_guard lock(state_->mutex);
    if (state_->done) break;
  }
  std::unique_lock lock(state_->mutex);
  state_->cv.wait(lock, [&] { return state_->done; });
  if (state_->error) std::rethrow_exception(state_->error);
}

bool Work::wait_for(std::chrono::milliseconds timeout, Waiter waiter) {
  if (waiter == Waiter::kApplication) state_->note_wait();
  state_->ask_to_start();
  const Waiting waiting(state_->doorbell);
  std::unique_lock lock(state_->mutex);
  if (!state_->cv.wait_for(lock, timeout, [&] { return state_->done; })) return false;
  if (state_->error) std::rethrow_exception(state_->error);
  return true;
}

void Work::needed() { state_->note_wait(); }

bool Work::is_completed() const {
  state_->ask_to_start();  // polling for completion must not keep a group open
  std::lock_guard lock(state_->mutex);
  return state_->done;
}

std::exception_ptr Work::error() const {
  std::lock_guard lock(state_->mutex);
  return state_->error;
}

// ---- calls -------------------------------------------------------------------------

std::shared_ptr<Work> Communicator::allreduce_async(TensorView t, ReduceOp op, const CompressOptions& options) {
  return std::make_shared<Work>(impl_->allreduce_async(t, op, options));
}
std::shared_ptr<Work> Communicator::reduce_scatter_async(TensorView in, TensorView out, ReduceOp op,
                                                       const CompressOptions& options) {
  return std::make_shared<Work>(impl_->reduce_scatter_async(in, out, op, options));
}

std::shared_ptr<Work> Communicator::allgather_async(TensorView in, TensorView out) {
  return std::make_shared<Work>(impl_->allgather_async(in, out));
}
std::shared_ptr<Work> Communicator::broadcast_async(TensorView t, int root) {
  return std::make_shared<Work>(impl_->broadcast_async(t, root));
}

void Communicator::allreduce(TensorView t, ReduceOp op, const CompressOptions& options) {
  // Null: it ran to its end here (engine.h, "Calls on the caller's thread").
  if (auto state = impl_->allreduce_async(t, op, options, /*blocking=*/true)) Work(std::move(state)).wait();
}
void Communicator::allgather(TensorView in, TensorView out) { Work(impl_->allgather_async(in, out)).wait(); }
void Communicator::reduce_scatter(TensorView in, TensorView out, ReduceOp op, const CompressOptions& options) {
  Work(impl_->reduce_scatter_async(in, out, op, options)).wait();
}
void Communicator::broadcast(TensorView t, int root) {
  if (auto state = impl_->broadcast_async(t, root, /*blocking=*/true)) Work(std::move(state)).wait();
}
void Communicator::barrier() {
  if (auto state = impl_->barrier_async(/*blocking=*/true)) Work(std::move(state)).wait();
}
void Communicator::synchronize() { impl_->synchronize(); }

AllreducePlan Communicator::plan_allreduce(int64_t numel, const CompressOptions& options) {
  return impl_->plan_allreduce(numel, options);
}
bool Communicator::sent_mask(const std::string& key, TensorView mask, void* stream) {
  return impl_->sent_mask(key, mask, stream);
}

std::vector<uint8_t> Communicator::save_state() const { return impl_->save_state(); }
void Communicator::load_state(std::span<const uint8_t> bytes) { impl_->load_state(bytes); }
Stats Communicator::stats() const { return impl_->stats(); }

}  // namespace gradcomm
