// A GPT-style decoder-only language model (GPT-2 layout, as nanoGPT): token + learned position
// embeddings, `layers` pre-LayerNorm blocks (causal self-attention with a fused QKV Linear and an
// output projection; an MLP d -> 4d -> d with GELU), a final LayerNorm and an LM head. The LM
// head is a separate V x d Linear without bias, NOT tied to the token embedding (gpt_flops.h
// counts it among the matmul weights N). Dropout is 0 (none).
//
// Attention:
//  - kFused:   at::scaled_dot_product_attention(q, k, v, is_causal=true) (LibTorch >= 2.0; on
//              CUDA a flash / memory-efficient kernel).
//  - kUnfused: softmax(mask(q k^T / sqrt(d_head))) v as two batched matmuls around a
//              materialised T x T score matrix: the pattern the fusion advisor looks for.
// Linear layers (qkv, proj, fc, fc_out; the LM head has no bias):
//  - aten_linear (default): torch::linear(x, weight, bias), ATen's linear, as Python's F.linear:
//              a [B, T, d] input runs as one GEMM with the bias in its epilogue.
//  - otherwise: the modules' forward, LibTorch's C++ torch::nn::functional::linear, which for
//              inputs of more than 2 dims runs matmul, then `output += bias` as a separate
//              broadcast add (in bf16 autocast, a mixed-dtype one in ATen's generic kernel): the
//              pattern the unfused_linear_bias advice looks for. Same results.
// On LibTorch 1.x, kFused is not available: the model runs the unfused path
// (fused_attention_available() says so; the trainer logs it once).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>

namespace gpt_example {

enum class Attention { kFused, kUnfused };
const char* to_string(Attention attention);
// Whether this LibTorch has at::scaled_dot_product_attention.
bool fused_attention_available();

struct GptConfig {
  int64_t vocab = 256;
  int64_t d_model = 256;
  int64_t layers = 4;
  int64_t heads = 4;  // must divide d_model
  int64_t seq = 256;  // longest sequence (position embeddings)
  Attention attention = Attention::kFused;
  bool aten_linear = true;  // torch::linear, else the Linear modules' forward (above)
};

// A Linear layer's forward as `config` says: torch::linear, else the module's.
torch::Tensor linear(torch::nn::Linear& layer, const torch::Tensor& x, bool aten_linear);

class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  CausalSelfAttentionImpl(const GptConfig& config, bool fused);
  torch::Tensor forward(const torch::Tensor& x);  // [B, T, d] -> [B, T, d]

  torch::nn::Linear qkv{nullptr}, proj{nullptr};

 private:
  int64_t heads_, d_model_;
  bool fused_, aten_linear_;
  torch::Tensor causal_mask_;  // [seq, seq] bool, true above the diagonal (unfused path)
};
TORCH_MODULE(CausalSelfAttention);

class BlockImpl : public torch::nn::Module {
 public:
  // `name` ("blocks.3") names the block's attention and MLP for FLOP attribution.
  BlockImpl(const GptConfig& config, bool fused, const std::string& name = "block");
  torch::Tensor forward(torch::Tensor x);

  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  CausalSelfAttention attn{nullptr};
  torch::nn::Linear fc{nullptr}, fc_out{nullptr};

 private:
  std::string attn_name_, mlp_name_;
  bool aten_linear_;
};
TORCH_MODULE(Block);

class GptImpl : public torch::nn::Module {
 public:
  explicit GptImpl(const GptConfig& config);
  // tokens [B, T] int64 (T <= seq) -> logits [B, T, vocab].
  torch::Tensor forward(const torch::Tensor& tokens);

  const GptConfig& config() const { return config_; }
  // The attention path actually run (kUnfused when kFused is not available).
  Attention attention() const { return attention_; }
  int64_t parameter_count() const;  // all parameters

  torch::nn::Embedding tok{nullptr}, pos{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear head{nullptr};

 private:
  GptConfig config_;
  Attention attention_;
};
TORCH_MODULE(Gpt);

}  // namespace gpt_example
