// The second-opinion set (planted_pairs --set second-opinion): trainers modelled on public C++
// LibTorch code, not written for the advisors, each with the fix its own bottleneck calls for.
// Part of bench/planted_pairs.cpp (included after its workloads and pairs: Workload, Env, Pair,
// cpu_work); kept in its own file so that the set stays apart from the planted pairs.
//
// Each trainer keeps its model's structure, batch size, loader (LibTorch's own DataLoader, its
// sampler and worker count), per-sample transforms and the reads of the loss it makes (.item()),
// with torchpilot added as a user would (watch() around the loader, pilot.step() per batch).
// Data are synthetic tensors of the datasets' shapes (these machines reach no network); image
// decoding is CPU work of a stated cost per sample.
//   mnist           pytorch/examples cpp/mnist/mnist.cpp: the conv net, batch 64, a sequential
//                   loader with workers 0 and Normalize + Stack, loss.item() every batch (the
//                   NaN assert) and every 10th (the log line). Fix: the workers the advice names.
//   dcgan           pytorch/examples cpp/dcgan/dcgan.cpp: generator and discriminator as there,
//                   batch 64, workers 2, Adam, losses read every 10 batches, both models and both
//                   optimizers saved and 10 samples generated and saved every 200 batches. Fix: no
//                   checkpoint on the training thread (removed).
//   custom_dataset  pytorch/examples cpp/custom-dataset: the AlexNet-like network at 224x224,
//                   batch 8, workers 0, each image decoded and resized (--decode-us of CPU work
//                   standing in for cv::imread + cv::resize) and converted to float, three .item()
//                   a batch. Fix: the workers the advice names.
//   resnet_cifar    prabhuomkar/pytorch-cpp tutorials/intermediate/deep_residual_network: the
//                   ResNet of [2, 2, 2] residual blocks on 32x32, batch 100, a random sampler with
//                   workers 0 and ConstantPad(4), RandomHorizontalFlip, RandomCrop(32), Stack per
//                   sample, Adam, two .item() a batch. Fix: the workers the advice names.
//   regression      pytorch/examples cpp/regression/regression.cpp: a polynomial fitted by one
//                   Linear(4, 1), each batch of 32 made on the host (randn, powers, cat, the
//                   target's matmul and b.item()), moved to the GPU, the loss read every batch.
//                   Fix: twice the batch (throughput per sample), the launch-bound remedy.
//   feedforward     prabhuomkar/pytorch-cpp tutorials/basics/feedforward_neural_network: 784-500-10
//                   MLP, batch 100, a random sampler with workers 0 and Normalize + Stack, Adam,
//                   the running loss and the correct count read every batch (.item() x2). Fix: the
//                   workers the advice names.
#pragma once

namespace second_opinion {

// A stock LibTorch DataLoader watched by torchpilot, iterated across steps() calls; a pass that
// ends starts the next one.
template <typename Data, typename Sampler>
class Feed {
 public:
  using Loader = torch::data::StatelessDataLoader<Data, Sampler>;
  using Watched = torchpilot::WatchedLoader<Loader>;
  using Batch = typename Watched::Batch;
  void begin(Data data, size_t batch, int workers, torchpilot::Pilot& pilot) {
    loader_ = torch::data::make_data_loader<Sampler>(
        std::move(data), torch::data::DataLoaderOptions().batch_size(batch).workers(
                             static_cast<size_t>(std::max(0, workers))));
    watched_ = std::make_unique<Watched>(*loader_, pilot);
  }
  Batch& next() {
    if (it_) ++*it_;
    if (!it_ || *it_ == watched_->end()) {
      it_.reset();
      it_.emplace(watched_->begin());
    }
    return **it_;
  }
  void end() {
    it_.reset();
    watched_.reset();
    loader_.reset();  // joins the workers
  }

