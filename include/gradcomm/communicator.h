// The communicator: one per process and job, the entry point of every collective.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "gradcomm/types.h"

namespace gradcomm {

struct CompressOptions {
  std::string compressor = "none";  // spec string (docs/architecture.md, "Compression")
  std::string key;                  // names this tensor's state; required for stateful compressors
  void* stream = nullptr;           // cudaStream_t for device tensors; null = default stream
  // The tensor's shape, for compressors that view it as a matrix (powersgd: rows =
  // shape[0], cols = the rest; fewer than 2 dimensions goes dense). Empty: 1-D. Its
  // product must be the tensor's numel.
  std::vector<int64_t> shape;
  // Over two levels (GRADCOMM_HIERARCHY, docs/two-levels.md) compression happens across the
  // nodes only; true compresses inside them too, as the spec key inside=compress does (the
  // codec-ring families: fp16, bf16, quant, qsgd, sign; InvalidArgument for others).
  bool compress_inside_nodes = false;
  // Or: the tensor holds these tensors laid end to end (a DDP bucket's parameters),
  // each viewed on its own; their numels must add up to the tensor's. At most one of
  // shape and parts may be given. Every rank must pass the same (MismatchError).
  std::vector<std::vector<int64_t>> parts;
};

struct InitOptions {  // unset fields come from the environment (see docs/launching.md, "Launching")
  int rank = -1, world_size = -1;
  std::string store;                // "tcp://host:port" | "file:///shared/dir"
  std::string transport = "auto";   // "ucx" | "nccl" | "auto"
  std::chrono::milliseconds timeout{300'000};
  std::string job_token;            // shared secret; empty = GRADCOMM_JOB_TOKEN
};

// Which ranks share a node (Communicator::topology; docs/two-levels.md). A node is a
// host (its hostname and boot id) unless GRADCOMM_NODE names it (containers, an emulated
// cluster). Ranks of one node talk over shared memory, ranks of different nodes never
// do; the hierarchical collectives (GRADCOMM_HIERARCHY) work inside the nodes first,
// then across them. Every rank sees the same nodes.
struct Topology {
  int nodes = 1;                  // how many nodes the job spans
  int node = 0;                   // this rank's node: nodes are numbered by their lowest rank
  int local_rank = 0;             // this rank's place among its node's ranks, in rank order
  int local_size = 1;             // how many ranks its node holds
  std::string node_name;          // GRADCOMM_NODE, or "hostname/boot id"
  std::vector<int> node_of_rank;  // every rank's node
  // This node's ranks meet in a shared segment for their collectives (docs/shared-memory.md);
  // false: the transport carries them (GRADCOMM_SHM=off, or a node of one rank).
  bool node_shm = false;
};

// Counters since the communicator was created. Wire bytes count everything this
// rank put on (or took off) the transport: headers, payloads and control messages.
// compressor=auto: a key's latest choice and why (Stats::auto_choices;
// docs/does-compression-pay.md).
struct AutoChoice {
  std::string key;
  int64_t numel = 0;
  std::string chosen;                   // the chosen candidate, as the auto spec names it
  uint64_t step = 0;                    // the key's step when it was decided
  std::vector<std::string> candidates;  // as the auto spec names them, in its order
  std::vector<double> predicted_s;      // per candidate, predicted seconds per call; negative: left out
  std::vector<std::string> left_out;    // per candidate: why it was left out ("" when priced)
  std::vector<double> compute_s;        // per candidate: the predicted CPU part of predicted_s
  std::vector<double> payload_bytes;    // per candidate: what one rank's encode of the tensor sends
  double alpha_s = 0;                   // the link the decision assumed: seconds per message,
  double bytes_per_s = 0;               // and bytes per second
  double overlap_s = 0;                 // how long callers computed before waiting on the key's calls
};

struct Stats {
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  uint64_t messages_sent = 0;
  uint64_t ops = 0;             // collectives completed
  uint64_t fused_calls = 0;     // of those: allreduces that travelled in a fused group of two or more
  double total_s = 0;           // wall time inside collectives
  double reduce_s = 0;          // of which: local reduction (CPU arithmetic)
  double encode_s = 0;          // of which: compression encode
  double decode_s = 0;          // of which: compression decode
  double comm_s() const { return total_s - reduce_s - encode_s - decode_s; }  // waiting on the wire
  // CPU time of the communicator's engine thread, where every collective's encode,
  // decode, reduction and transport work runs: the library's CPU cost, which wall
  // times like total_s cannot show when that thread shares a core with training.
  double engine_cpu_s = 0;
  // Collectives (or the level inside the node of a two-level call) that ran on the node's
  // shared segment instead of the transport (GRADCOMM_SHM, docs/shared-memory.md).
  uint64_t node_shm_ops = 0;
  // Of those, the blocking calls that ran on the calling thread instead of the engine's
  // (docs/shared-memory.md, "Small calls").
  uint64_t inline_ops = 0;
  // Bytes this rank wrote into the node's shared segment for them: what it gave its node's
  // peers there (bytes_sent counts the transport only).
  uint64_t node_shm_bytes = 0;
  // compressor=auto: each key's latest choice (empty when no call used auto).
  std::vector<AutoChoice> auto_choices;
};

// How the next allreduce of a float32 tensor will travel (Communicator::plan_allreduce).
struct AllreducePlan {
  // Compressed, or on the dense ring: compressor "none", numel under the spec's
  // min_numel, or the key still in its warm-up steps go dense.
  bool compressed = false;
  // A sparsifier with error feedback (topk, randomk, sketch with ef=1): what it did
  // not send stays in the residual, and sent_mask() says what it sent.
  bool sparse_with_feedback = false;
};

namespace detail {
class CommunicatorImpl;
class SharedAllocation;
struct WorkState;
}  // namespace detail

// A collective started by one of the *_async calls. Calls run in the order they
// were issued, on a thread the communicator owns; the tensors they name must stay
// alive and untouched (inputs unmodified, outputs unread) until wait() returns or
// is_completed() is true. For CUDA tensors a call completes once it is enqueued on
// its stream, exactly as the blocking call returns (stream semantics unchanged).
// A Work outlives its communicator safely: destroying the communicator first fails
// the outstanding work with an error that says so.
//
// When the application first needs a call's result (its first wait, or needed()), the
// time since the call was issued is the time the application computed beside it:
// compressor=auto hides a candidate's wire time behind it (docs/does-compression-pay.md).
// An integration that completes a framework's future on a thread of its own (the DDP
// hook) waits there as Waiter::kHelper, which does not count, and calls needed() where
// the application comes to need the result (DDP: when its last bucket is issued).
enum class Waiter : uint8_t { kApplication, kHelper };

class Work {
 public:
  explicit Work(std::shared_ptr<detail::WorkState> state);
  ~Work();
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  // Blocks until the call has completed; rethrows its error (the class the
  // blocking call would have thrown: MismatchError, PeerFailure, TimeoutError, ...).
  void wait(Waiter waiter = Waiter::kApplication);
  // Waits at most `timeout`: false when it passed (the call goes on), true when
  // the call completed (its error, if any, is rethrown as by wait()).
  bool wait_for(std::chrono::milliseconds timeout, Waiter waiter = Waiter::kApplication);
  // The application needs the result from now on (see above); never blocks. Only the
  // first of this and the application's waits counts.
  void needed();
  bool is_completed() const;
  // The call's error once it has failed; null while pending or after success.
  std::exception_ptr error() const;

