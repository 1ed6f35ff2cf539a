// INTERNAL, not part of the public API: read-only looks into a communicator's
// compression state, for the reference trainer's DGC momentum-factor masking
// (trainer/optimizer.cc), and one way to trim it, for the torch.distributed backend
// (python_bindings/torch_backend). Nothing here is promised to downstream users:
// names and behaviour may change with the compression engine.
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
// InvalidArgument when the key holds state of another dtype.
std::span<const float> residual_view(Communicator& comm, const std::string& key);

// DGC's momentum mask for `key`: 0 at the indices this rank's last sparsified allreduce
// of the key sent, 1 elsewhere (numel floats); empty when the key has sent nothing yet
// or its state lives on a GPU. (The residual is no longer 0 where a value was sent: it
// keeps what rounding the value to bf16/fp16 dropped.) Same rules as residual_view for
// when to call it.
std::vector<float> sent_mask(Communicator& comm, const std::string& key);

// How the next allreduce of `numel` elements under `spec` and `key` will run.
struct NextAllreduce {
  bool dense = true;             // goes through the dense ring: compressor none,
                                 // numel < min_numel, or the key is still in warm-up
  bool sparsifier_with_ef = false;  // topk / randomk / sketch with error feedback:
                                    // sent_mask() says which coordinates were transmitted
};
// Parses `spec` (InvalidArgument as allreduce would) and looks at the key's step
// (complete: every earlier allreduce of the key must have completed).
NextAllreduce next_allreduce(Communicator& comm, const std::string& spec, const std::string& key, int64_t numel);

// Drops the compression state (residual, step, device buffers) of `keys`; unknown
// keys are ignored. Only for keys no call will use again and whose every issued call
// has completed (its Work done): the engine holds a queued call's key state by
// address. The torch backend keys state by tensor storage and drops a freed
// storage's keys, so that reducing fresh tensors does not grow memory.
void forget_keys(Communicator& comm, std::span<const std::string> keys);

}  // namespace gradcomm::detail