 private:
  std::unique_ptr<Loader> loader_;
  std::unique_ptr<Watched> watched_;
  std::optional<typename Watched::Iterator> it_;
};

// Images of a dataset's shape, held in memory as uint8 (as MNIST's and CIFAR's readers hold
// them), handed out as float views divided by 255; optional CPU work per sample (decoding).
class Images : public torch::data::datasets::Dataset<Images> {
 public:
  Images(size_t size, std::vector<int64_t> shape, int64_t distinct, double decode_us)
      : size_(size), decode_(decode_us > 0 ? iterations_for(decode_us) : 0) {
    std::vector<int64_t> all{distinct};
    all.insert(all.end(), shape.begin(), shape.end());
    pool_ = torch::randint(0, 256, all, torch::kUInt8);
  }
  void set_one_thread(bool on) { one_thread_ = on; }
  torch::data::Example<> get(size_t index) override {
    if (one_thread_) one_intra_op_thread_in_workers();
    if (decode_ > 0) sink_ = cpu_work(decode_, static_cast<float>(index % 7));
    const int64_t i = static_cast<int64_t>(index % static_cast<size_t>(pool_.size(0)));
    return {pool_[i].to(torch::kFloat).div_(255), torch::tensor(static_cast<int64_t>(index % 10))};
  }
  torchpilot::compat::optional<size_t> size() const override { return size_; }

 private:
  size_t size_;
  int64_t decode_;
  torch::Tensor pool_;
  float sink_ = 0;
  bool one_thread_ = false;
};

using Normalized = torch::data::datasets::MapDataset<
    torch::data::datasets::MapDataset<Images, torch::data::transforms::Normalize<>>,
    torch::data::transforms::Stack<>>;
using Stacked = torch::data::datasets::MapDataset<Images, torch::data::transforms::Stack<>>;

// The examples' workers: the count the advice names in the fixed form (evidence workers_advised,
// set by the bench), else their own.
class Workers {
 public:
  explicit Workers(int n) : n_(n) {}
  virtual ~Workers() = default;
  int workers() const { return n_; }
  void set_workers(int n) { n_ = std::max(1, n); }
  void set_one_thread(bool on) { one_thread_ = on; }

 protected:
  // The examples' Images with the advice's one intra-op thread per worker where it applies.
  Images images(size_t size, std::vector<int64_t> shape, int64_t distinct, double decode_us) {
    threads_.begin();
    if (one_thread_) torch::set_num_threads(1);  // before the loader: its workers take one too
    Images i(size, std::move(shape), distinct, decode_us);
    i.set_one_thread(one_thread_);
    return i;
  }
  int n_;
  bool one_thread_ = false;
  IntraOpThreads threads_;
};

// --- mnist ------------------------------------------------------------------------------------

struct MnistNet : torch::nn::Module {
  MnistNet()
      : conv1(torch::nn::Conv2dOptions(1, 10, 5)),
        conv2(torch::nn::Conv2dOptions(10, 20, 5)),
        fc1(320, 50),
        fc2(50, 10) {
    register_module("conv1", conv1);
    register_module("conv2", conv2);
    register_module("conv2_drop", conv2_drop);
    register_module("fc1", fc1);
    register_module("fc2", fc2);
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(torch::max_pool2d(conv1->forward(x), 2));
    x = torch::relu(torch::max_pool2d(conv2_drop->forward(conv2->forward(x)), 2));
    x = x.view({-1, 320});
    x = torch::relu(fc1->forward(x));
    x = torch::dropout(x, 0.5, is_training());
    return torch::log_softmax(fc2->forward(x), 1);
  }
  torch::nn::Conv2d conv1, conv2;
  torch::nn::Dropout2d conv2_drop;
  torch::nn::Linear fc1, fc2;
};

class Mnist : public Workload, public Workers {
 public:
  Mnist(const Env& env, int workers)
      : Workers(workers), env_(env), net_(std::make_shared<MnistNet>()) {
    net_->to(env.device);
    opt_ = std::make_unique<torch::optim::SGD>(net_->parameters(),
                                               torch::optim::SGDOptions(0.01).momentum(0.5));
  }
  int64_t samples_per_step() const override { return kBatch; }
  void begin(torchpilot::Pilot& pilot) override {
    feed_.begin(images(kBatch * 1000000, {1, 28, 28}, 10000, 0)
                    .map(torch::data::transforms::Normalize<>(0.1307, 0.3081))
                    .map(torch::data::transforms::Stack<>()),
                kBatch, n_, pilot);
  }
  void steps(torchpilot::Pilot& pilot, int n) override {
    for (int i = 0; i < n; ++i) {
      auto& batch = feed_.next();
      auto step = pilot.step(kBatch);
      auto data = batch.data.to(env_.device), targets = batch.target.to(env_.device);
      opt_->zero_grad();
      auto loss = torch::nll_loss(net_->forward(data), targets);
      if (std::isnan(loss.item<float>())) throw std::runtime_error("mnist: NaN loss");
      loss.backward();
      opt_->step();
      if (index_++ % 10 == 0) sink_ += loss.item<float>();  // the example's log line
    }
  }
  void end() override {
    feed_.end();
    threads_.end();
  }

