// Analytic FLOPs of the GPT example's training step (pure, no LibTorch), to check the FLOP
// counter's count against. The convention is PaLM's (Chowdhery et al. 2022, appendix B) and
// nanoGPT's estimate_mfu:
//
//   model FLOPs per step = 6 * N * tokens + 12 * B * L * T^2 * d
//
//   tokens = B * T (batch x sequence), d = width, L = layers, V = vocabulary (256, bytes).
//   N      = the matmul weights a token passes through: per block the fused QKV projection
//            (3 d^2), the attention output projection (d^2) and the MLP (4 d^2 + 4 d^2), plus the
//            LM head (V d; untied from the token embedding in this example, no bias):
//            N = 12 L d^2 + V d. Not in N: the token and position embeddings (lookups, not
//            matmuls), biases and LayerNorm gains (element-wise).
//   6 N tokens: 2 N per token forward (multiply + add), 4 N backward (gradient of the input and
//            of the weight, one matmul each).
//   attention: per layer and sequence the forward runs Q K^T (2 T^2 d) and A V (2 T^2 d), so
//            2 * 2 * B * L * T^2 * d forward, and x3 for forward + backward (the backward runs
//            two matmuls for each forward one; a flash kernel's recomputation of Q K^T is
//            hardware FLOPs, not model FLOPs). The full T x T square is counted even though a
//            causal kernel skips the masked half: that is the PaLM/nanoGPT convention and what
//            torch.utils.flop_counter counts for scaled_dot_product_attention.
// Not counted anywhere: softmax, masking, LayerNorm, GELU, residual adds, the loss, the optimizer
// (element-wise, a few percent of a matmul-dominated step, and not "model FLOPs" by convention).
#pragma once

#include <cstdint>

namespace gpt_example {

struct GptShape {
  int64_t vocab = 256;
  int64_t d_model = 0;
  int64_t layers = 0;
  int64_t seq = 0;    // T
  int64_t batch = 0;  // B
};

// N: the matmul weights of the blocks and the LM head (see above).
constexpr int64_t matmul_params(const GptShape& s) {
  return 12 * s.layers * s.d_model * s.d_model + s.vocab * s.d_model;
}

constexpr int64_t tokens_per_step(const GptShape& s) { return s.batch * s.seq; }

// 6 N tokens: the weight matmuls, forward and backward.
constexpr double matmul_flops_per_step(const GptShape& s) {
  return 6.0 * static_cast<double>(matmul_params(s)) * static_cast<double>(tokens_per_step(s));
}

// 3 x 2 x 2 B L T^2 d: Q K^T and A V, forward and backward, the full T x T square.
constexpr double attention_flops_per_step(const GptShape& s) {
  return 12.0 * static_cast<double>(s.batch) * static_cast<double>(s.layers) *
         static_cast<double>(s.seq) * static_cast<double>(s.seq) * static_cast<double>(s.d_model);
}

constexpr double model_flops_per_step(const GptShape& s) {
  return matmul_flops_per_step(s) + attention_flops_per_step(s);
}

}  // namespace gpt_example
