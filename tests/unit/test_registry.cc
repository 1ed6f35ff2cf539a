// The compressor registry: every compressor's keys and defaults, every class of
// bad spec (with a message naming the spec, the problem and what is accepted), and
// canonical() as the identity ranks compare.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "compressors/spec.h"
#include "compressors/quantize/quantize.h"
#include "compressors/sparse/sparse.h"
#include "compressors/randomk/randomk.h"
#include "compressors/sign/sign.h"
#include "compressors/sketch/sketch.h"
#include "compressors/topk/topk.h"
#include "gradcomm/errors.h"

namespace gradcomm::detail {
namespace {

// Field-by-field equality of the common keys (CompressorSpec has no operator==), and
// whether both hold a family block.
void expect_same(const CompressorSpec& a, const CompressorSpec& b, const std::string& context) {
  EXPECT_EQ(a.id, b.id) << context;
  EXPECT_EQ(a.ef, b.ef) << context;
  EXPECT_EQ(a.min_numel, b.min_numel) << context;
  EXPECT_EQ(a.warmup, b.warmup) << context;
  EXPECT_EQ(a.seed, b.seed) << context;
  EXPECT_EQ(a.values, b.values) << context;
  EXPECT_EQ(a.compress_inside, b.compress_inside) << context;
  EXPECT_EQ(a.params == nullptr, b.params == nullptr) << context;
}

// The InvalidArgument message for `spec`; fails the test when it parses.
std::string error_of(const std::string& spec) {
  try {
    const CompressorSpec s = parse_compressor_spec(spec);
    ADD_FAILURE() << "'" << spec << "' parsed as " << s.canonical();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return {};
}

// Every message quotes the spec, then each fragment in turn.
void expect_error(const std::string& spec, const std::vector<std::string>& fragments) {
  const std::string message = error_of(spec);
  EXPECT_NE(message.find("'" + spec + "'"), std::string::npos) << "message does not quote the spec: " << message;
  for (const auto& f : fragments) EXPECT_NE(message.find(f), std::string::npos) << "'" << f << "' not in: " << message;
}

TEST(Registry, NoneTakesNoKeys) {
  const CompressorSpec s = parse_compressor_spec("none");
  expect_same(s, CompressorSpec{}, "none");
  EXPECT_EQ(s.canonical(), "none");
  expect_error("none:ef=1", {"none takes no keys"});
  expect_error("none:", {"none takes no keys"});
}

TEST(Registry, CastsTakeCommonKeysWithEfOff) {
  for (const auto* name : {"fp16", "bf16"}) {
    const CompressorSpec s = parse_compressor_spec(name);
    EXPECT_EQ(s.id, std::string(name) == "fp16" ? CompressorId::kFp16 : CompressorId::kBf16);
    EXPECT_FALSE(s.ef);
    EXPECT_EQ(s.canonical(), std::string(name) + ":ef=0,min_numel=0,warmup=0,seed=0");
    const CompressorSpec t = parse_compressor_spec(std::string(name) +
                                                   ":seed=18446744073709551615,warmup=3,"
                                                   "min_numel=1000,ef=1");
    EXPECT_TRUE(t.ef);
    EXPECT_EQ(t.min_numel, 1000);
    EXPECT_EQ(t.warmup, 3);
    EXPECT_EQ(t.seed, 18446744073709551615ull);
    expect_error(std::string(name) + ":values=fp16", {"unknown key 'values'", "accepted: ef, min_numel, warmup, seed"});
  }
}

TEST(Registry, TopkRatioOrKWithDefaults) {
  const CompressorSpec r = parse_compressor_spec("topk:ratio=0.01");
  EXPECT_EQ(r.id, CompressorId::kTopk);
  EXPECT_EQ(r.family<TopkParams>().ratio, 0.01);
  EXPECT_EQ(r.family<TopkParams>().k, 0);
  EXPECT_EQ(r.family<TopkParams>().select, TopkSelect::kExact);
  EXPECT_TRUE(r.ef);
  EXPECT_EQ(r.values, ValueType::kBf16);  // top-k's default; random-k and the sketch keep fp32
  EXPECT_TRUE(r.family<TopkParams>().coded_indices);
  EXPECT_EQ(r.family<TopkParams>().algo, SparseAlgo::kAuto);
  EXPECT_EQ(r.canonical(),
            "topk:ratio=0.01,select=exact,indices=coded,algo=auto,ef=1,min_numel=0,warmup=0,seed=0,values=bf16");

  const CompressorSpec k =
      parse_compressor_spec("topk:k=10,select=sample,ef=0,values=fp16,min_numel=5,warmup=2,seed=9");
  EXPECT_EQ(k.family<TopkParams>().k, 10);
  EXPECT_EQ(k.family<TopkParams>().ratio, 0.0);
  EXPECT_EQ(k.family<TopkParams>().select, TopkSelect::kSample);
  EXPECT_FALSE(k.ef);
  EXPECT_EQ(k.values, ValueType::kFp16);
  EXPECT_EQ(k.canonical(),
            "topk:k=10,select=sample,indices=coded,algo=auto,ef=0,min_numel=5,warmup=2,seed=9,values=fp16");
  const CompressorSpec raw = parse_compressor_spec("topk:ratio=0.1,indices=raw,algo=reduce_scatter,values=fp32");
  EXPECT_FALSE(raw.family<TopkParams>().coded_indices);
  EXPECT_EQ(raw.family<TopkParams>().algo, SparseAlgo::kReduceScatter);
  EXPECT_EQ(raw.values, ValueType::kFp32);
  EXPECT_EQ(raw.canonical(),
            "topk:ratio=0.1,select=exact,indices=raw,algo=reduce_scatter,ef=1,min_numel=0,warmup=0,seed=0,values=fp32");
  EXPECT_EQ(parse_compressor_spec("topk:ratio=0.1,algo=allgather").family<TopkParams>().algo, SparseAlgo::kAllgather);
  EXPECT_EQ(parse_compressor_spec("randomk:ratio=0.1,values=bf16").values, ValueType::kBf16);
  expect_error("topk:ratio=0.1,algo=ring", {"algo='ring' unknown", "accepted: auto, allgather, reduce_scatter"});
  expect_error("topk:ratio=0.1,indices=delta", {"indices='delta' unknown", "accepted: coded, raw"});
  expect_error("topk:ratio=0.1,values=fp8", {"values='fp8' unknown", "accepted: fp32, fp16, bf16"});
  expect_error("randomk:ratio=0.1,algo=allgather", {"unknown key 'algo'"});
  EXPECT_EQ(parse_compressor_spec("topk:ratio=1").family<TopkParams>().ratio, 1.0);
  EXPECT_EQ(parse_compressor_spec("topk:ratio=1e-3").family<TopkParams>().ratio, 1e-3);
}

TEST(Registry, TopkNeedsExactlyOneOfRatioAndK) {
  expect_error("topk", {"one of ratio=R", "k=K", "required"});
  expect_error("topk:select=exact", {"one of ratio=R", "required"});
  expect_error("topk:ratio=0.1,k=5", {"give ratio or k, not both"});
}

TEST(Registry, RandomkRequiresRatio) {
  const CompressorSpec s = parse_compressor_spec("randomk:ratio=0.25");
  EXPECT_EQ(s.id, CompressorId::kRandomk);
  EXPECT_EQ(s.family<RandomkParams>().ratio, 0.25);
  EXPECT_TRUE(s.ef);
  EXPECT_EQ(s.canonical(), "randomk:ratio=0.25,ef=1,min_numel=0,warmup=0,seed=0,values=fp32");
  expect_error("randomk", {"'ratio' is required"});
  expect_error("randomk:k=5", {"unknown key 'k'", "accepted: ratio, ef, min_numel, warmup, seed, values"});
}

TEST(Registry, QsgdLevelsAndBucket) {
  const CompressorSpec d = parse_compressor_spec("qsgd");
  EXPECT_EQ(d.family<QsgdParams>().levels, 16);
  EXPECT_EQ(d.family<QsgdParams>().bucket, 512);
  EXPECT_FALSE(d.ef);
  EXPECT_EQ(d.canonical(), "qsgd:levels=16,bucket=512,ef=0,min_numel=0,warmup=0,seed=0");
  EXPECT_EQ(parse_compressor_spec("qsgd:levels=1").family<QsgdParams>().levels, 1);
  EXPECT_EQ(parse_compressor_spec("qsgd:levels=32768,bucket=1").family<QsgdParams>().levels, 32768);
  expect_error("qsgd:levels=0", {"levels='0' is out of range", "[1, 32768]"});
  expect_error("qsgd:levels=32769", {"out of range"});
  expect_error("qsgd:bucket=0", {"bucket='0' is out of range", "[1, 2147483647]"});
}

TEST(Registry, QuantBitsBucketRound) {
  const CompressorSpec d = parse_compressor_spec("quant");
  EXPECT_EQ(d.family<QuantParams>().bits, 8);
  EXPECT_EQ(d.family<QuantParams>().bucket, 512);
  EXPECT_EQ(d.family<QuantParams>().round, Rounding::kStochastic);
  EXPECT_FALSE(d.ef);
  EXPECT_EQ(d.canonical(), "quant:bits=8,bucket=512,round=stochastic,ef=0,min_numel=0,warmup=0,seed=0");
  for (int bits : {1, 2, 4, 8}) EXPECT_EQ(parse_compressor_spec("quant:bits=" + std::to_string(bits)).family<QuantParams>().bits, bits);
  EXPECT_EQ(parse_compressor_spec("quant:round=nearest,bucket=64").family<QuantParams>().round, Rounding::kNearest);
  expect_error("quant:bits=3", {"bits='3' unknown", "accepted: 1, 2, 4, 8"});
  expect_error("quant:round=up", {"round='up' unknown", "accepted: stochastic, nearest"});
}

TEST(Registry, SignBucketWithEfOn) {
  const CompressorSpec d = parse_compressor_spec("sign");
  EXPECT_EQ(d.family<SignParams>().bucket, 512);
  EXPECT_TRUE(d.ef);
  EXPECT_EQ(d.canonical(), "sign:bucket=512,ef=1,min_numel=0,warmup=0,seed=0");
  EXPECT_EQ(parse_compressor_spec("sign:bucket=1024,ef=0").family<SignParams>().bucket, 1024);
}

TEST(Registry, SketchRowsColsAndHeavyHitters) {
  const CompressorSpec d = parse_compressor_spec("sketch:k=100");
  EXPECT_EQ(d.family<SketchParams>().rows, 5);
  EXPECT_EQ(d.family<SketchParams>().cols, 0);
  EXPECT_EQ(d.family<SketchParams>().k, 100);
  EXPECT_TRUE(d.ef);
  EXPECT_EQ(d.canonical(), "sketch:rows=5,cols=0,k=100,ef=1,min_numel=0,warmup=0,seed=0,values=fp32");
  const CompressorSpec r = parse_compressor_spec("sketch:ratio=0.001,rows=64,cols=16,values=fp16");
  EXPECT_EQ(r.family<SketchParams>().ratio, 0.001);
  EXPECT_EQ(r.family<SketchParams>().rows, 64);
  EXPECT_EQ(r.family<SketchParams>().cols, 16);
  EXPECT_EQ(r.canonical(), "sketch:rows=64,cols=16,ratio=0.001,ef=1,min_numel=0,warmup=0,seed=0,values=fp16");
  EXPECT_EQ(parse_compressor_spec("sketch:k=1,cols=0").family<SketchParams>().cols, 0);
  expect_error("sketch", {"one of ratio=R", "required"});
  expect_error("sketch:k=1,ratio=0.5", {"not both"});
  expect_error("sketch:k=1,rows=0", {"rows='0' is out of range", "[1, 64]"});
  expect_error("sketch:k=1,rows=65", {"out of range"});
  expect_error("sketch:k=1,cols=15", {"cols='15' is out of range", "[16, "});
}

TEST(Registry, UnknownCompressorListsAccepted) {
  expect_error("topkk",
               {"compressor 'topkk' unknown", "accepted: none, fp16, bf16, topk, randomk, qsgd, quant, sign, sketch, powersgd"});
  expect_error("TOPK:ratio=0.1", {"compressor 'TOPK' unknown"});
  expect_error(":ratio=0.1", {"compressor '' unknown"});
  EXPECT_NE(error_of("").find("empty spec"), std::string::npos);
}

TEST(Registry, UnknownKeyListsAccepted) {
  expect_error("topk:ratoi=0.1",
               {"topk: unknown key 'ratoi'",
                "accepted: ratio, k, select, indices, algo, ef, min_numel, warmup, seed, values"});
  expect_error("qsgd:values=fp16", {"unknown key 'values'", "accepted: levels, bucket, ef, min_numel, warmup, seed"});
  expect_error("sign:bits=1", {"unknown key 'bits'", "accepted: bucket, ef, min_numel, warmup, seed"});
}

TEST(Registry, MalformedListsAreRejected) {
  expect_error("topk:", {"nothing after ':'"});
  expect_error("topk:ratio=0.1,", {"stray ','"});
  expect_error("topk:,ratio=0.1", {"stray ','"});
  expect_error("topk:ratio=0.1,,ef=1", {"stray ','"});
  expect_error("topk:ratio", {"'ratio' is not key=value"});
  expect_error("topk:ratio=", {"'ratio' has an empty value"});
  expect_error("topk:ratio=0.1:ef=1", {"ratio='0.1:ef=1' is not a finite number"});
  expect_error("topk:ratio==0.1", {"ratio='=0.1'"});
  expect_error("topk:ratio=0.1, ef=1", {"whitespace at offset 15"});
  expect_error(" topk:ratio=0.1", {"whitespace at offset 0"});
  EXPECT_NE(error_of("topk:ratio=0.1\n").find("whitespace at offset 14"), std::string::npos);
}

TEST(Registry, DuplicateKeysAreRejected) {
  expect_error("topk:k=1,k=1", {"key 'k' given twice"});
  expect_error("quant:bits=8,bucket=4,bits=4", {"key 'bits' given twice"});
}

TEST(Registry, BadNumbersAreRejected) {
  for (const char* bad : {"abc", "0.1x", "nan", "NaN", "inf", "-inf", "0x0.1p0", "+0.5", "1e"}) {
    expect_error(std::string("topk:ratio=") + bad, {"is not a finite number", "accepted: a number in (0, 1]"});
  }
  for (const char* bad : {"0", "-0.1", "1.0000001", "2", "1e400", "-0"}) {
    const std::string message = error_of(std::string("topk:ratio=") + bad);
    EXPECT_NE(message.find("ratio='" + std::string(bad) + "'"), std::string::npos) << message;
  }
  for (const char* bad : {"abc", "10x", "1.5", "1e3", "0x10", "+5", "--1"}) {
    const std::string message = error_of(std::string("topk:k=") + bad);
    EXPECT_NE(message.find("accepted: an integer in [1, 9223372036854775807]"), std::string::npos) << message;
  }
  expect_error("topk:k=0", {"k='0' is out of range"});
  expect_error("topk:k=-3", {"k='-3' is out of range"});
  expect_error("topk:k=9223372036854775808", {"is out of range"});
  expect_error("fp16:min_numel=-1", {"min_numel='-1' is out of range", "[0, 9223372036854775807]"});
  expect_error("fp16:warmup=x", {"warmup='x' is not a decimal integer"});
  expect_error("fp16:seed=18446744073709551616", {"seed='18446744073709551616' is out of range"});
  expect_error("fp16:seed=-1", {"seed='-1' is not a decimal integer", "[0, 18446744073709551615]"});
  expect_error("fp16:ef=2", {"ef='2' unknown", "accepted: 0, 1"});
  expect_error("fp16:ef=true", {"ef='true' unknown"});
  expect_error("topk:k=1,select=fast", {"select='fast' unknown", "accepted: exact, sample"});
  expect_error("topk:k=1,values=fp8", {"values='fp8' unknown", "accepted: fp32, fp16, bf16"});
}

TEST(Registry, ControlBytesInSpecsAreEscapedInMessages) {
  const std::string spec("topk:k=1\x01", 9);
  const std::string message = error_of(spec);
  EXPECT_NE(message.find("\\x01"), std::string::npos) << message;
  EXPECT_EQ(message.find('\x01'), std::string::npos);
}

TEST(Registry, LongSpecsAreCutInMessages) {
  const std::string message = error_of("topk:" + std::string(5000, '\x7f') + "=1");
  EXPECT_LT(message.size(), 512u) << message;
  EXPECT_NE(message.find("(5007 bytes)"), std::string::npos) << message;
}

TEST(Registry, KeyOrderDoesNotChangeCanonical) {
  EXPECT_EQ(parse_compressor_spec("topk:k=10,select=exact").canonical(),
            parse_compressor_spec("topk:select=exact,k=10").canonical());
  EXPECT_EQ(parse_compressor_spec("quant:round=nearest,bits=4,seed=3").canonical(),
            parse_compressor_spec("quant:seed=3,bits=4,round=nearest").canonical());
  // Spelling a default out is the same spec as leaving it implicit.
  EXPECT_EQ(parse_compressor_spec("topk:ratio=0.01").canonical(),
            parse_compressor_spec("topk:ratio=0.010,select=exact,indices=coded,ef=1,values=bf16").canonical());
  EXPECT_NE(parse_compressor_spec("topk:k=10").canonical(), parse_compressor_spec("topk:k=11").canonical());
}

TEST(Registry, CanonicalRoundTripsForEveryCompressor) {
  const char* specs[] = {
      "none",
      "fp16",
      "bf16:ef=1,min_numel=1024,warmup=10,seed=18446744073709551615",
      "topk:ratio=0.01",
      "topk:ratio=0.1",
      "topk:ratio=0.3333333333333333",
      "topk:ratio=1e-300",
      "topk:ratio=0.9999999999999999",
      "topk:k=9223372036854775807,select=sample,values=fp16",
      "topk:ratio=0.5,indices=raw,algo=reduce_scatter,values=fp32",
      "topk:ratio=0.5,algo=allgather",
      "randomk:ratio=0.123456789012345678",
      "randomk:ratio=0.5,values=bf16",
      "qsgd:levels=32768,bucket=2147483647",
      "quant:bits=1,round=nearest",
      "sign:bucket=1,ef=0",
      "sketch:k=5,rows=1,cols=16777216",
      "sketch:ratio=0.5,cols=16",
  };
  for (const char* spec : specs) {
    const CompressorSpec s = parse_compressor_spec(spec);
    const std::string canonical = s.canonical();
    const CompressorSpec again = parse_compressor_spec(canonical);
    expect_same(again, s, std::string(spec) + " -> " + canonical);
    EXPECT_EQ(again.canonical(), canonical) << spec;
  }
}

}  // namespace
}  // namespace gradcomm::detail