 private:
  static constexpr int64_t kBatch = 64;
  Env env_;
  std::shared_ptr<MnistNet> net_;
  std::unique_ptr<torch::optim::SGD> opt_;
  Feed<Normalized, torch::data::samplers::SequentialSampler> feed_;
  int64_t index_ = 0;
  float sink_ = 0;
};

// --- dcgan ------------------------------------------------------------------------------------

class Dcgan : public Workload {
 public:
  Dcgan(const Env& env, bool fixed) : env_(env), fixed_(fixed) {
    using namespace torch::nn;
    generator_ = Sequential(
        ConvTranspose2d(ConvTranspose2dOptions(kNoise, 256, 4).bias(false)), BatchNorm2d(256),
        ReLU(),
        ConvTranspose2d(ConvTranspose2dOptions(256, 128, 3).stride(2).padding(1).bias(false)),
        BatchNorm2d(128), ReLU(),
        ConvTranspose2d(ConvTranspose2dOptions(128, 64, 4).stride(2).padding(1).bias(false)),
        BatchNorm2d(64), ReLU(),
        ConvTranspose2d(ConvTranspose2dOptions(64, 1, 4).stride(2).padding(1).bias(false)), Tanh());
    discriminator_ =
        Sequential(Conv2d(Conv2dOptions(1, 64, 4).stride(2).padding(1).bias(false)),
                   LeakyReLU(LeakyReLUOptions().negative_slope(0.2)),
                   Conv2d(Conv2dOptions(64, 128, 4).stride(2).padding(1).bias(false)),
                   BatchNorm2d(128), LeakyReLU(LeakyReLUOptions().negative_slope(0.2)),
                   Conv2d(Conv2dOptions(128, 256, 4).stride(2).padding(1).bias(false)),
                   BatchNorm2d(256), LeakyReLU(LeakyReLUOptions().negative_slope(0.2)),
                   Conv2d(Conv2dOptions(256, 1, 3).stride(1).padding(0).bias(false)), Sigmoid());
    generator_->to(env.device);
    discriminator_->to(env.device);
    g_opt_ = std::make_unique<torch::optim::Adam>(
        generator_->parameters(), torch::optim::AdamOptions(2e-4).betas({0.5, 0.999}));
    d_opt_ = std::make_unique<torch::optim::Adam>(
        discriminator_->parameters(), torch::optim::AdamOptions(2e-4).betas({0.5, 0.999}));
    const char* tmp = std::getenv("TMPDIR");
    dir_ = std::string(tmp != nullptr ? tmp : "/tmp") + "/torchpilot-second-opinion-dcgan-";
  }
  ~Dcgan() override {
    for (const char* f : {"g.pt", "go.pt", "d.pt", "do.pt", "s.pt"})
      std::remove((dir_ + f).c_str());
  }
  int64_t samples_per_step() const override { return kBatch; }
  void begin(torchpilot::Pilot& pilot) override {
    feed_.begin(Images(kBatch * 1000000, {1, 28, 28}, 10000, 0)
                    .map(torch::data::transforms::Normalize<>(0.5, 0.5))
                    .map(torch::data::transforms::Stack<>()),
                kBatch, 2, pilot);
  }
  void steps(torchpilot::Pilot& pilot, int n) override {
    for (int i = 0; i < n; ++i) {
      auto& batch = feed_.next();
      auto step = pilot.step(kBatch);
      discriminator_->zero_grad();
      torch::Tensor real = batch.data.to(env_.device);
      torch::Tensor real_labels = torch::empty(batch.data.size(0), env_.device).uniform_(0.8, 1.0);
      torch::Tensor d_loss_real =
          torch::binary_cross_entropy(discriminator_->forward(real).view({-1}), real_labels);
      d_loss_real.backward();
      torch::Tensor noise = torch::randn({batch.data.size(0), kNoise, 1, 1}, env_.device);
      torch::Tensor fake = generator_->forward(noise);
      torch::Tensor fake_labels = torch::zeros(batch.data.size(0), env_.device);
      torch::Tensor d_loss_fake = torch::binary_cross_entropy(
          discriminator_->forward(fake.detach()).view({-1}), fake_labels);
      d_loss_fake.backward();
      torch::Tensor d_loss = d_loss_real + d_loss_fake;
      d_opt_->step();
      generator_->zero_grad();
      fake_labels.fill_(1);
      torch::Tensor g_loss =
          torch::binary_cross_entropy(discriminator_->forward(fake).view({-1}), fake_labels);
      g_loss.backward();
      g_opt_->step();
      if (++index_ % 10 == 0) sink_ += d_loss.item<float>() + g_loss.item<float>();
      if (!fixed_ && index_ % 200 == 0) {
        torch::save(generator_, dir_ + "g.pt");
        torch::save(*g_opt_, dir_ + "go.pt");
        torch::save(discriminator_, dir_ + "d.pt");
        torch::save(*d_opt_, dir_ + "do.pt");
        torch::Tensor samples = generator_->forward(torch::randn({10, kNoise, 1, 1}, env_.device));
        torch::save((samples + 1.0) / 2.0, dir_ + "s.pt");
      }
    }
  }
  void end() override { feed_.end(); }

