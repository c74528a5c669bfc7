#include "gpt_model.h"

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "torchpilot/hooks/core/compat.h"
#include "torchpilot/hooks/flops/flop_counter.h"

namespace gpt_example {

const char* to_string(Attention attention) {
  return attention == Attention::kFused ? "fused" : "unfused";
}

bool fused_attention_available() { return TORCHPILOT_TORCH_AT_LEAST(2, 0); }

torch::Tensor linear(torch::nn::Linear& layer, const torch::Tensor& x, bool aten_linear) {
  if (!aten_linear) return layer->forward(x);
  return torch::linear(x, layer->weight, layer->bias);  // bias undefined without one
}

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const GptConfig& c, bool fused)
    : heads_(c.heads), d_model_(c.d_model), fused_(fused), aten_linear_(c.aten_linear) {
  qkv = register_module("qkv", torch::nn::Linear(c.d_model, 3 * c.d_model));
  proj = register_module("proj", torch::nn::Linear(c.d_model, c.d_model));
  if (!fused_) {
    causal_mask_ = register_buffer("causal_mask",
                                   torch::ones({c.seq, c.seq}, torch::kBool).triu(/*diagonal=*/1));
  }
}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x) {
  const int64_t b = x.size(0), t = x.size(1), dh = d_model_ / heads_;
  // [B, T, 3d] -> three [B, H, T, dh]
  std::vector<torch::Tensor> parts = linear(qkv, x, aten_linear_).split(d_model_, /*dim=*/2);
  auto heads = [&](const torch::Tensor& p) { return p.view({b, t, heads_, dh}).transpose(1, 2); };
  torch::Tensor q = heads(parts[0]), k = heads(parts[1]), v = heads(parts[2]);
  torch::Tensor y;
#if TORCHPILOT_TORCH_AT_LEAST(2, 0)
  if (fused_) {
    y = at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0,
                                         /*is_causal=*/true);
  }
#endif
  if (!y.defined()) {
    // nanoGPT's slow path: scores = q k^T / sqrt(dh), masked, softmax, times v.
    torch::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(double(dh)));
    namespace I = torch::indexing;
    scores = scores.masked_fill(causal_mask_.index({I::Slice(0, t), I::Slice(0, t)}),
                                -std::numeric_limits<float>::infinity());
    y = torch::matmul(torch::softmax(scores, /*dim=*/-1), v);
  }
  return linear(proj, y.transpose(1, 2).contiguous().view({b, t, d_model_}), aten_linear_);
}

BlockImpl::BlockImpl(const GptConfig& c, bool fused, const std::string& name)
    : attn_name_(name + ".attn"), mlp_name_(name + ".mlp"), aten_linear_(c.aten_linear) {
  ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d_model})));
  attn = register_module("attn", CausalSelfAttention(c, fused));
  ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d_model})));
  fc = register_module("fc", torch::nn::Linear(c.d_model, 4 * c.d_model));
  fc_out = register_module("fc_out", torch::nn::Linear(4 * c.d_model, c.d_model));
}

torch::Tensor BlockImpl::forward(torch::Tensor x) {
  // Named for torchpilot's per-module FLOP attribution (a string push/pop per call).
  {
    torchpilot::ModuleScope m(attn_name_);
    x = x + attn->forward(ln1->forward(x));
  }
  torchpilot::ModuleScope m(mlp_name_);
  return x + linear(fc_out, torch::gelu(linear(fc, ln2->forward(x), aten_linear_)), aten_linear_);
}

GptImpl::GptImpl(const GptConfig& c)
    : config_(c),
      attention_(c.attention == Attention::kFused && fused_attention_available()
                     ? Attention::kFused
                     : Attention::kUnfused) {
  if (c.d_model <= 0 || c.layers <= 0 || c.heads <= 0 || c.seq <= 0 || c.vocab <= 0) {
    throw std::invalid_argument("GPT sizes must be positive");
  }
  if (c.d_model % c.heads != 0) {
    throw std::invalid_argument("d_model " + std::to_string(c.d_model) +
                                " is not a multiple of heads " + std::to_string(c.heads));
  }
  const bool fused = attention_ == Attention::kFused;
  tok = register_module("tok", torch::nn::Embedding(c.vocab, c.d_model));
  pos = register_module("pos", torch::nn::Embedding(c.seq, c.d_model));
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.layers; ++i) {
    blocks->push_back(Block(c, fused, "blocks." + std::to_string(i)));
  }
  ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d_model})));
  head = register_module(
      "head", torch::nn::Linear(torch::nn::LinearOptions(c.d_model, c.vocab).bias(false)));

  // GPT-2 initialisation: N(0, 0.02) weights, zero biases; the projections into the residual
  // stream scaled by 1/sqrt(2 L).
  torch::NoGradGuard no_grad;
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(c.layers));
  for (auto& p : named_parameters()) {
    const std::string& name = p.key();
    torch::Tensor& w = p.value();
    if (name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0) {
      w.zero_();
    } else if (name.find(".ln") != std::string::npos || name.rfind("ln_f", 0) == 0) {
      w.fill_(1.0);  // LayerNorm gains
    } else if (name.find("proj.weight") != std::string::npos ||
               name.find("fc_out.weight") != std::string::npos) {
      w.normal_(0.0, residual_std);
    } else {
      w.normal_(0.0, 0.02);
    }
  }
}

torch::Tensor GptImpl::forward(const torch::Tensor& tokens) {
  const int64_t t = tokens.size(1);
  torch::Tensor positions =
      torch::arange(t, torch::TensorOptions().dtype(torch::kLong).device(tokens.device()));
  torch::Tensor x = tok->forward(tokens) + pos->forward(positions);
  for (const auto& block : *blocks) x = block->as<Block>()->forward(x);
  torchpilot::ModuleScope m("lm_head");
  return linear(head, ln_f->forward(x), config_.aten_linear);
}

int64_t GptImpl::parameter_count() const {
  int64_t n = 0;
  for (const auto& p : parameters()) n += p.numel();
  return n;
}

}  // namespace gpt_example
