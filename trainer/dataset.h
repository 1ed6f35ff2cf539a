// Fashion-MNIST from Debian's dataset-fashion-mnist package: the four idx files,
// gzipped, read with zlib into normalized float images and byte labels.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gradcomm::train {

constexpr const char* kDefaultDataDir = "/usr/share/datasets/fashion-mnist";
constexpr int kImagePixels = 28 * 28;
constexpr int kClasses = 10;

struct Dataset {
  int64_t count = 0;
  std::vector<float> images;    // (count, 784), standardized with the training set's mean and std
  std::vector<uint8_t> labels;  // (count), 0..9
};

struct FashionMnist {
  Dataset train, test;
};

// Reads DIR/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz. A missing, truncated
// or malformed file throws gradcomm::InvalidArgument naming the file, what is
// wrong, and the Debian package that provides the files (dataset-fashion-mnist).
// `limit_train` / `limit_test` > 0 keep only the first N examples (small tests).
FashionMnist load_fashion_mnist(const std::string& dir, int64_t limit_train = 0, int64_t limit_test = 0);

// The lower-level readers, exposed for tests: the decompressed bytes of a gzip
// file, and the parse of an idx buffer (magic 0x0803 images / 0x0801 labels).
std::vector<uint8_t> read_gzip_file(const std::string& path);
std::vector<uint8_t> parse_idx(const std::vector<uint8_t>& bytes, const std::string& path, int dims,
                               std::vector<uint32_t>& shape);

}  // namespace gradcomm::train