 private:
  static constexpr int64_t kBatch = 64, kNoise = 100;
  Env env_;
  bool fixed_;
  torch::nn::Sequential generator_{nullptr}, discriminator_{nullptr};
  std::unique_ptr<torch::optim::Adam> g_opt_, d_opt_;
  Feed<Normalized, torch::data::samplers::SequentialSampler> feed_;
  std::string dir_;
  int64_t index_ = 0;
  float sink_ = 0;
};

// --- custom_dataset ---------------------------------------------------------------------------

torch::nn::Sequential alexnet_like() {
  using namespace torch::nn;
  Sequential net;
  net->push_back(Conv2d(Conv2dOptions(3, 64, 11).stride(4).padding(2)));
  net->push_back(ReLU());
  net->push_back(MaxPool2d(MaxPool2dOptions(3).stride(2)));
  net->push_back(Conv2d(Conv2dOptions(64, 192, 5).padding(2)));
  net->push_back(ReLU());
  net->push_back(MaxPool2d(MaxPool2dOptions(3).stride(2)));
  net->push_back(Conv2d(Conv2dOptions(192, 384, 3).padding(1)));
  net->push_back(ReLU());
  net->push_back(Conv2d(Conv2dOptions(384, 256, 3).padding(1)));
  net->push_back(ReLU());
  net->push_back(Conv2d(Conv2dOptions(256, 256, 3).padding(1)));
  net->push_back(ReLU());
  net->push_back(MaxPool2d(MaxPool2dOptions(3).stride(2)));
  net->push_back(Flatten());
  net->push_back(Dropout());
  net->push_back(Linear(256 * 6 * 6, 4096));
  net->push_back(ReLU());
  net->push_back(Dropout());
  net->push_back(Linear(4096, 4096));
  net->push_back(ReLU());
  net->push_back(Linear(4096, 102));
  net->push_back(LogSoftmax(1));
  return net;
}

class CustomDataset : public Workload, public Workers {
 public:
  CustomDataset(const Env& env, double decode_us, int workers)
      : Workers(workers), env_(env), decode_us_(decode_us), net_(alexnet_like()) {
    net_->to(env.device);
    opt_ = std::make_unique<torch::optim::SGD>(net_->parameters(),
                                               torch::optim::SGDOptions(0.001).momentum(0.5));
  }
  int64_t samples_per_step() const override { return kBatch; }
  void begin(torchpilot::Pilot& pilot) override {
    feed_.begin(images(kBatch * 1000000, {3, 224, 224}, 64, decode_us_)
                    .map(torch::data::transforms::Stack<>()),
                kBatch, n_, pilot);
  }
  void steps(torchpilot::Pilot& pilot, int n) override {
    for (int i = 0; i < n; ++i) {
      auto& batch = feed_.next();
      auto step = pilot.step(kBatch);
      auto data = batch.data.to(env_.device);
      auto targets = batch.target.to(env_.device).view({-1});
      auto output = net_->forward(data);
      auto loss = torch::nll_loss(output, targets);
      if (std::isnan(loss.item<float>())) throw std::runtime_error("custom_dataset: NaN loss");
      auto acc = output.argmax(1).eq(targets).sum();
      opt_->zero_grad();
      loss.backward();
      opt_->step();
      sink_ += loss.item<float>() + acc.item<float>();
    }
  }
  void end() override {
    feed_.end();
    threads_.end();
  }

