// The Gloo peer: gloo::AllreduceRingChunked (in place, sum) and gloo::AllgatherRing
// over Gloo's TCP transport, the algorithms PyTorch's Gloo backend runs on CPU.
//
// Rendezvous goes through the job's own gradcomm store, via a client connection
// the bench opens beside the Communicator's, with every key under "bench/gloo/".
// Why not Gloo's FileStore in a temp dir: the ranks would have to agree on a
// directory (and see the same one on every host), and a crashed run leaves stale
// keys that a later run could read; the gradcomm store is fresh per job,
// authenticated with the job token, and already reachable by every rank.
//
// Gloo binds its TCP device to the loopback address when the store's host is a
// loopback one (gradcomm-run), otherwise to this host's name; the variable
// GRADCOMM_BENCH_GLOO_HOST overrides the choice.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "baselines/baseline.h"

namespace gloo {
class Algorithm;
class Context;
}  // namespace gloo

namespace gradcomm::bench {

class GlooBaseline : public Baseline {
 public:
  // Collective: connects the full mesh of Gloo pairs.
  explicit GlooBaseline(const BaselineSetup& setup);
  ~GlooBaseline() override;

  std::string name() const override { return "gloo"; }
  std::string describe() const override { return description_; }
  void validate(BenchOp op, DType dtype) const override;
  void prepare(BenchOp op, DType dtype, void* in, void* out, int64_t count) override;
  void run() override;

 private:
  std::shared_ptr<gloo::Context> context_;
  std::unique_ptr<gloo::Algorithm> algorithm_;  // built per size; run() only communicates
  std::string description_;
};

}  // namespace gradcomm::bench