 private:
  std::shared_ptr<detail::WorkState> state_;
};

// Host memory from Communicator::alloc_shared: this rank's block of an allocation that
// the ranks made together, mapped by the other ranks of its node too. When every rank of a
// node passes the same place in the same allocation to an allreduce, they read each
// other's buffers where they are instead of copying them through the node's segment
// (docs/shared-memory.md, "Shared buffers"); to everything else it is plain memory.
// Destroying it unmaps this rank's mappings only (not a collective); it may outlive the
// communicator. Free it only when no call that uses it is in flight on this rank.
class SharedBuffer {
 public:
  SharedBuffer();
  ~SharedBuffer();
  SharedBuffer(SharedBuffer&& other) noexcept;
  SharedBuffer& operator=(SharedBuffer&& other) noexcept;

  void* data() const;   // 4096-byte aligned, zero-filled at allocation; null when empty
  size_t size() const;  // the bytes asked for
  // Whether the node's other ranks have mapped it (false: plain memory, where this rank's
  // node has no shared segment: one rank on it, GRADCOMM_SHM=off).
  bool shared() const;

 private:
  friend class Communicator;
  explicit SharedBuffer(std::unique_ptr<detail::SharedAllocation> impl);
  std::unique_ptr<detail::SharedAllocation> impl_;
};

class Communicator {
 public:
  // Rendezvous through the store and connect the transport. Blocks until every
  // rank has joined or `timeout` passes (TimeoutError).
  static std::unique_ptr<Communicator> create(const InitOptions& options = {});
  // Fails any work still outstanding (InvalidArgument on this rank, PeerFailure on
  // the others, which are told) and returns promptly. After a clean run (no failure,
  // nothing outstanding) it first waits, up to the timeout, until every live peer has
  // completed this rank's calls too (docs/fault-model.md, item 5).
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const;
  int size() const;
  // Which ranks share this rank's node (fixed at create).
  const Topology& topology() const;

