// ProcessGroupGradcomm: a torch.distributed (c10d) backend whose collectives run on
// a gradcomm Communicator, so `dist.init_process_group("gradcomm")` gives torch code
// (DDP and FSDP included) gradcomm's transports and gradient compression. On torch
// 1.13 it is the process group itself; on torch >= 2 a c10d::Backend that torch's
// ProcessGroup dispatches to (BackendBase below).
//
// One communicator per process group, created in the constructor through the
// c10d::Store torch hands the backend's creator (c10d_store.h): the rendezvous
// needs no second port, and a subgroup (dist.new_group) gets its own communicator
// under its own store prefix.
//
// Ops and how they map (all non-blocking: each issues gradcomm *_async calls and
// returns a GradcommWork, work.h):
//   allreduce            allreduce_async, in place (SUM, AVG, MIN, MAX)
//   allreduce_coalesced  one allreduce_async per tensor (the engine fuses small ones)
//   broadcast            broadcast_async, in place
//   allgather            allgather_async into one flat buffer, then copied into the
//                        caller's list; _allgather_base gathers straight into its output
//   reduce_scatter       the library's reduce_scatter (dense, the codec-ring families and
//                        top-k); with the other compressors the inputs laid end to end
//                        are allreduced, compressed, and this rank's chunk copied out
//                        (process_group.cc, "Compressed reduce-scatter")
//   torch 2.x            startCoalescing/endCoalescing, and the coalesced
//                        all-gather / reduce-scatter of tensors: the ops above, issued
//                        one by one, completed as one Work
//   barrier              a one-element allreduce: no rank completes it before every
//                        rank has issued it, and it is ordered after earlier calls
// Anything else (reduce, gather, scatter, alltoall, send/recv, ...) throws an error
// that names the op and lists these (c10::NotImplementedError: Python's
// NotImplementedError, as is a reduce op other than these). A bad argument (dtype,
// sizes, device, layout, spec) is a std::invalid_argument (ValueError) naming the
// op and what is wrong; it is raised before anything reaches the wire.
//
// Tensors: CPU (CUDA too when the library was built with CUDA; those run on the
// default stream), strided, not sparse, one tensor per rank (one device per
// process). A non-contiguous tensor goes through a contiguous copy that is copied
// back before the work completes. Reductions take the library's dtypes (float32,
// float16, bfloat16, float64, int32, int64, uint8); broadcast and allgather move any
// dtype, as raw bytes when the library has no such type (bool, int8, complex).
//
// Compression: allreduce and reduce-scatter of float32 tensors (float16/bfloat16 ones
// staged through a float32 copy) with SUM or AVG and at least `min_numel` elements
// use the group's compressor spec ("none" = exact); gathers and broadcasts are exact.
// A reduce-scatter's error-feedback state is keyed by its call site within a round
// (process_group.cc, "Compressed reduce-scatter"). An allreduce's
// state (error feedback) is keyed by the tensor's storage: each storage gets an
// ordinal the first time it is compressed (the same on every rank, since every
// rank issues the same calls in the same order), and the key is
// "torch/s<ordinal>/o<storage offset>/n<numel>", plus "/v<size>:<stride>,..." for a
// non-contiguous view, whose elements are compressed in its own logical order (W
// and W.t() get separate residuals). A tensor reduced again and again
// (a DDP bucket) keeps its residual; a storage freed and reallocated gets a new
// ordinal, never a dead tensor's state. Compressing a fresh tensor on every call
// therefore creates state on every call: compress persistent gradient buffers.
//
// Threading: ops may be issued from any thread (DDP issues from autograd's); they
// are issued whole, and handed to the Completer, under one lock, so the order of
// calls on the wire is the order of issue, and so is the order in which they are
// waited for. Their Futures complete on the Completer's completion threads, never
// on the thread that waits for the next op, so a callback may issue an op and wait
// on it (work.h). Which op is issued when, callbacks' ops included: issue_order.cc.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/version.h>  // TORCH_VERSION_MAJOR

