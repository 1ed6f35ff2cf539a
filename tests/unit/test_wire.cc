// The wire header's round trip, and how it shows a peer's spec that did not fit.
#include <gtest/gtest.h>

#include <string>

#include "wire.h"

namespace gradcomm::detail {
namespace {

WireHeader round_trip(const WireHeader& h) {
  const auto bytes = h.serialize();
  auto parsed = WireHeader::parse(bytes.data(), bytes.size());
  EXPECT_TRUE(parsed.has_value());
  return parsed.value_or(WireHeader{});
}

TEST(WireHeader, ShortSpecRoundTripsWhole) {
  WireHeader h;
  h.op = OpKind::kAllreduce;
  h.compressor = "topk:ratio=0.01";
  h.compressor_hash = fnv1a32(h.compressor);
  const WireHeader back = round_trip(h);
  EXPECT_EQ(back.compressor, "topk:ratio=0.01");
  EXPECT_TRUE(back.agrees_with(h));
}

TEST(WireHeader, SpecThatFillsTheFieldIsNotCut) {
  for (size_t n : {WireHeader::kSpecBytes - 1, WireHeader::kSpecBytes}) {
    WireHeader h;
    h.compressor = "topk:ratio=0.5," + std::string(n - 15, 'a');
    h.compressor_hash = fnv1a32(h.compressor);  // as the engine sets it
    EXPECT_EQ(round_trip(h).compressor, h.compressor) << n;
    EXPECT_EQ(round_trip(h).shown_compressor(), h.compressor) << n;
  }
}

TEST(WireHeader, LongSpecIsCutAtAKeyBoundaryAndSaysSo) {
  WireHeader h;
  h.op = OpKind::kAllreduce;
  h.compressor = "topk:ratio=0.01,algo=allgather,values=fp16,select=exact";  // 55 bytes
  h.compressor_hash = fnv1a32(h.compressor);
  const WireHeader back = round_trip(h);
  const std::string shown = back.shown_compressor();
  EXPECT_EQ(back.compressor, h.compressor.substr(0, WireHeader::kSpecBytes));  // the field as it is
  EXPECT_NE(back.describe().find(shown), std::string::npos) << back.describe();
  // The first 32 bytes are "topk:ratio=0.01,algo=allgather,v": shown up to "...allgather,".
  EXPECT_EQ(shown.rfind("topk:ratio=0.01,algo=allgather,...", 0), 0u) << shown;
  EXPECT_NE(shown.find("longer than the 32 bytes"), std::string::npos) << shown;
  EXPECT_EQ(shown.find(",v..."), std::string::npos) << shown;  // no half key
}

TEST(WireHeader, LongSpecWithoutSeparatorShowsNoFragment) {
  WireHeader h;
  h.compressor = std::string(40, 'x');
  h.compressor_hash = fnv1a32(h.compressor);
  const std::string shown = round_trip(h).shown_compressor();
  EXPECT_EQ(shown.rfind("... (cut", 0), 0u) << shown;
}

// Issue 42, item 6: two calls that describe alike (a dense call of keys at different
// steps, say) are told apart by the fields that differ.
TEST(WireHeader, DifferencesNameTheFieldsDescribeLeavesOut) {
  WireHeader a;
  a.op = OpKind::kAllreduce;
  a.dtype = DType::kFloat32;
  a.seq = 17;
  a.numel = 65536;
  a.step = 5;
  WireHeader b = a;
  b.step = 4;
  EXPECT_EQ(a.describe(), b.describe());  // the case the message must still tell apart
  EXPECT_EQ(a.differences(b), "step 5 against 4");
  b.payload_bytes = 2048;
  EXPECT_EQ(a.differences(b), "step 5 against 4, payload_bytes 0 against 2048");
  EXPECT_EQ(a.differences(a), "");
  WireHeader c = a;
  c.numel = 65537;
  c.dtype = DType::kFloat16;
  EXPECT_EQ(a.differences(c), "dtype float32 against float16, numel 65536 against 65537");
}

}  // namespace
}  // namespace gradcomm::detail
