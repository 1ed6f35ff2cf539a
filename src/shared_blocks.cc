#include "shared_blocks.h"

#include <algorithm>
#include <utility>

namespace gradcomm::detail {

void SharedBlocks::add(std::shared_ptr<const Block> block) {
  std::lock_guard lock(mutex_);
  blocks_.push_back(std::move(block));
  count_.store(blocks_.size(), std::memory_order_release);
}

void SharedBlocks::remove(uint64_t id) {
  std::lock_guard lock(mutex_);
  std::erase_if(blocks_, [&](const std::shared_ptr<const Block>& b) { return b->id == id; });
  count_.store(blocks_.size(), std::memory_order_release);
}

std::shared_ptr<const SharedBlocks::Block> SharedBlocks::find(const void* p, size_t bytes, int local) const {
  if (count_.load(std::memory_order_acquire) == 0) return nullptr;
  const auto at = reinterpret_cast<uintptr_t>(p);
  std::lock_guard lock(mutex_);
  for (const auto& b : blocks_) {
    const auto base = reinterpret_cast<uintptr_t>(b->bases[static_cast<size_t>(local)]);
    if (at >= base && at - base <= b->bytes && bytes <= b->bytes - (at - base)) return b;
  }
  return nullptr;
}

}  // namespace gradcomm::detail
