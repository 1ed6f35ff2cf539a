// Communicator::alloc_shared and SharedBuffer (gradcomm/communicator.h): blocks of memory
// that the ranks of a node allocate together and every rank of the node maps, so that
// their collectives read the peers' buffers in place (shared_blocks.h,
// NodeCollectives::allreduce_direct).
//
// An allocation is a collective made of two allgathers over the communicator, so every
// rank runs the same calls whatever its node has:
//   1. each rank makes its block (a POSIX shared-memory segment named after the node
//      segment's prefix, its pid, its place and the allocation's number, created O_EXCL;
//      plain memory where its node has no segment) and gathers every rank's record:
//      the size it asked for, and its block's name or why it has none;
//   2. each rank maps the blocks of its node's other ranks and gathers every rank's
//      status: mapped, or why not. Then each rank unlinks its block's name (every rank of
//      its node has mapped it or never will): the blocks live in the mappings only.
// Every rank reads the same records, so every rank reaches the same verdict: all have
// their blocks, or every rank throws the same error (sizes that differ; the first rank
// that could not make or map a block, and why).
#include <fmt/format.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string_view>

#include "collectives/shm_segment.h"
#include "comm_impl.h"
#include "gradcomm/communicator.h"
#include "gradcomm/errors.h"
#include "node_shm.h"
#include "shared_blocks.h"

namespace gradcomm {
namespace detail {

class SharedAllocation {
 public:
  ~SharedAllocation() {
    // Out of the registry before the mappings go (the members' destructors, after this).
    if (auto blocks = registry.lock()) blocks->remove(id);
    std::free(plain);
  }

