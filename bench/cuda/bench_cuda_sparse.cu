// bench_cuda_sparse: CUDA-event timings of the sparse compressors' GPU layer
// (compressors/sparse/gpu_sparse.h) on fp32 gradients of 1M, 16M and 128M elements
// (or a given raw float32 file): top-k exact and sample at ratio 0.01 / 0.001,
// random-k 0.01 (indices + gather), count-sketch accumulate and heavy-hitter recovery,
// and the sparse payload's decode-add. Each case: warm-up runs (workspaces grown),
// then timed runs, the median reported with
//   eff GB/s  = bytes the operation must at least touch / time
//   of copy   = eff GB/s / the D2D cudaMemcpy bandwidth measured in the same run
//               (read + write bytes / time), i.e. how close to a memory-bound pass.
// Without a GPU it prints "no CUDA device" and exits 0.
//
//   bench_cuda_sparse [--sizes 1M,16M,128M] [--input FILE] [--iters 20] [--warmup 5]
//                     [--rows 5] [--json FILE]
#include <cuda_runtime_api.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "compressors/codec.h"
#include "compressors/sparse/gpu_sparse.h"
#include "compressors/randomk/gpu_randomk.h"
#include "compressors/sketch/gpu_sketch.h"
#include "compressors/sparse/sparse.h"
#include "cuda/buffer.h"
#include "cuda/check.h"
#include "cuda/device.h"
#include "cuda/device_status.h"

namespace gc = gradcomm::detail;

namespace {

int64_t parse_size(const std::string& s) {
  const char unit = s.empty() ? '\0' : s.back();
  const int64_t mult = unit == 'K' ? 1024 : unit == 'M' ? 1024 * 1024 : unit == 'G' ? int64_t{1} << 30 : 1;
  return std::stoll(mult == 1 ? s : s.substr(0, s.size() - 1)) * mult;
}

// Median milliseconds of `iters` runs of fn on `stream`, after `warmup` runs.
double time_ms(const std::function<void()>& fn, cudaStream_t stream, int warmup, int iters) {
  for (int i = 0; i < warmup; ++i) fn();
  GRADCOMM_CUDA_CHECK(cudaStreamSynchronize(stream));
  gc::Event start(cudaEventDefault), stop(cudaEventDefault);
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    start.record(stream);
    fn();
    stop.record(stream);
    stop.synchronize();
    ms.push_back(stop.elapsed_ms_since(start));
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

struct Row {
  std::string op;
  int64_t n;
  double ratio;
  double ms;
  double bytes;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"CUDA sparse compressor benchmark (topk, randomk, sketch, decode-add)"};
  std::string sizes_arg = "1M,16M,128M", input, json_path;
  int iters = 20, warmup = 5, rows = 5;
  app.add_option("--sizes", sizes_arg, "comma-separated element counts (K/M/G suffixes)");
  app.add_option("--input", input, "raw float32 file to use as the gradient (overrides --sizes)");
  app.add_option("--iters", iters, "timed runs per case (median reported)")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "untimed runs per case")->check(CLI::NonNegativeNumber);
  app.add_option("--rows", rows, "count-sketch rows")->check(CLI::Range(1, 64));
  app.add_option("--json", json_path, "write the results as JSON");
  CLI11_PARSE(app, argc, argv);