 private:
  static constexpr int64_t kBatch = 8;
  Env env_;
  double decode_us_;
  torch::nn::Sequential net_;
  std::unique_ptr<torch::optim::SGD> opt_;
  Feed<Stacked, torch::data::samplers::SequentialSampler> feed_;
  float sink_ = 0;
};

// The pytorch-cpp tutorials' classification step: cross-entropy, the running loss and the correct
// count read back every batch (two .item()), then the update.
struct TutorialTally {
  double running_loss = 0;
  int64_t correct = 0;
  void step(const torch::Tensor& output, const torch::Tensor& target,
            torch::optim::Optimizer& opt) {
    auto loss = torch::nn::functional::cross_entropy(output, target);
    running_loss += loss.item<double>() * static_cast<double>(output.size(0));
    correct += output.argmax(1).eq(target).sum().item<int64_t>();
    opt.zero_grad();
    loss.backward();
    opt.step();
  }
};

// --- resnet_cifar -----------------------------------------------------------------------------

struct ResidualBlockImpl : torch::nn::Module {
  ResidualBlockImpl(int64_t in, int64_t out, int64_t stride)
      : conv1(torch::nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false)),
        bn1(out),
        conv2(torch::nn::Conv2dOptions(out, out, 3).padding(1).bias(false)),
        bn2(out) {
    register_module("conv1", conv1);
    register_module("bn1", bn1);
    register_module("conv2", conv2);
    register_module("bn2", bn2);
    if (stride != 1 || in != out) {
      down = register_module(
          "down",
          torch::nn::Sequential(
              torch::nn::Conv2d(
                  torch::nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false)),
              torch::nn::BatchNorm2d(out)));
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    auto out = torch::relu(bn1->forward(conv1->forward(x)));
    out = bn2->forward(conv2->forward(out));
    return torch::relu(out + (down ? down->forward(x) : x));
  }
  torch::nn::Conv2d conv1;
  torch::nn::BatchNorm2d bn1;
  torch::nn::Conv2d conv2;
  torch::nn::BatchNorm2d bn2;
  torch::nn::Sequential down{nullptr};
};
TORCH_MODULE(ResidualBlock);

struct ResNetImpl : torch::nn::Module {
  ResNetImpl()
      : conv(torch::nn::Conv2dOptions(3, 16, 3).padding(1).bias(false)), bn(16), fc(64, 10) {
    register_module("conv", conv);
    register_module("bn", bn);
    int64_t in = 16;
    for (int64_t out : {16, 32, 64}) {
      for (int b = 0; b < 2; ++b) {
        layers->push_back(ResidualBlock(in, out, b == 0 && out != 16 ? 2 : 1));
        in = out;
      }
    }
    register_module("layers", layers);
    register_module("fc", fc);
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(bn->forward(conv->forward(x)));
    x = layers->forward(x);
    x = torch::avg_pool2d(x, 8).view({x.size(0), -1});
    return fc->forward(x);
  }
  torch::nn::Conv2d conv;
  torch::nn::BatchNorm2d bn;
  torch::nn::Sequential layers;
  torch::nn::Linear fc;
};
TORCH_MODULE(ResNet);

