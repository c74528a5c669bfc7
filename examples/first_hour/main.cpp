// first_hour: the trainer docs/first-hour.md walks through (the page quotes the marked snippets;
// the docs check keeps them equal). A stock LibTorch data loader measured by torchpilot::watch(),
// steps and phases marked, a checkpoint now and then reported for ETTR. The data are generated
// (no download), so it runs anywhere; on a machine with a GPU the model trains there.
//
//   first_hour [--epochs E] [--samples N] [--batch B] [--workers W] [--checkpoint-every S]
//              [--checkpoint FILE]
// torchpilot's settings come from its config (TORCHPILOT_CONFIG, TORCHPILOT_* variables).
#include <cstdio>
#include <string>

#include "cli_flags.h"
// [snippet include]
#include <torch/torch.h>
#include <torchpilot/torchpilot.h>
// [end include]

namespace {

// Stands for your dataset: 1x28x28 "images" whose label (of 10) is a function of their pixels.
class GeneratedImages : public torch::data::datasets::Dataset<GeneratedImages> {
 public:
  explicit GeneratedImages(size_t size) : size_(size) {}
  torch::data::Example<> get(size_t index) override {
    const int64_t label = static_cast<int64_t>(index % 10);
    auto pixels = torch::arange(28 * 28, torch::kFloat32).mul(label + 1).remainder(17).div(17);
    return {pixels.reshape({1, 28, 28}), torch::tensor(label)};
  }
  torch::optional<size_t> size() const override { return size_; }

 private:
  size_t size_;
};

struct Options {
  int64_t epochs = 3;
  int64_t samples = 4096;
  int64_t batch = 64;
  int64_t workers = 2;
  int64_t checkpoint_every = 100;  // steps
  std::string checkpoint = "first_hour.pt";
};

int train(const Options& options) {
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  torch::nn::Sequential model(torch::nn::Flatten(), torch::nn::Linear(28 * 28, 256),
                              torch::nn::ReLU(), torch::nn::Linear(256, 10));
  model->to(device);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.05));

  // [snippet pilot]
  // The mode, thresholds and report paths from TORCHPILOT_CONFIG (a YAML file) and TORCHPILOT_*
  // variables; a bad key or value throws torchpilot::ConfigError here, before any training.
  torchpilot::Pilot pilot(torchpilot::Config::load());
  // [end pilot]

  // [snippet loop]
  auto dataset =
      GeneratedImages(static_cast<size_t>(options.samples)).map(torch::data::transforms::Stack<>());
  auto loader = torch::data::make_data_loader(std::move(dataset),
                                              torch::data::DataLoaderOptions()
                                                  .batch_size(static_cast<size_t>(options.batch))
                                                  .workers(static_cast<size_t>(options.workers)));

  int64_t step = 0;
  for (int64_t epoch = 0; epoch < options.epochs; ++epoch) {
    // watch() times each wait for a batch; the loop's end ends torchpilot's epoch (log line,
    // advice, reports).
    for (auto& batch : torchpilot::watch(*loader, pilot)) {
      auto step_scope = pilot.step(batch.data.size(0));  // the step ends at scope exit
      auto data = batch.data.to(device);
      auto target = batch.target.to(device);
      torch::Tensor loss;
      {
        auto phase = pilot.phase("forward");
        loss = torch::nn::functional::cross_entropy(model->forward(data), target);
      }
      {
        auto phase = pilot.phase("backward");
        optimizer.zero_grad();
        loss.backward();
      }
      {
        auto phase = pilot.phase("optimizer");
        optimizer.step();
      }
      if (++step % options.checkpoint_every == 0) {
        auto phase = pilot.phase("checkpoint");  // a periodic stall gets its name
        torch::save(model, options.checkpoint);
        pilot.checkpoint_saved(step);  // the run journal's ETTR counts from it
      }
    }
  }
  // [end loop]
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  CLI::App app(
      "first_hour: a small classifier on generated images with a stock LibTorch loader, measured "
      "by torchpilot::watch() (docs/first-hour.md). torchpilot's settings: TORCHPILOT_CONFIG and "
      "TORCHPILOT_* variables.",
      "first_hour");
  example_cli::last_wins(app);
  example_cli::add_int(app, "--epochs", options.epochs, 1, 1000000, "epochs")
      ->capture_default_str();
  example_cli::add_int(app, "--samples", options.samples, 1, 1 << 30, "samples per epoch")
      ->capture_default_str();
  example_cli::add_int(app, "--batch", options.batch, 1, 65536, "batch size")
      ->capture_default_str();
  example_cli::add_int(app, "--workers", options.workers, 0, 256,
                       "the stock loader's workers (0: batches made on the training thread)")
      ->capture_default_str();
  example_cli::add_int(app, "--checkpoint-every", options.checkpoint_every, 1, 1000000000,
                       "save a checkpoint every this many steps")
      ->capture_default_str();
  example_cli::add_path(app, "--checkpoint", options.checkpoint, "FILE", "checkpoint file")
      ->capture_default_str();
  example_cli::parse_or_exit(app, argc, argv);
  try {
    return train(options);
  } catch (const torchpilot::ConfigError& e) {
    std::fprintf(stderr, "first_hour: %s\n", e.what());
    return 2;
  }
}
