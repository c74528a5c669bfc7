// The GPT example's reference model and its shape flags, shared by the example and the benchmarks
// that train it (bench/): --d-model, --layers, --heads, --seq and --batch into TrainOptions, and
// the benchmarks' --precision and --attention, through CLI11 (cli_flags.h).
#pragma once

#include <string>

#include "cli_flags.h"
#include "gpt_trainer.h"

namespace gpt_example {

// The reference model of the example and its benchmarks: d 1024, 12 layers, 16 heads, T 1024.
inline TrainOptions reference_options(int64_t batch) {
  TrainOptions t;
  t.d_model = 1024;
  t.layers = 12;
  t.heads = 16;
  t.seq = 1024;
  t.batch = batch;
  return t;
}

inline void add_shape_flags(CLI::App& app, TrainOptions& t, const std::string& batch_help) {
  example_cli::add_int(app, "--d-model", t.d_model, 1, 65536, "model width d")
      ->capture_default_str();
  example_cli::add_int(app, "--layers", t.layers, 1, 4096, "blocks")->capture_default_str();
  example_cli::add_int(app, "--heads", t.heads, 1, 4096, "attention heads (divide d)")
      ->capture_default_str();
  example_cli::add_int(app, "--seq", t.seq, 1, 1 << 20, "sequence length T")->capture_default_str();
  example_cli::add_int(app, "--batch", t.batch, 1, 65536, batch_help)->capture_default_str();
}

// The benchmarks' --precision (bf16 autocast on CUDA, or fp32) and, where `attention` is given,
// --attention (scaled_dot_product_attention, or unfused): names until parsed, then written into
// TrainOptions by apply_precision_flags.
inline void add_precision_flags(CLI::App& app, std::string& precision,
                                std::string* attention = nullptr) {
  app.add_option("--precision", precision, "bf16 autocast on CUDA, or fp32")
      ->check(CLI::IsMember({"bf16", "fp32"}))
      ->capture_default_str();
  if (attention == nullptr) return;
  app.add_option("--attention", *attention, "scaled_dot_product_attention, or unfused")
      ->check(CLI::IsMember({"fused", "unfused"}))
      ->capture_default_str();
}

inline void apply_precision_flags(TrainOptions& t, const std::string& precision,
                                  const std::string* attention = nullptr) {
  t.precision = precision == "bf16" ? Precision::kBf16 : Precision::kFp32;
  if (attention != nullptr) t.fused_attention = *attention == "fused";
}

}  // namespace gpt_example