// The tutorial's per-sample transforms: pad 4, flip half the images, crop 32x32 at random.
struct PadFlipCrop : torch::data::transforms::TensorTransform<> {
  torch::Tensor operator()(torch::Tensor x) override {
    x = torch::constant_pad_nd(x, {4, 4, 4, 4});
    if (torch::rand({1}).item<double>() < 0.5) x = x.flip({2});
    const int64_t i = torch::randint(0, 9, {1}).item<int64_t>();
    const int64_t j = torch::randint(0, 9, {1}).item<int64_t>();
    return x.slice(1, i, i + 32).slice(2, j, j + 32);
  }
};

class ResnetCifar : public Workload, public Workers {
 public:
  using Data =
      torch::data::datasets::MapDataset<torch::data::datasets::MapDataset<Images, PadFlipCrop>,
                                        torch::data::transforms::Stack<>>;
  ResnetCifar(const Env& env, int workers) : Workers(workers), env_(env) {
    net_->to(env.device);
    opt_ =
        std::make_unique<torch::optim::Adam>(net_->parameters(), torch::optim::AdamOptions(1e-3));
  }
  int64_t samples_per_step() const override { return kBatch; }
  void begin(torchpilot::Pilot& pilot) override {
    feed_.begin(images(50000, {3, 32, 32}, 10000, 0)
                    .map(PadFlipCrop())
                    .map(torch::data::transforms::Stack<>()),
                kBatch, n_, pilot);
  }
  void steps(torchpilot::Pilot& pilot, int n) override {
    for (int i = 0; i < n; ++i) {
      auto& batch = feed_.next();
      auto step = pilot.step(kBatch);
      auto data = batch.data.to(env_.device);
      auto target = batch.target.to(env_.device);
      tally_.step(net_->forward(data), target, *opt_);
    }
  }
  void end() override {
    feed_.end();
    threads_.end();
  }

 private:
  static constexpr int64_t kBatch = 100;
  Env env_;
  ResNet net_;
  std::unique_ptr<torch::optim::Adam> opt_;
  Feed<Data, torch::data::samplers::RandomSampler> feed_;
  TutorialTally tally_;
};

// --- regression -------------------------------------------------------------------------------

class Regression : public Workload {
 public:
  Regression(const Env& env, int64_t batch)
      : env_(env), batch_(batch), w_(torch::randn({4, 1}) * 5), b_(torch::randn({1}) * 5) {
    fc_->to(env.device);
    opt_ = std::make_unique<torch::optim::SGD>(fc_->parameters(), torch::optim::SGDOptions(0.1));
  }
  int64_t samples_per_step() const override { return batch_; }
  void steps(torchpilot::Pilot& pilot, int n) override {
    for (int i = 0; i < n; ++i) {
      auto step = pilot.step(batch_);
      // get_batch: features [x, x^2, x^3, x^4] and the target made on the host.
      auto x = torch::randn({batch_}).unsqueeze(1);
      std::vector<torch::Tensor> xs;
      for (int64_t p = 0; p < 4; ++p) xs.push_back(x.pow(p + 1));
      auto features = torch::cat(xs, 1);
      auto y = features.mm(w_) + b_.item();
      features = features.to(env_.device);
      y = y.to(env_.device);
      opt_->zero_grad();
      auto loss = torch::smooth_l1_loss(fc_->forward(features), y);
      sink_ += loss.item<float>();
      loss.backward();
      opt_->step();
    }
  }

 private:
  Env env_;
  int64_t batch_;
  torch::Tensor w_, b_;
  torch::nn::Linear fc_{4, 1};
  std::unique_ptr<torch::optim::SGD> opt_;
  float sink_ = 0;
};

// --- feedforward ------------------------------------------------------------------------------

