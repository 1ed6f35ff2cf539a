// Every parser of bytes a peer rank sends during a collective, on arbitrary bytes.
//
// Input: kind u8 | flags u8 | body. kind % 5 picks the parser:
//   0 WireHeader::parse (src/wire.h), the call header each rank checks against its
//     own call. flags bit0: write the magic and version over the first 6 bytes, so
//     mutations reach the field checks; bit1: pad or cut the body to 96 bytes.
//     A header that parses must match an independent decode of the bytes, describe
//     itself on one short printable line, agree with itself and survive
//     serialize -> parse; against a set of local calls (the mismatch report
//     Op::check_header builds), agrees_with must be symmetric and the report bounded.
//   1 decode_control (transport/ucx/ucx_wire.h), the abort notice. flags bit0: fix
//     magic and version, bit1: fix the text length field to the body's size. Accepted
//     exactly when an independent check accepts; fields match the bytes; encode then
//     decode gives the same message.
//   2 GpuRankRecord::parse and choose_gpu_path (src/gpu_plan.h), the records ranks
//     exchange at their first CUDA call. flags bits 0-1: preference (auto, ucx, nccl,
//     or an unknown one); bit2: copy record 0's GPU uuid into the last record (two
//     ranks on one GPU); bit3: cut the last record short (must be CorruptPayload).
//     Only CorruptPayload, InvalidArgument, Unsupported may escape; the choice must
//     not depend on anything but the records (asked twice, answered the same).
//   3 check_block_sizes (src/wire.h), the block sizes ring_allgatherv_bytes gathers
//     (allgatherv, the top-k payload allgather). flags bit0: fold each i64 into
//     [-2^8, 2^41) so both verdicts are common. Verdict and total vs a 128-bit reference.
//   4 check_sample_counts (src/wire.h), the counts a select=sample top-k exchanges
//     on the NCCL path: capacity u64 | numel i64 | k i64 | counts u64...; verdict vs
//     a reference.
// Every refusal message must be one line of bounded length.
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "gpu_plan.h"
#include "gradcomm/errors.h"
#include "transport/ucx/ucx_wire.h"
#include "wire.h"

using gradcomm::detail::ControlMessage;
using gradcomm::DType;
using gradcomm::ErrorCode;
using gradcomm::ReduceOp;
using gradcomm::detail::GpuRankRecord;
using gradcomm::detail::OpKind;
using gradcomm::detail::WireHeader;
using gradcomm::fuzz::ByteReader;
using gradcomm::fuzz::put;

