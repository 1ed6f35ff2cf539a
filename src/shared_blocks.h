// The blocks of memory a node's ranks allocated together (Communicator::alloc_shared,
// shared_buffer.cc): rank q's block is mapped into every rank of the node, so that a
// collective whose every rank passes the same place in the same allocation reads the
// peers' buffers where they are (NodeCollectives::allreduce_direct) instead of through
// the segment's slots. Added by the user's thread at allocation, removed when the
// SharedBuffer goes; found by the engine's thread at a call.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace gradcomm::detail {

class SharedBlocks {
 public:
  struct Block {
    uint64_t id = 0;              // the same on every rank of the node: allocations are collective
    size_t bytes = 0;             // of each rank's block
    std::vector<uint8_t*> bases;  // by place in the node: that rank's block, as mapped here
  };

  // Numbers an allocation: called once per alloc_shared on every rank, in call order.
  uint64_t next_id() { return ++last_id_; }
  void add(std::shared_ptr<const Block> block);
  void remove(uint64_t id);
  // The block holding [p, p + bytes) of this rank (place `local` in the node), if any.
  std::shared_ptr<const Block> find(const void* p, size_t bytes, int local) const;

 private:
  mutable std::mutex mutex_;
  std::vector<std::shared_ptr<const Block>> blocks_;
  std::atomic<size_t> count_{0};  // blocks_.size(): a call without blocks takes no lock
  uint64_t last_id_ = 0;          // the user's thread only (alloc_shared)
};

}  // namespace gradcomm::detail
