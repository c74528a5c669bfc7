// A small transformer-ish model for the activation offloading tests (CPU and GPU): pre-LayerNorm
// blocks with a fused QKV projection (q, k and v view one storage), unfused causal attention
// (deterministic kernels: the gradients can be compared bit for bit), an MLP with GELU.
#pragma once

#include <torch/torch.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

namespace torchpilot::offload_test {

struct TinyBlockImpl : torch::nn::Module {
  TinyBlockImpl(int64_t d, int64_t heads) : heads(heads) {
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    qkv = register_module("qkv", torch::nn::Linear(d, 3 * d));
    proj = register_module("proj", torch::nn::Linear(d, d));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    fc = register_module("fc", torch::nn::Linear(d, 4 * d));
    out = register_module("out", torch::nn::Linear(4 * d, d));
  }
  torch::Tensor forward(torch::Tensor x) {
    const int64_t b = x.size(0), t = x.size(1), d = x.size(2), hd = d / heads;
    auto parts = qkv(ln1(x)).chunk(3, -1);
    auto q = parts[0].view({b, t, heads, hd}).transpose(1, 2);
    auto k = parts[1].view({b, t, heads, hd}).transpose(1, 2);
    auto v = parts[2].view({b, t, heads, hd}).transpose(1, 2);
    auto att = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(hd));
    auto mask =
        torch::ones({t, t}, torch::TensorOptions().dtype(torch::kBool).device(x.device())).triu(1);
    att = torch::softmax(att.masked_fill(mask, -std::numeric_limits<float>::infinity()), -1);
    auto y = torch::matmul(att, v).transpose(1, 2).contiguous().view({b, t, d});
    x = x + proj(y);
    return x + out(torch::gelu(fc(ln2(x))));
  }
  int64_t heads;
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  torch::nn::Linear qkv{nullptr}, proj{nullptr}, fc{nullptr}, out{nullptr};
};
TORCH_MODULE(TinyBlock);

struct TinyModelImpl : torch::nn::Module {
  TinyModelImpl(int64_t d, int64_t heads, int layers) {
    for (int i = 0; i < layers; ++i) {
      blocks.push_back(register_module("block" + std::to_string(i), TinyBlock(d, heads)));
    }
  }
  // `around_block` runs each block (per-module opt-in wraps it); default: plain calls.
  torch::Tensor forward(
      torch::Tensor x,
      const std::function<torch::Tensor(TinyBlock&, torch::Tensor)>& around_block = nullptr) {
    for (auto& b : blocks) x = around_block ? around_block(b, x) : b->forward(x);
    return x;
  }
  std::vector<TinyBlock> blocks;
};
TORCH_MODULE(TinyModel);

// The gradients of every parameter and of the input, cloned, after one backward of `loss_of` (by
// default the sum of the model's output, nothing offloaded).
inline std::vector<torch::Tensor> gradients(
    TinyModel& model, const torch::Tensor& input,
    const std::function<torch::Tensor(torch::Tensor)>& loss_of = {}) {
  for (auto& p : model->parameters()) p.mutable_grad() = torch::Tensor();
  auto x = input.detach().clone().requires_grad_(true);
  (loss_of ? loss_of(x) : model->forward(x).sum()).backward();
  std::vector<torch::Tensor> grads;
  for (auto& p : model->parameters()) grads.push_back(p.grad().detach().clone());
  grads.push_back(x.grad().detach().clone());
  return grads;
}

// Bit for bit: same dtype and shape, every element's bits equal (NaNs included).
inline bool bitwise_equal(const std::vector<torch::Tensor>& a,
                          const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].scalar_type() != b[i].scalar_type() || a[i].sizes() != b[i].sizes()) return false;
    auto x = a[i].contiguous().cpu(), y = b[i].contiguous().cpu();
    if (std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) != 0) return false;
  }
  return true;
}

}  // namespace torchpilot::offload_test