namespace {

template <class T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

void check_line(const std::string& text, size_t limit, const char* what) {
  GRADCOMM_FUZZ_CHECK(text.size() < limit, "%s of %zu bytes", what, text.size());
  for (unsigned char c : text) {
    GRADCOMM_FUZZ_CHECK(c >= 0x20 && c <= 0x7E, "%s holds byte 0x%02x: %s", what, c, text.c_str());
  }
}

// The local calls a received header is compared with.
std::vector<WireHeader> local_calls() {
  std::vector<WireHeader> out;
  WireHeader h;
  h.op = OpKind::kAllreduce;
  h.dtype = DType::kFloat32;
  h.numel = 1000;
  h.seq = 17;
  out.push_back(h);
  h.compressor = "topk:ratio=0.01,select=sample";
  h.compressor_hash = gradcomm::detail::fnv1a32(h.compressor);
  h.step = 3;
  out.push_back(h);
  WireHeader b;
  b.op = OpKind::kBroadcast;
  b.dtype = DType::kUInt8;
  b.numel = 5;
  b.root = 1;
  b.seq = 2;
  out.push_back(b);
  WireHeader v;
  v.op = OpKind::kAllgatherv;
  v.numel = -1;
  out.push_back(v);
  out.push_back(WireHeader{});  // barrier #0
  return out;
}

void fuzz_header(uint8_t flags, std::vector<uint8_t> bytes) {
  if (flags & 2) bytes.resize(WireHeader::kBytes, 0);
  if ((flags & 1) && bytes.size() >= 6) {
    const uint32_t magic = WireHeader::kMagic;
    const uint16_t version = WireHeader::kVersion;
    std::memcpy(bytes.data(), &magic, 4);
    std::memcpy(bytes.data() + 4, &version, 2);
  }
  const auto parsed = WireHeader::parse(bytes.data(), bytes.size());
  // Reference: which bytes a version-1 header may hold (op 1-6: allreduce .. reduce_scatter).
  const uint8_t* p = bytes.data();
  const bool valid = bytes.size() == WireHeader::kBytes && load<uint32_t>(p) == WireHeader::kMagic &&
                     load<uint16_t>(p + 4) == WireHeader::kVersion && p[6] >= 1 && p[6] <= 6 && p[7] <= 6 &&
                     p[8] <= 3;
  GRADCOMM_FUZZ_CHECK(parsed.has_value() == valid, "parse %s a header the reference %s",
                      parsed ? "accepted" : "refused", valid ? "accepts" : "refuses");
  if (!parsed) return;
  const WireHeader& h = *parsed;
  GRADCOMM_FUZZ_CHECK(static_cast<uint8_t>(h.op) == p[6] && static_cast<uint8_t>(h.dtype) == p[7] &&
                          static_cast<uint8_t>(h.reduce_op) == p[8],
                      "op/dtype/reduce_op differ from the bytes");
  GRADCOMM_FUZZ_CHECK(h.seq == load<uint64_t>(p + 12) && h.numel == load<int64_t>(p + 20) &&
                          h.root == load<int32_t>(p + 28) && h.compressor_hash == load<uint32_t>(p + 32) &&
                          h.step == load<uint64_t>(p + 36) && h.payload_bytes == load<uint64_t>(p + 44),
                      "numeric fields differ from the bytes");
  GRADCOMM_FUZZ_CHECK(h.compressor.size() <= WireHeader::kSpecBytes, "compressor of %zu bytes", h.compressor.size());
  for (size_t i = 0; i < h.compressor.size(); ++i) {
    const uint8_t c = p[52 + i];
    GRADCOMM_FUZZ_CHECK(c != 0, "compressor runs past its NUL");
    const char shown = c >= 0x20 && c <= 0x7E ? static_cast<char>(c) : '?';
    GRADCOMM_FUZZ_CHECK(h.compressor[i] == shown, "compressor byte %zu shown as 0x%02x", i,
                        static_cast<uint8_t>(h.compressor[i]));
  }
  check_line(h.describe(), 512, "describe()");
  GRADCOMM_FUZZ_CHECK(h.agrees_with(h), "a header disagrees with itself");

  const auto out = h.serialize();
  const auto again = WireHeader::parse(out.data(), out.size());
  GRADCOMM_FUZZ_CHECK(again.has_value(), "a parsed header does not parse after serialize");
  GRADCOMM_FUZZ_CHECK(again->agrees_with(h) && h.agrees_with(*again) && again->compressor == h.compressor &&
                          again->describe() == h.describe(),
                      "serialize -> parse changed the header");

  for (const WireHeader& mine : local_calls()) {
    GRADCOMM_FUZZ_CHECK(mine.agrees_with(h) == h.agrees_with(mine), "agrees_with is not symmetric");
    if (!h.agrees_with(mine)) {
      // As Op::check_header reports it.
      const std::string report = "mismatched collective calls: rank 0 called " + mine.describe() +
                                 "; rank 3 called " + h.describe();
      check_line(report, 1024, "mismatch report");
    }
  }
}

void fuzz_control(uint8_t flags, std::vector<uint8_t> bytes) {
  using namespace gradcomm::detail;
  if ((flags & 1) && bytes.size() >= 5) {
    const uint32_t magic = kControlMagic;
    std::memcpy(bytes.data(), &magic, 4);
    bytes[4] = kControlVersion;
  }
  if ((flags & 2) && bytes.size() >= kControlHeaderBytes) {
    const uint32_t text = static_cast<uint32_t>(bytes.size() - kControlHeaderBytes);
    std::memcpy(bytes.data() + 12, &text, 4);
  }
  const auto frame = decode_control(bytes);
  const uint8_t* p = bytes.data();
  const bool valid = bytes.size() >= kControlHeaderBytes && load<uint32_t>(p) == kControlMagic &&
                     p[4] == kControlVersion && p[5] >= 1 && p[5] <= 8 && p[6] <= 5 && p[7] == 0 &&
                     load<uint32_t>(p + 12) <= ControlMessage::kMaxText &&
                     bytes.size() == kControlHeaderBytes + load<uint32_t>(p + 12) &&
                     (p[6] == 0 || load<uint32_t>(p + 12) == 0);  // kinds 0-5 (abort .. release); only an abort has text
  GRADCOMM_FUZZ_CHECK(frame.has_value() == valid, "decode_control %s a message the reference %s",
                      frame ? "accepted" : "refused", valid ? "accepts" : "refuses");
  if (!frame) return;
  GRADCOMM_FUZZ_CHECK(static_cast<uint8_t>(frame->kind) == p[6], "decode_control read the wrong kind");
  const ControlMessage* message = &frame->message;
  GRADCOMM_FUZZ_CHECK(static_cast<uint8_t>(message->code) == p[5] && message->origin == load<int32_t>(p + 8) &&
                          message->seq == load<uint64_t>(p + 16) &&
                          frame->sender == load<int32_t>(p + 24) &&
                          message->text == std::string(reinterpret_cast<const char*>(p + 28), bytes.size() - 28),
                      "decoded fields differ from the bytes");
  // Raised as the error type its code names.
  try {
    gradcomm::throw_error(message->code, message->text);
  } catch (const gradcomm::Error& e) {
    GRADCOMM_FUZZ_CHECK(e.code() == message->code, "throw_error raised another code");
  }
  const auto again = decode_control(encode_control(*message, frame->kind, frame->sender));
  GRADCOMM_FUZZ_CHECK(again && again->kind == frame->kind && again->sender == frame->sender &&
                          again->message.code == message->code &&
                          again->message.origin == message->origin && again->message.seq == message->seq &&
                          again->message.text == message->text,
                      "encode -> decode changed the message");
}

void fuzz_gpu_records(uint8_t flags, const std::vector<uint8_t>& body) {
  using namespace gradcomm::detail;
  static const char* const kPreferences[] = {"auto", "ucx", "nccl", "NCCL"};
  const std::string preference = kPreferences[flags & 3];
  const size_t count = std::min<size_t>(body.size() / GpuRankRecord::kBytes, 16);
  std::vector<GpuRankRecord> records;
  for (size_t i = 0; i < count; ++i) {
    const std::span<const uint8_t> bytes(body.data() + i * GpuRankRecord::kBytes, GpuRankRecord::kBytes);
    const GpuRankRecord r = GpuRankRecord::parse(bytes);
    const auto out = r.serialize();
    GRADCOMM_FUZZ_CHECK(std::memcmp(out.data(), bytes.data(), out.size()) == 0, "record %zu does not round-trip", i);
    records.push_back(r);
  }
  if ((flags & 4) && records.size() >= 2) records.back().uuid = records.front().uuid;
  if (flags & 8) {
    const size_t cut = std::min(body.size(), GpuRankRecord::kBytes - 1);
    bool refused = false;
    try {
      GpuRankRecord::parse(std::span(body.data(), cut));
    } catch (const gradcomm::CorruptPayload& e) {
      refused = true;
      check_line(e.what(), 512, "record error");
    }
    GRADCOMM_FUZZ_CHECK(refused, "a %zu-byte record parsed", cut);
  }
  auto choose = [&]() -> std::optional<std::pair<GpuPath, std::string>> {
    try {
      const GpuPathChoice c = choose_gpu_path(preference, records);
      return std::pair{c.path, c.reason};
    } catch (const gradcomm::InvalidArgument& e) {
      GRADCOMM_FUZZ_CHECK(preference == "NCCL", "InvalidArgument for preference %s", preference.c_str());
      check_line(e.what(), 1024, "path error");
    } catch (const gradcomm::Unsupported& e) {
      GRADCOMM_FUZZ_CHECK(preference == "nccl", "Unsupported for preference %s", preference.c_str());
      check_line(e.what(), 1024, "path error");
    }
    return std::nullopt;
  };
  const auto first = choose();
  const auto second = choose();
  GRADCOMM_FUZZ_CHECK(first == second, "choose_gpu_path answered twice differently");
  if (first) check_line(first->second, 1024, "path reason");
}

void fuzz_block_sizes(uint8_t flags, ByteReader in) {
  std::vector<int64_t> sizes;
  while (!in.empty() && sizes.size() < 64) {
    int64_t v = in.take<int64_t>();
    if (flags & 1) v = static_cast<int64_t>(static_cast<uint64_t>(v) % ((uint64_t{1} << 41) + 256)) - 256;
    sizes.push_back(v);
  }
  int64_t total = -1;
  const auto problem = gradcomm::detail::check_block_sizes(sizes, total);
  bool valid = true;
  __int128 sum = 0;
  for (int64_t s : sizes) {
    if (s < 0 || s > gradcomm::detail::kMaxGatherBytes) valid = false;
    sum += s;
  }
  if (sum > gradcomm::detail::kMaxGatherBytes) valid = false;
  GRADCOMM_FUZZ_CHECK(problem.has_value() != valid, "check_block_sizes %s sizes the reference %s",
                      problem ? "refused" : "accepted", valid ? "accepts" : "refuses");
  if (problem) {
    check_line(*problem, 512, "block size error");
  } else {
    GRADCOMM_FUZZ_CHECK(total == static_cast<int64_t>(sum), "total %lld, expected %lld", static_cast<long long>(total),
                        static_cast<long long>(sum));
  }
}

void fuzz_sample_counts(ByteReader in) {
  const auto capacity = in.take<uint64_t>();
  const auto numel = in.take<int64_t>();
  const auto k = in.take<int64_t>();
  std::vector<uint64_t> counts;
  while (!in.empty() && counts.size() < 64) counts.push_back(in.take<uint64_t>());
  const auto problem = gradcomm::detail::check_sample_counts(counts, capacity, numel, k);
  bool valid = true;
  for (uint64_t c : counts) valid = valid && c <= capacity;
  GRADCOMM_FUZZ_CHECK(problem.has_value() != valid, "check_sample_counts %s counts the reference %s",
                      problem ? "refused" : "accepted", valid ? "accepts" : "refuses");
  if (problem) check_line(*problem, 512, "sample count error");
}

std::vector<uint8_t> input(uint8_t kind, uint8_t flags, const std::vector<uint8_t>& body) {
  std::vector<uint8_t> out{kind, flags};
  out.insert(out.end(), body.begin(), body.end());
  return out;
}

template <size_t N>
std::vector<uint8_t> vec(const std::array<uint8_t, N>& a) {
  return {a.begin(), a.end()};
}

}  // namespace