  // In place. Every rank must call with the same numel, dtype, op and compressor.
  void allreduce(TensorView t, ReduceOp op = ReduceOp::kSum, const CompressOptions& options = {});
  // out.numel == size() * in.numel; rank r's input lands at out[r * in.numel].
  void allgather(TensorView in, TensorView out);
  // in.numel == size() * out.numel: the inputs reduced over the ranks, rank r's segment
  // (elements [r * out.numel, (r + 1) * out.numel)) into out; the input is left unchanged.
  // out is a buffer of its own or exactly that segment of in. Every rank must call with
  // the same numel, dtype, op and compressor. Compressed (options.compressor): the codecs
  // of the compressed ring (fp16, bf16, quant, qsgd, sign), float32 host tensors, sum or
  // avg; every hop sends a payload, rank r's share is exact in what it received, and
  // error feedback (key) keeps what this rank's encodes dropped, over its whole input.
  void reduce_scatter(TensorView in, TensorView out, ReduceOp op = ReduceOp::kSum,
                      const CompressOptions& options = {});
  void broadcast(TensorView t, int root);
  void barrier();

  // Non-blocking forms: each checks its arguments at once (InvalidArgument,
  // Unsupported, or the error of an earlier failure are thrown here) and returns
  // a Work; the blocking calls above are these followed by wait(). Every rank must
  // issue the same sequence of calls, blocking and non-blocking alike. Small
  // allreduces issued close together may travel as one fused collective
  // (GRADCOMM_FUSION_BYTES, GRADCOMM_CYCLE_MS; docs/api.md, "Overlap and fusion").
  std::shared_ptr<Work> allreduce_async(TensorView t, ReduceOp op = ReduceOp::kSum,
                                        const CompressOptions& options = {});
  std::shared_ptr<Work> allgather_async(TensorView in, TensorView out);
  std::shared_ptr<Work> reduce_scatter_async(TensorView in, TensorView out, ReduceOp op = ReduceOp::kSum,
                                             const CompressOptions& options = {});
  std::shared_ptr<Work> broadcast_async(TensorView t, int root);
  // Waits for stream-ordered work (CUDA tensors) to finish and surfaces its errors.
  void synchronize();

  // `bytes` of host memory that the ranks of this rank's node can read directly (see
  // SharedBuffer). A collective call: every rank calls it with the same `bytes`, in the
  // same order as its other calls (it runs as two allgathers). MismatchError on every
  // rank when they asked for different sizes; TransportError on every rank when a rank
  // could not make or map a block (naming the rank and why); InvalidArgument for 0 bytes.
  SharedBuffer alloc_shared(size_t bytes);

  // Compression state, read by optimizers that adapt to it (the reference trainer's
  // DGC momentum correction). Both read a key's state as its last allreduce left it:
  // call them once that call has completed (Work waited on; for CUDA tensors, on the
  // same stream).
  //
  // How the next allreduce of `numel` float32 elements with `options` (compressor and
  // key) will travel: the compressed allreduce's own tests, in its order.
  // InvalidArgument for a bad spec, as allreduce would throw.
  AllreducePlan plan_allreduce(int64_t numel, const CompressOptions& options);
  // DGC's momentum-factor masking (Lin et al., 2018): writes 0 into `mask` (float32,
  // the key's numel) at the coordinates this rank's last sparsified allreduce of `key`
  // sent, 1 elsewhere. The mask may be host memory, or device memory on the key's
  // device (then written on `stream`, a cudaStream_t; null = default stream). Returns
  // false, and leaves the mask untouched, when no sparsified allreduce of the key has
  // run yet (nothing to mask). A key whose state lives on a GPU (CUDA tensors on the
  // NCCL path) needs a device mask.
  bool sent_mask(const std::string& key, TensorView mask, void* stream = nullptr);

  // All compression state (residuals, steps), after every call issued before it.
  std::vector<uint8_t> save_state() const;
  // Validates (CorruptPayload on bad input), then replaces the state once every
  // call issued before it has completed.
  void load_state(std::span<const uint8_t> bytes);
  Stats stats() const;  // counters of the calls completed so far

  // For internal factories (tests build communicators over the in-process transport).
  explicit Communicator(std::unique_ptr<detail::CommunicatorImpl> impl);
  detail::CommunicatorImpl& impl() { return *impl_; }

 private:
  std::unique_ptr<detail::CommunicatorImpl> impl_;
};

}  // namespace gradcomm