// torch >= 2: a third-party backend is a c10d::Backend that torch's ProcessGroup
// dispatches to, per device. torch 1.13: it is the c10d::ProcessGroup itself. Both
// declare the same collective virtuals with the same signatures, so one class serves
// both; what only 2.x has (coalescing, the *_coalesced tensor ops) is under
// GRADCOMM_TORCH2 and reuses the same issue path.
#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#define GRADCOMM_TORCH2 1
namespace gradcomm::torch_backend {
using BackendBase = c10d::Backend;
}
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#define GRADCOMM_TORCH2 0
namespace gradcomm::torch_backend {
using BackendBase = c10d::ProcessGroup;
}
#endif

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "gradcomm/communicator.h"
#include "work.h"

namespace gradcomm::torch_backend {

struct CompressionConfig {
  std::string spec = "none";  // gradcomm spec string (docs/api.md, "Compression")
  // Smaller tensors are reduced exactly: a process group also carries metrics and
  // counters, which a lossy compressor must not touch (gradcomm.torch.PG_MIN_COMPRESS_NUMEL).
  int64_t min_numel = 1024;
};

// Runs `f` with the Python GIL released when the calling thread holds it (module.cc).
// The process group's destructor uses it: it waits for the completion threads, whose
// future callbacks may need the GIL.
void without_gil(const std::function<void()>& f);

class ProcessGroupGradcomm : public BackendBase {
 public:
  // Blocks until every rank of the group has joined (or `timeout`, TimeoutError).
  // `group_name` only labels errors. Throws PythonError (gradcomm.<Kind> in Python; work.h).
  ProcessGroupGradcomm(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout, const std::string& group_name,
                       CompressionConfig compression);
  // shutdown().
  ~ProcessGroupGradcomm() override;

  // Fails outstanding work (the peers are told), then stops the completion thread;
  // later ops raise an error that says so. Idempotent; never waits on a peer.
  // gradcomm/torch.py calls it at interpreter exit for the groups still alive
  // (torch keeps them referenced), so no engine thread runs into process teardown.
  void shutdown();

  const std::string getBackendName() const override { return "gradcomm"; }

  // Validates the spec (InvalidArgument text naming the problem); applies to ops
  // issued after it returns. Every rank must set the same.
  void set_compression(CompressionConfig compression);
  CompressionConfig compression() const;
  // Bytes of the communicator's compression state (save_state), for tests: it must
  // not grow with every fresh tensor reduced.
  size_t compression_state_bytes();

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts = c10d::BroadcastOptions()) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts = c10d::AllreduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceCoalescedOptions& opts = c10d::AllreduceCoalescedOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(
      at::Tensor& output, at::Tensor& input,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts = c10d::BarrierOptions()) override;

#if GRADCOMM_TORCH2
  // torch 2.x coalescing: `with dist._coalescing_manager(group, device)` brackets ops
  // with startCoalescing()/endCoalescing(); each op is issued at once as usual, and
  // endCoalescing() returns one Work that completes once all of them have (their
  // local steps included: the Completer settles in issue order). The *_coalesced
  // tensor ops are the same over all_gather_into_tensor / reduce_scatter_tensor.
  bool supportsCoalescing() const override { return true; }
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;

 private:
  template <class IssueOne>
  c10::intrusive_ptr<c10d::Work> coalesced(const char* name, std::vector<at::Tensor>& outputs,
                                           std::vector<at::Tensor>& inputs, IssueOne issue_one);

 public:
#endif

  // Reduce-scatter keys (see "Compressed reduce-scatter" in process_group.cc) are
  // numbered per round; this starts the next round. gradcomm.torch calls it before
  // every optimizer step, which every rank reaches at the same point of its calls.
  void next_round();