void write_seeds(gradcomm::fuzz::SeedWriter& seeds) {
  using namespace gradcomm::detail;
  int i = 0;
  for (const WireHeader& h : local_calls()) {
    seeds.add("header_" + std::to_string(i++), input(0, 0, vec(h.serialize())));
  }
  WireHeader long_spec;
  long_spec.op = OpKind::kAllreduce;
  long_spec.compressor = "sketch:rows=5,cols=1024,k=100,values=fp16,ef=1";  // cut to 32 bytes on the wire
  long_spec.numel = int64_t{1} << 40;
  long_spec.payload_bytes = ~uint64_t{0};
  auto bytes = vec(long_spec.serialize());
  seeds.add("header_long_spec", input(0, 0, bytes));
  bytes[60] = 0x07;  // a control character inside the spec text
  bytes[7] = 7;      // unknown dtype
  seeds.add("header_bad_dtype", input(0, 1, bytes));
  bytes.resize(80);
  seeds.add("header_short", input(0, 2, bytes));

  seeds.add("control_mismatch",
            input(1, 0, encode_control(ControlMessage{ErrorCode::kMismatch, 3, 17, "rank 3: allreduce #17: mismatch"})));
  seeds.add("control_empty_text", input(1, 0, encode_control(ControlMessage{ErrorCode::kTimeout, 0, 1, ""})));
  auto control = encode_control(ControlMessage{ErrorCode::kCuda, 65535, ~uint64_t{0}, std::string(40, 'x')});
  control[5] = 9;  // unknown code
  seeds.add("control_bad_code", input(1, 2, control));
  const ControlMessage liveness{ErrorCode::kPeerFailure, 1, 42, ""};
  seeds.add("control_ping", input(1, 0, encode_control(liveness, ControlKind::kPing, 1)));
  seeds.add("control_goodbye", input(1, 0, encode_control(liveness, ControlKind::kGoodbye, 2)));
  seeds.add("control_release", input(1, 0, encode_control(liveness, ControlKind::kRelease, 0)));

  std::vector<uint8_t> records;
  for (int r = 0; r < 3; ++r) {
    GpuRankRecord rec;
    for (size_t b = 0; b < rec.uuid.size(); ++b) rec.uuid[b] = static_cast<uint8_t>(r * 16 + b);
    rec.device = r;
    if (r == 0) rec.unique_id.fill(0xAB);
    const auto out = rec.serialize();
    records.insert(records.end(), out.begin(), out.end());
  }
  seeds.add("gpu_records_auto", input(2, 0, records));
  seeds.add("gpu_records_nccl_shared", input(2, 2 | 4, records));
  seeds.add("gpu_records_cut", input(2, 1 | 8, records));

  std::vector<uint8_t> sizes;
  for (int64_t s : {int64_t{96}, int64_t{0}, int64_t{1} << 20, int64_t{4000}}) put(sizes, s);
  seeds.add("block_sizes", input(3, 0, sizes));
  put(sizes, int64_t{-1});
  seeds.add("block_sizes_negative", input(3, 0, sizes));
  std::vector<uint8_t> huge;
  for (int s = 0; s < 3; ++s) put(huge, int64_t{1} << 39);
  seeds.add("block_sizes_total_over", input(3, 0, huge));

  std::vector<uint8_t> counts;
  put(counts, uint64_t{20});
  put(counts, int64_t{1000});
  put(counts, int64_t{10});
  for (uint64_t c : {10, 12, 20, 7}) put(counts, c);
  seeds.add("sample_counts", input(4, 0, counts));
  put(counts, uint64_t{21});
  seeds.add("sample_counts_over", input(4, 0, counts));
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ByteReader in(data, size);
  const uint8_t kind = in.take<uint8_t>();
  const uint8_t flags = in.take<uint8_t>();
  // Exact-size heap copy: ASan catches a read past the end.
  std::vector<uint8_t> body(in.rest(), in.rest() + in.remaining());
  switch (kind % 5) {
    case 0: fuzz_header(flags, std::move(body)); break;
    case 1: fuzz_control(flags, std::move(body)); break;
    case 2: fuzz_gpu_records(flags, body); break;
    case 3: fuzz_block_sizes(flags, in); break;
    default: fuzz_sample_counts(in); break;
  }
  return 0;
}