  uint8_t* data = nullptr;
  size_t bytes = 0;
  ShmSegment own;                  // this rank's block, when shared
  uint8_t* plain = nullptr;        // this rank's block, when not
  std::vector<ShmSegment> peers;   // the node's other ranks' blocks, as mapped here
  std::weak_ptr<SharedBlocks> registry;
  uint64_t id = 0;
};

namespace {

// A rank's record in each of the two allgathers: [the size asked for: 8 bytes][ok: 1]
// [text length: 1][text: the block's name, or why it has none].
constexpr size_t kRecordBytes = 128;
constexpr size_t kTextAt = 10;
constexpr size_t kTextMax = kRecordBytes - kTextAt;
constexpr size_t kPage = 4096;
constexpr size_t kMaxBytes = size_t{1} << 40;

void write_record(uint8_t* record, uint64_t bytes, bool ok, std::string_view text) {
  std::memset(record, 0, kRecordBytes);
  std::memcpy(record, &bytes, sizeof bytes);
  record[8] = ok ? 1 : 0;
  const size_t n = std::min(text.size(), kTextMax);
  record[9] = static_cast<uint8_t>(n);
  std::memcpy(record + kTextAt, text.data(), n);
}

struct Record {
  uint64_t bytes;
  bool ok;
  std::string text;
};

Record read_record(const uint8_t* record) {
  Record r{};
  std::memcpy(&r.bytes, record, sizeof r.bytes);
  r.ok = record[8] == 1;
  r.text.assign(reinterpret_cast<const char*>(record + kTextAt), std::min<size_t>(record[9], kTextMax));
  return r;
}

}  // namespace
}  // namespace detail

SharedBuffer::SharedBuffer() = default;
SharedBuffer::SharedBuffer(std::unique_ptr<detail::SharedAllocation> impl) : impl_(std::move(impl)) {}
SharedBuffer::~SharedBuffer() = default;
SharedBuffer::SharedBuffer(SharedBuffer&& other) noexcept = default;
SharedBuffer& SharedBuffer::operator=(SharedBuffer&& other) noexcept = default;
void* SharedBuffer::data() const { return impl_ ? impl_->data : nullptr; }
size_t SharedBuffer::size() const { return impl_ ? impl_->bytes : 0; }
bool SharedBuffer::shared() const { return impl_ && impl_->own.data() != nullptr; }

SharedBuffer Communicator::alloc_shared(size_t bytes) {
  using detail::kRecordBytes;
  const int me = rank();
  if (bytes == 0 || bytes > detail::kMaxBytes) {
    throw InvalidArgument(fmt::format("rank {}: alloc_shared({}): the size must be 1 byte to 1 TiB", me, bytes));
  }
  detail::NodeShm* shm = impl_->node_shm();
  auto a = std::make_unique<detail::SharedAllocation>();
  a->bytes = bytes;
  const size_t mapped = (bytes + detail::kPage - 1) / detail::kPage * detail::kPage;
  const auto gather = [&](const std::vector<uint8_t>& mine) {
    std::vector<uint8_t> all(kRecordBytes * static_cast<size_t>(size()));
    allgather(TensorView::of(mine.data(), static_cast<int64_t>(kRecordBytes)),
              TensorView::of(all.data(), static_cast<int64_t>(all.size())));
    return all;
  };
  const auto record_of = [](const std::vector<uint8_t>& all, int r) {
    return detail::read_record(all.data() + static_cast<size_t>(r) * kRecordBytes);
  };

  // 1. This rank's block, and every rank's record of its own.
  std::vector<uint8_t> mine(kRecordBytes);
  if (shm != nullptr) {
    a->id = shm->blocks()->next_id();
    const std::string name = fmt::format("{}-{}-p{}-a{}", shm->name_prefix(), ::getpid(), shm->collectives().rank(),
                                         a->id);
    try {
      a->own = detail::ShmSegment::create(name, mapped);
      a->data = a->own.data();
      detail::write_record(mine.data(), bytes, true, name);
    } catch (const Error& e) {
      detail::write_record(mine.data(), bytes, false, fmt::format("could not make its block: {}", e.what()));
    }
  } else {
    a->plain = static_cast<uint8_t*>(std::aligned_alloc(detail::kPage, mapped));
    if (a->plain == nullptr) {
      detail::write_record(mine.data(), bytes, false, fmt::format("could not allocate {} bytes", mapped));
    } else {
      std::memset(a->plain, 0, mapped);
      a->data = a->plain;
      detail::write_record(mine.data(), bytes, true, "");
    }
  }
  const std::vector<uint8_t> blocks = gather(mine);
  for (int r = 0; r < size(); ++r) {
    if (const uint64_t theirs = record_of(blocks, r).bytes; theirs != bytes) {
      throw MismatchError(fmt::format("mismatched alloc_shared calls: rank {} asked for {} bytes, rank {} for {}", r,
                                      theirs, me, bytes));
    }
  }

  // 2. The node's other blocks mapped here, and every rank's status.
  std::string failure;  // why this rank cannot map the others' (its own failure is in its record)
  if (shm != nullptr && record_of(blocks, me).ok) {
    for (const int q : shm->members()) {
      if (q == me) continue;
      const detail::Record theirs = record_of(blocks, q);
      if (!theirs.ok) {
        failure = fmt::format("found no block of rank {}", q);  // reported as rank q's own failure
        break;
      }
      if (!theirs.text.starts_with(shm->name_prefix() + "-")) {
        failure = fmt::format("rank {} named its block '{}', not one of this communicator's", q, theirs.text);
        break;
      }
      try {
        a->peers.push_back(detail::ShmSegment::open(theirs.text, mapped));
      } catch (const Error& e) {
        failure = fmt::format("could not map rank {}'s block: {}", q, e.what());
        break;
      }
    }
  }
  std::vector<uint8_t> status(kRecordBytes);
  detail::write_record(status.data(), bytes, failure.empty(), failure);
  const std::vector<uint8_t> statuses = gather(status);
  a->own.unlink();  // every rank of the node has mapped it, or never will
  // The cause first: a rank without a block, then one that could not map another's.
  for (const auto* records : {&blocks, &statuses}) {
    for (int r = 0; r < size(); ++r) {
      if (const detail::Record s = record_of(*records, r); !s.ok) {
        throw TransportError(fmt::format("alloc_shared({}) on rank {}: rank {} {}", bytes, me, r, s.text));
      }
    }
  }

  // 3. Known to this rank's calls: the blocks by place in the node.
  if (shm != nullptr) {
    auto block = std::make_shared<detail::SharedBlocks::Block>();
    block->id = a->id;
    block->bytes = bytes;
    size_t peer = 0;
    for (const int q : shm->members()) block->bases.push_back(q == me ? a->data : a->peers[peer++].data());
    a->registry = shm->blocks();
    shm->blocks()->add(std::move(block));
  }
  return SharedBuffer(std::move(a));
}

}  // namespace gradcomm