class Feedforward : public Workload, public Workers {
 public:
  Feedforward(const Env& env, int workers) : Workers(workers), env_(env) {
    net_->push_back(torch::nn::Linear(784, 500));
    net_->push_back(torch::nn::ReLU());
    net_->push_back(torch::nn::Linear(500, 10));
    net_->to(env.device);
    opt_ =
        std::make_unique<torch::optim::Adam>(net_->parameters(), torch::optim::AdamOptions(1e-3));
  }
  int64_t samples_per_step() const override { return kBatch; }
  void begin(torchpilot::Pilot& pilot) override {
    feed_.begin(images(60000, {1, 28, 28}, 10000, 0)
                    .map(torch::data::transforms::Normalize<>(0.1307, 0.3081))
                    .map(torch::data::transforms::Stack<>()),
                kBatch, n_, pilot);
  }
  void steps(torchpilot::Pilot& pilot, int n) override {
    for (int i = 0; i < n; ++i) {
      auto& batch = feed_.next();
      auto step = pilot.step(kBatch);
      auto data = batch.data.view({batch.data.size(0), -1}).to(env_.device);
      auto target = batch.target.to(env_.device);
      tally_.step(net_->forward(data), target, *opt_);
    }
  }
  void end() override {
    feed_.end();
    threads_.end();
  }

 private:
  static constexpr int64_t kBatch = 100;
  Env env_;
  torch::nn::Sequential net_;
  std::unique_ptr<torch::optim::Adam> opt_;
  Feed<Normalized, torch::data::samplers::RandomSampler> feed_;
  TutorialTally tally_;
};

// --- the set ----------------------------------------------------------------------------------

// Pair::advice is the bottleneck the fix removes (what the advice should name first).
inline std::vector<Pair> pairs() {
  std::vector<Pair> p;
  p.push_back({"mnist", "data_starvation", "", true,
               "pytorch/examples cpp/mnist: workers 0, loss.item() every batch",
               "the workers the advice names (else 4)", nullptr,
               [](const Env& env, const Args&, bool fixed) -> std::unique_ptr<Workload> {
                 return std::make_unique<Mnist>(env, fixed ? 4 : 0);
               }});
  p.push_back({"dcgan", "periodic_stall", "checkpoint", true,
               "pytorch/examples cpp/dcgan: both models and optimizers saved every 200 batches",
               "no checkpoint on the training thread", nullptr,
               [](const Env& env, const Args&, bool fixed) -> std::unique_ptr<Workload> {
                 return std::make_unique<Dcgan>(env, fixed);
               }});
  p.push_back({"custom_dataset", "data_starvation", "", true,
               "pytorch/examples cpp/custom-dataset: AlexNet at 224, batch 8, images decoded on "
               "the training thread (workers 0)",
               "the workers the advice names (else 8)", nullptr,
               [](const Env& env, const Args& a, bool fixed) -> std::unique_ptr<Workload> {
                 return std::make_unique<CustomDataset>(env, a.decode_us, fixed ? 8 : 0);
               }});
  p.push_back({"resnet_cifar", "data_starvation", "", true,
               "pytorch-cpp deep_residual_network: ResNet-[2,2,2] on 32x32, batch 100, per-sample "
               "pad/flip/crop on the training thread, two .item() a batch",
               "the workers the advice names (else 4)", nullptr,
               [](const Env& env, const Args&, bool fixed) -> std::unique_ptr<Workload> {
                 return std::make_unique<ResnetCifar>(env, fixed ? 4 : 0);
               }});
  p.push_back({"regression", "launch_bound", "", true,
               "pytorch/examples cpp/regression: Linear(4, 1), batches of 32 made on the host, "
               "the loss read every batch",
               "batches of 64 (throughput per sample)", nullptr,
               [](const Env& env, const Args& a, bool fixed) -> std::unique_ptr<Workload> {
                 return std::make_unique<Regression>(env, fixed ? 32 * a.launch_batch_factor : 32);
               }});
  p.push_back({"feedforward", "data_starvation", "", true,
               "pytorch-cpp feedforward_neural_network: 784-500-10 MLP, batch 100, workers 0, "
               "two .item() a batch",
               "the workers the advice names (else 4)", nullptr,
               [](const Env& env, const Args&, bool fixed) -> std::unique_ptr<Workload> {
                 return std::make_unique<Feedforward>(env, fixed ? 4 : 0);
               }});
  return p;
}

}  // namespace second_opinion