  // Per-group counters (gradcomm.torch.stats(group)): the communicator's (wire bytes,
  // time split) and what the reductions issued on this group would have sent dense.
  struct GroupStats {
    Stats comm;
    uint64_t reductions = 0;             // allreduce-type calls issued (reduce-scatter included)
    uint64_t compressed = 0;             // of those: with a compressor
    uint64_t reduced_bytes = 0;          // their tensors' bytes
    // What dense rings send for them: 2(N-1)/N x bytes (allreduce), (N-1)/N (reduce-scatter).
    uint64_t dense_ring_bytes = 0;
    uint64_t gathered_bytes = 0;         // payload the all-gathers issued send: (N-1) x input bytes each
                                         // (none on the node's shared segment)
  };
  GroupStats stats();

  // Not provided: each throws an error naming the op and the supported ones.
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>&, const c10d::ReduceOptions&) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>&, std::vector<at::Tensor>&,
                                                     const c10d::AllgatherOptions&) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>&, std::vector<at::Tensor>&,
                                        const c10d::GatherOptions&) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>&, std::vector<std::vector<at::Tensor>>&,
                                         const c10d::ScatterOptions&) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor&, at::Tensor&, std::vector<int64_t>&,
                                               std::vector<int64_t>&, const c10d::AllToAllOptions&) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>&, std::vector<at::Tensor>&,
                                          const c10d::AllToAllOptions&) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>&, int, int) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>&, int, int) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>&, int) override;

 private:
  // ---- issue order (issue_order.cc) ----
  using Issue = std::function<void(std::vector<std::shared_ptr<gradcomm::Work>>&)>;
  using Calls = std::vector<std::shared_ptr<gradcomm::Work>>;
  // An op: `issue` appends the gradcomm works it starts, under the issue lock; the
  // GradcommWork is queued on the Completer in the same critical section. At once,
  // or held until the ops it must follow are through (issue_order.cc). `issue` runs
  // later when held: it captures what it uses by value.
  c10::intrusive_ptr<c10d::Work> start(c10d::OpType type, const char* op, Issue issue, std::vector<at::Tensor> outputs,
                                       std::vector<at::Tensor> keep, std::function<void()> finish);
  struct Held {
    c10::intrusive_ptr<GradcommWork> work;
    Issue issue;
    std::shared_ptr<Calls> coalesce_into;  // the coalescing batch's calls, when inside one
  };
  // Issues `op` now and queues its work; an error in `issue` fails the work (and is
  // rethrown when `rethrow`). Caller holds issue_mutex_.
  void issue_now(Held& op, bool top_level, bool rethrow);
  // Rule 3: waits (issue lock released) while another thread's ops are settled but
  // their callbacks still running; refuses (aborting every rank) when they are in
  // flight. Caller holds `lock`.
  void one_issuer(std::unique_lock<std::mutex>& lock, int issuer, const char* op);
  // Rule 2: whether an open op's callbacks may still issue (its Future handed out,
  // its completion not returned). Caller holds issue_mutex_.
  bool holding() const;
  void prune_open();  // drops returned ops from open_; caller holds issue_mutex_
  // The Completer's listener: issues the held ops that may go now; at a deadline,
  // fails them if their predecessor still holds them (the timeout).
  void on_completion(bool deadline);
  [[noreturn]] void refuse(const std::string& why);  // refuse_calls + InvalidArgument
  // The compressor options for an allreduce of `t` (staged in `flat`); caller holds issue_mutex_.
  CompressOptions compress_options(const at::Tensor& t, const at::Tensor& flat, ReduceOp op);
  std::string compression_key(const at::Tensor& t);  // caller holds issue_mutex_

  // The options for a reduce-scatter of `flat` (the whole input, staged; its dtype was
  // `input_type`), keyed per round and call site; caller holds issue_mutex_.
  CompressOptions reduce_scatter_options(const at::Tensor& flat, at::ScalarType input_type, ReduceOp op);
  // Counts a reduction of `numel` elements of the caller's `dtype` (not a float32 staging
  // copy's) in stats_, against the bytes a dense allreduce (or, for `reduce_scatter`, a
  // dense reduce-scatter) of them sends in that dtype; caller holds issue_mutex_.
  void count_reduction(int64_t numel, at::ScalarType dtype, const CompressOptions& options,
                       bool reduce_scatter = false);
  // Whether a reduction of `t` (op) compresses with the group's spec: float32, or a
  // float16/bfloat16 staged through float32, of enough elements, summed or averaged
  // (takes issue_mutex_). Otherwise it is exact: the library's dense reduce-scatter.
  bool compresses(const at::Tensor& t, ReduceOp op) const;
  // A compressed reduce-scatter of `flat` (this call's float32 or same-dtype copy of the
  // input) into `out`: the library's where it compresses the spec, else an allreduce.
  c10::intrusive_ptr<c10d::Work> compressed_reduce_scatter(c10d::OpType type, const char* name, const at::Tensor& flat,
                                                           const at::Tensor& out, ReduceOp op);
  // The dense reduce-scatter of `in` (group size x out.numel() elements) into `out`.
  c10::intrusive_ptr<c10d::Work> dense_reduce_scatter(c10d::OpType type, const char* op, const at::Tensor& in,
                                                      const at::Tensor& out, ReduceOp reduce_op);
  // Counts an all-gather of `in` in stats_ (takes issue_mutex_).
  void count_gather(const at::Tensor& in);
  // Whether `t` (float16/bfloat16) is compressed through a float32 copy: when it is
  // compressed and the library does not take it as it is (a GPU tensor, or a family
  // other than the codecs and top-k: detail::compresses_16bit).
  bool compress_through_float32(const at::Tensor& t, ReduceOp op) const;
  // The buffer's type is one the library compresses (caller holds issue_mutex_).
  bool compressible_type(const at::Tensor& flat) const;

  mutable std::mutex issue_mutex_;
  bool library_reduce_scatter_ = false;  // the library's reduce_scatter compresses compression_.spec's family
  bool library_16bit_ = false;           // the library compresses float16/bfloat16 host tensors of that spec
  GroupStats stats_;  // the issue-side counters (comm is filled in by stats())
  // Reduce-scatter call sites in the current round: "<numel>/<dtype>" -> calls so far.
  std::unordered_map<std::string, uint64_t> round_calls_;
  // A round longer than this has most likely no end (see next_round()): warned once.
  static constexpr uint64_t kRoundCallsWarning = 4096;
  std::string group_label_;
  struct Coalescing {
    bool active = false;
    std::shared_ptr<Calls> calls;  // filled as the bracket's ops are issued (maybe after endCoalescing)
    std::vector<at::Tensor> outputs;
  } coalescing_;
  std::unique_ptr<Communicator> comm_;
  std::shared_ptr<CompletionListener> listener_ = std::make_shared<CompletionListener>();
  std::unique_ptr<Completer> completer_;
  std::deque<Held> held_;                                // rule 2, in issue order
  std::chrono::steady_clock::time_point held_since_;     // when held_'s front began to wait on its own
  std::vector<c10::intrusive_ptr<GradcommWork>> open_;   // started (issued or held), not yet returned
  std::condition_variable returned_cv_;                  // rule 3's waits: a completion returned
  std::chrono::milliseconds hold_limit_;                 // the group's timeout: how long an op may be held
  CompressionConfig compression_;
  struct StorageOrdinal {
    c10::weak_intrusive_ptr<c10::StorageImpl> storage;
    uint64_t ordinal;
    std::vector<std::string> keys;  // the compression keys issued on this storage
  };
  // Drops the entries of freed storages and their keys' compression state, once the
  // map has grown to twice what was live at the last sweep (and at least kMinSweep).
  void sweep_dead_storages();
  static constexpr size_t kMinSweep = 64;
  std::unordered_map<const c10::StorageImpl*, StorageOrdinal> ordinals_;
  size_t sweep_at_ = kMinSweep;
  uint64_t next_ordinal_ = 0;
};

}  // namespace gradcomm::torch_backend
