// INTERNAL, not part of the public API: a read-only look into a communicator's
// compression state, for tests, and one way to trim it, for the torch.distributed
// backend (python_bindings/torch_backend). Nothing here is promised to downstream
// users: names and behaviour may change with the compression procedure. (What the
// reference trainer needs is public: Communicator::plan_allreduce and sent_mask.)
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "gradcomm/communicator.h"

namespace gradcomm::detail {

// The error-feedback residual of `key` as float32, read-only. Empty when the key
// has no residual (never allreduced yet, or its spec has ef=0). Call it only once
// the key's last allreduce has completed (its Work waited on): the engine thread
// writes residuals. The view stays valid until the key's next allreduce is issued,
// load_state or destruction of `comm`.
// Float32 whatever the key's dtype (a float16/bfloat16 key's residual is float32 too).
std::span<const float> residual_view(Communicator& comm, const std::string& key);

// Drops the compression state (residual, step, device buffers) of `keys`; unknown
// keys are ignored. Only for keys no call will use again and whose every issued call
// has completed (its Work done): the engine holds a queued call's key state by
// address. The torch backend keys state by tensor storage and drops a freed
// storage's keys, so that reducing fresh tensors does not grow memory.
void forget_keys(Communicator& comm, std::span<const std::string> keys);

// For a caller that orders its issuing threads itself (the torch backend's
// "Issue order", python_bindings/torch_backend/issue_order.cc): while an IssueAs lives,
// the calls this thread issues count, for the engine's concurrent-issuer check
// (src/engine.h, "Issuing threads"), as `issuer`'s (non-zero; the caller's own
// numbering, e.g. the thread id of the op whose callback issues).
// The calling thread's own issuer number (its gettid), as the engine records it.
int thread_issuer();
class IssueAs {
 public:
  explicit IssueAs(int issuer);
  ~IssueAs();
  IssueAs(const IssueAs&) = delete;
  IssueAs& operator=(const IssueAs&) = delete;

 private:
  int previous_;
};

// Refuses every later call of `comm` and aborts it on every rank with `why`
// (InvalidArgument everywhere), as a refused concurrent issue does: for a caller
// that found concurrent issuers itself.
void refuse_calls(Communicator& comm, const std::string& why);

}  // namespace gradcomm::detail
