// Fashion-MNIST loader: gzip (zlib's gzread) -> idx parse -> standardized floats.
#include "trainer/dataset.h"

#include <fmt/format.h>
#include <zlib.h>

#include <cmath>
#include <memory>

#include "gradcomm/errors.h"

namespace gradcomm::train {
namespace {

constexpr const char* kPackageHint =
    "Fashion-MNIST comes from the Debian package dataset-fashion-mnist (apt-get install dataset-fashion-mnist, "
    "or scripts/install-deps.sh), or pass --data DIR holding the four *-ubyte.gz files";
// A bound on what a legitimate file decompresses to (60000 x 784 bytes is 47 MB):
// a corrupt or hostile file cannot make us allocate without limit.
constexpr size_t kMaxDecompressed = size_t{256} << 20;

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw InvalidArgument(fmt::format("dataset: {}: {}. {}", path, what, kPackageHint));
}

uint32_t be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

}  // namespace

std::vector<uint8_t> read_gzip_file(const std::string& path) {
  struct Closer {
    void operator()(gzFile_s* f) const { gzclose(f); }
  };
  std::unique_ptr<gzFile_s, Closer> file(gzopen(path.c_str(), "rb"));
  if (!file) fail(path, fmt::format("cannot open ({})", std::strerror(errno)));
  std::vector<uint8_t> out;
  uint8_t chunk[1 << 16];
  while (true) {
    const int n = gzread(file.get(), chunk, sizeof chunk);
    if (n < 0) {
      int code = 0;
      const char* message = gzerror(file.get(), &code);
      fail(path, fmt::format("not a valid gzip stream after {} decompressed bytes ({})", out.size(), message));
    }
    if (n == 0) break;
    out.insert(out.end(), chunk, chunk + n);
    if (out.size() > kMaxDecompressed) fail(path, fmt::format("decompresses to more than {} bytes", kMaxDecompressed));
  }
  // gzread stops quietly at a truncated stream's end; gzerror says whether it was clean.
  int code = 0;
  const char* message = gzerror(file.get(), &code);
  if (code != Z_OK && code != Z_STREAM_END) fail(path, fmt::format("gzip error ({})", message));
  return out;
}

std::vector<uint8_t> parse_idx(const std::vector<uint8_t>& bytes, const std::string& path, int dims,
                               std::vector<uint32_t>& shape) {
  const size_t header = 4 + 4 * static_cast<size_t>(dims);
  if (bytes.size() < header) {
    fail(path, fmt::format("idx file has {} bytes, fewer than its {}-byte header", bytes.size(), header));
  }
  const uint32_t magic = be32(bytes.data());
  const uint32_t expected = 0x0800u | static_cast<uint32_t>(dims);  // unsigned byte, `dims` dimensions
  if (magic != expected) fail(path, fmt::format("idx magic 0x{:08x}, expected 0x{:08x}", magic, expected));
  shape.assign(dims, 0);
  uint64_t payload = 1;
  for (int d = 0; d < dims; ++d) {
    shape[d] = be32(bytes.data() + 4 + 4 * d);
    payload *= shape[d];
    if (payload > kMaxDecompressed) fail(path, "idx shape claims more data than any Fashion-MNIST file holds");
  }
  if (bytes.size() - header != payload) {
    fail(path, fmt::format("idx header promises {} data bytes, the file holds {} (truncated or corrupt)", payload,
                           bytes.size() - header));
  }
  return std::vector<uint8_t>(bytes.begin() + static_cast<std::ptrdiff_t>(header), bytes.end());
}

namespace {

// One split: images (N, 28, 28) and labels (N) that must agree on N.
Dataset load_split(const std::string& dir, const char* prefix, int64_t limit) {
  const std::string image_path = fmt::format("{}/{}-images-idx3-ubyte.gz", dir, prefix);
  const std::string label_path = fmt::format("{}/{}-labels-idx1-ubyte.gz", dir, prefix);
  std::vector<uint32_t> ishape, lshape;
  const std::vector<uint8_t> pixels = parse_idx(read_gzip_file(image_path), image_path, 3, ishape);
  const std::vector<uint8_t> labels = parse_idx(read_gzip_file(label_path), label_path, 1, lshape);
  if (ishape[1] != 28 || ishape[2] != 28) {
    fail(image_path, fmt::format("images are {}x{}, expected 28x28", ishape[1], ishape[2]));
  }
  if (ishape[0] != lshape[0]) {
    fail(label_path, fmt::format("{} labels for {} images in {}", lshape[0], ishape[0], image_path));
  }
  Dataset d;
  d.count = ishape[0];
  if (limit > 0 && limit < d.count) d.count = limit;
  d.labels.assign(labels.begin(), labels.begin() + d.count);
  for (int64_t i = 0; i < d.count; ++i) {
    if (d.labels[i] >= kClasses) fail(label_path, fmt::format("label {} at index {} is not a class 0..9", d.labels[i], i));
  }
  d.images.resize(static_cast<size_t>(d.count) * kImagePixels);
  for (size_t i = 0; i < d.images.size(); ++i) d.images[i] = static_cast<float>(pixels[i]) / 255.0f;
  return d;
}

}  // namespace

FashionMnist load_fashion_mnist(const std::string& dir, int64_t limit_train, int64_t limit_test) {
  FashionMnist data{load_split(dir, "train", limit_train), load_split(dir, "t10k", limit_test)};
  if (data.train.count == 0 || data.test.count == 0) {
    fail(dir, fmt::format("empty split ({} training, {} test examples)", data.train.count, data.test.count));
  }
  // Standardize with the training set's statistics (one scalar mean and std, in
  // double so the result does not depend on summation order subtleties).
  double sum = 0, sq = 0;
  for (float v : data.train.images) {
    sum += v;
    sq += static_cast<double>(v) * v;
  }
  const double n = static_cast<double>(data.train.images.size());
  const double mean = sum / n;
  const double stddev = std::sqrt(std::max(sq / n - mean * mean, 1e-12));
  for (Dataset* d : {&data.train, &data.test}) {
    for (float& v : d->images) v = static_cast<float>((v - mean) / stddev);
  }
  return data;
}

}  // namespace gradcomm::train