  if (gc::cuda_device_count() == 0) {
    std::printf("no CUDA device: %s\n", gc::cuda_unavailable_reason());
    return 0;
  }
  try {
    std::vector<std::vector<float>> inputs;
    if (!input.empty()) {
      std::ifstream f(input, std::ios::binary | std::ios::ate);
      if (!f) throw std::runtime_error("cannot open --input " + input);
      const auto bytes = static_cast<int64_t>(f.tellg());
      if (bytes <= 0 || bytes % 4 != 0) throw std::runtime_error(input + ": size is not a positive multiple of 4");
      std::vector<float> x(static_cast<size_t>(bytes / 4));
      f.seekg(0);
      f.read(reinterpret_cast<char*>(x.data()), bytes);
      inputs.push_back(std::move(x));
    } else {
      std::mt19937_64 gen(42);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      size_t at = 0;
      while (at <= sizes_arg.size()) {
        const size_t comma = std::min(sizes_arg.find(',', at), sizes_arg.size());
        std::vector<float> x(static_cast<size_t>(parse_size(sizes_arg.substr(at, comma - at))));
        for (auto& v : x) v = normal(gen);
        inputs.push_back(std::move(x));
        at = comma + 1;
      }
    }

    cudaDeviceProp prop{};
    GRADCOMM_CUDA_CHECK(cudaGetDeviceProperties(&prop, gc::cuda_current_device()));
    std::printf("# device: %s\n", prop.name);
    std::printf("# eff GB/s = minimum bytes touched / median time; of copy = eff GB/s / D2D memcpy GB/s\n");
    std::printf("%-26s %12s %8s %10s %10s %8s\n", "op", "n", "ratio", "ms", "eff GB/s", "of copy");

    gc::Stream stream_owner;
    const cudaStream_t stream = stream_owner.get();
    nlohmann::json out = nlohmann::json::array();
    for (const std::vector<float>& host : inputs) {
      const auto n = static_cast<int64_t>(host.size());
      const double nbytes = 4.0 * static_cast<double>(n);
      gc::DeviceBuffer grad(host.size() * 4), scratch(host.size() * 4), residual(host.size() * 4);
      GRADCOMM_CUDA_CHECK(cudaMemcpy(grad.data(), host.data(), host.size() * 4, cudaMemcpyHostToDevice));
      GRADCOMM_CUDA_CHECK(cudaMemset(residual.data(), 0, host.size() * 4));

      const double copy_ms = time_ms(
          [&] { GRADCOMM_CUDA_CHECK(cudaMemcpyAsync(scratch.data(), grad.data(), host.size() * 4, cudaMemcpyDeviceToDevice, stream)); },
          stream, warmup, iters);
      const double copy_gbps = 2.0 * nbytes / copy_ms / 1e6;
      std::vector<Row> rows_out;
      rows_out.push_back({"d2d copy (read+write)", n, 0.0, copy_ms, 2.0 * nbytes});

      gc::GpuSparseWorkspace ws;
      const gc::PhiloxStream rng{1, 2};
      for (double ratio : {0.01, 0.001}) {
        const int64_t k = std::max<int64_t>(1, static_cast<int64_t>(ratio * static_cast<double>(n)));
        for (auto [mode, name] : {std::pair{gradcomm::detail::TopkSelect::kExact, "topk exact"},
                                  std::pair{gradcomm::detail::TopkSelect::kSample, "topk sample"}}) {
          const double ms = time_ms([&] { gc::gpu_topk_select(grad.as<float>(), nullptr, n, k, mode, rng, gc::ValueType::kBf16, ws, stream); },
                                    stream, warmup, iters);
          rows_out.push_back({name, n, ratio, ms, nbytes});
        }
        const double ms_ef = time_ms(
            [&] { gc::gpu_topk_select(grad.as<float>(), residual.as<float>(), n, k, gc::TopkSelect::kExact, rng,
                                gc::ValueType::kBf16, ws, stream); },
            stream, warmup, iters);
        rows_out.push_back({"topk exact + EF", n, ratio, ms_ef, 3.0 * nbytes});
      }
      {
        const int64_t k = std::max<int64_t>(1, n / 100);
        gc::DeviceBuffer values(static_cast<size_t>(k) * 4);
        const double ms = time_ms(
            [&] {
              gc::gpu_randomk_indices(n, k, rng, ws, stream);
              gc::gpu_gather(grad.as<float>(), ws.indices(), ws.count(), ws.capacity(), values.as<float>(), nullptr,
                             gc::ValueType::kFp32, stream);
            },
            stream, warmup, iters);
        rows_out.push_back({"randomk (indices+gather)", n, 0.01, ms, 12.0 * static_cast<double>(k)});
      }
      {
        const int64_t k = std::max<int64_t>(1, n / 1000);
        const int cols = static_cast<int>(std::clamp<int64_t>(4 * k, 16, int64_t{1} << 26));  // as src/compression.cc
        const gc::GpuCountSketch sketch(rows, cols, rng);
        gc::DeviceBuffer table(static_cast<size_t>(rows) * cols * 4);
        const double acc_ms = time_ms(
            [&] {
              GRADCOMM_CUDA_CHECK(cudaMemsetAsync(table.data(), 0, table.size(), stream));
              sketch.accumulate(grad.as<float>(), nullptr, n, table.as<float>(), stream);
            },
            stream, warmup, iters);
        rows_out.push_back({"sketch accumulate r=" + std::to_string(rows), n, 0.001, acc_ms, nbytes});
        const double rec_ms = time_ms([&] { sketch.recover(table.as<float>(), n, k, ws, stream); }, stream, warmup, iters);
        rows_out.push_back({"sketch recover (est+topk)", n, 0.001, rec_ms, 2.0 * nbytes});
      }
      {
        const int64_t k = std::max<int64_t>(1, n / 100);
        // Top-k's default payload: Elias–Fano indices, bf16 values.
        const gc::SparseFormat format{gc::ValueType::kBf16, true};
        gc::gpu_topk_select(grad.as<float>(), nullptr, n, k, gc::TopkSelect::kExact, rng, format.values, ws, stream);
        const size_t bytes = gc::sparse_payload_bytes(n, k, format);
        gc::DeviceBuffer payload(bytes);
        gc::StatusBuffer status;
        status.reset(stream);
        gc::gpu_encode_sparse(gc::CompressorId::kTopk, n, ws.indices(), ws.values(), ws.count(), ws.capacity(),
                              format, payload.as<uint8_t>(), nullptr, status.device(), stream);
        status.check(stream, "bench encode");
        const double ms = time_ms(
            [&] {
              gc::gpu_decode_add_sparse(gc::CompressorId::kTopk, payload.as<uint8_t>(), bytes, n, format,
                                        scratch.as<float>(), ws, status.device(), stream);
            },
            stream, warmup, iters);
        status.check(stream, "bench decode");
        rows_out.push_back({"decode-add (topk 0.01)", n, 0.01, ms, static_cast<double>(bytes) + 8.0 * static_cast<double>(k)});
      }
      for (const Row& r : rows_out) {
        const double gbps = r.bytes / r.ms / 1e6;
        std::printf("%-26s %12lld %8.3g %10.4f %10.1f %7.0f%%\n", r.op.c_str(), static_cast<long long>(r.n), r.ratio,
                    r.ms, gbps, 100.0 * gbps / copy_gbps);
        out.push_back({{"op", r.op}, {"n", r.n}, {"ratio", r.ratio}, {"ms", r.ms}, {"eff_gbps", gbps},
                       {"fraction_of_copy", gbps / copy_gbps}, {"device", prop.name}});
      }
    }
    if (!json_path.empty()) {
      std::ofstream(json_path) << out.dump(2) << "\n";
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda_sparse: %s\n", e.what());
    return 1;
  }
  return 0;
}
