#include "trainer.h"

#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <random>

#include "jpeg_io.h"
#include "torchpilot/hooks/loader/tunable_loader.h"

namespace jpeg_example {
namespace {

// A torch dataset over the JPEG folder: decode, random-resized crop, flip, normalise.
class JpegFolder : public torch::data::datasets::Dataset<JpegFolder> {
 public:
  JpegFolder(std::shared_ptr<const DatasetIndex> index, int crop, uint64_t seed)
      : index_(std::move(index)), crop_(crop), seed_(seed) {}

  torch::data::Example<> get(size_t i) override {
    Image image = decode_jpeg_file(index_->files.at(i));
    // Each call draws fresh augmentation; the stream depends on the sample and the call count.
    std::mt19937_64 rng(seed_ ^ (0x9E3779B97F4A7C15ULL * (i + 1)) ^ (calls_++ << 32));
    torch::Tensor data = torch::empty({3, crop_, crop_}, torch::kFloat32);
    augment_to_chw(image, crop_, /*train=*/true, rng, data.data_ptr<float>());
    return {data, torch::tensor(index_->labels.at(i), torch::kInt64)};
  }
  torch::optional<size_t> size() const override { return index_->files.size(); }

 private:
  std::shared_ptr<const DatasetIndex> index_;
  int crop_;
  uint64_t seed_;
  uint64_t calls_ = 0;  // per copy: each loader worker has its own
};

struct NetImpl : torch::nn::Module {
  explicit NetImpl(int classes)
      : c1(register_module("c1", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 8, 3).padding(1)))),
        c2(register_module("c2", torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 16, 3).padding(1)))),
        c3(register_module("c3",
                           torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 3).padding(1)))),
        fc(register_module("fc", torch::nn::Linear(32, classes))) {}

  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(c1(x)), 2);
    x = torch::max_pool2d(torch::relu(c2(x)), 2);
    x = torch::adaptive_avg_pool2d(torch::relu(c3(x)), {1, 1}).flatten(1);
    return fc(x);
  }
  torch::nn::Conv2d c1, c2, c3;
  torch::nn::Linear fc;
};
TORCH_MODULE(Net);

}  // namespace

struct Trainer::Impl {
  TrainOptions options;
  std::shared_ptr<const DatasetIndex> index;
  torch::Device device{torch::kCPU};
  Net net{nullptr};
  std::unique_ptr<torch::optim::Adam> optimizer;
};

Trainer::Trainer(TrainOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->options = options;
  impl_->index = std::make_shared<DatasetIndex>(generate_dataset(options.data_dir, options.classes,
                                                                 options.images_per_class,
                                                                 options.image_size, options.seed));
  if (torch::cuda::is_available()) impl_->device = torch::Device(torch::kCUDA, 0);
  torch::manual_seed(static_cast<uint64_t>(options.seed));
  impl_->net = Net(impl_->index->num_classes);
  impl_->net->to(impl_->device);
  impl_->optimizer = std::make_unique<torch::optim::Adam>(impl_->net->parameters(),
                                                          torch::optim::AdamOptions(2e-3));
}

Trainer::~Trainer() = default;

std::string Trainer::device() const { return impl_->device.str(); }
int64_t Trainer::dataset_size() const { return static_cast<int64_t>(impl_->index->files.size()); }
int64_t Trainer::steps_per_epoch() const { return dataset_size() / impl_->options.batch_size; }

RunResult Trainer::run(torchpilot::Pilot& pilot, int64_t steps,
                       const torchpilot::LoaderSettings& settings,
                       const std::function<bool()>& stop) {
  if (steps_per_epoch() == 0) {
    throw std::invalid_argument("batch size " + std::to_string(impl_->options.batch_size) +
                                " is larger than the dataset (" + std::to_string(dataset_size()) +
                                " images)");
  }
  torchpilot::LoaderOptions lo;
  lo.batch_size = static_cast<size_t>(impl_->options.batch_size);
  lo.workers = settings.workers;
  lo.prefetch = settings.prefetch;
  lo.pin_memory = settings.pin_memory;
  lo.device_prefetch = settings.device_prefetch;
  lo.drop_last = true;
  lo.seed = impl_->options.seed;
  lo.name = "jpeg";
  auto dataset = JpegFolder(impl_->index, impl_->options.crop, impl_->options.seed)
                     .map(torch::data::transforms::Stack<>());
  torchpilot::TunableLoader<decltype(dataset)> loader(std::move(dataset), lo);
  loader.attach(pilot);

  Net& net = impl_->net;
  net->train();
  const auto start = std::chrono::steady_clock::now();
  const int forward = pilot.phase_id("forward");
  const int backward = pilot.phase_id("backward");
  const int optimizer = pilot.phase_id("optimizer");
  RunResult result;
  torch::Tensor loss_sum, correct;
  int64_t seen = 0;
  bool stopped = false;
  while (result.steps < steps && !stopped) {
    // Per-epoch running sums stay on the device: reading them every step would sync the GPU.
    loss_sum = torch::zeros({}, torch::TensorOptions().device(impl_->device));
    correct = torch::zeros({}, torch::TensorOptions().device(impl_->device).dtype(torch::kInt64));
    seen = 0;
    for (auto& batch : loader) {
      auto step = pilot.step(batch.data.size(0));
      torch::Tensor x = batch.data.to(impl_->device, /*non_blocking=*/true);
      torch::Tensor y = batch.target.to(impl_->device, /*non_blocking=*/true);
      torch::Tensor loss;
      {
        auto p = pilot.phase(forward);
        torch::Tensor logits = net->forward(x);
        loss = torch::nn::functional::cross_entropy(logits, y);
        correct += logits.argmax(1).eq(y).sum();
      }
      {
        auto p = pilot.phase(backward);
        impl_->optimizer->zero_grad();
        loss.backward();
      }
      {
        auto p = pilot.phase(optimizer);
        impl_->optimizer->step();
      }
      loss_sum += loss.detach();
      seen += batch.data.size(0);
      if (++result.steps >= steps) {
        stopped = true;
        break;
      }
    }
    // `stop` is asked at epoch ends only: a run it ends has no partial last epoch.
    if (stop && stop()) stopped = true;
  }
  pilot.end_epoch();  // the last, partial epoch (a no-op if the loader just ended one)
  const int64_t batches = std::max<int64_t>(1, seen / impl_->options.batch_size);
  result.last_loss = loss_sum.item<double>() / static_cast<double>(batches);
  result.last_accuracy = seen > 0 ? correct.item<double>() / static_cast<double>(seen) : 0.0;
  result.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace jpeg_example
