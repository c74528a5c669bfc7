#include "torchpilot/runtime/analyze/frontend_actions.h"

#include <algorithm>
#include <map>

namespace torchpilot {

std::string python_action(const std::string& id) {
  static const std::map<std::string, std::string> kPython = {
      {"data_starvation",
       "load in worker processes ahead of the step: DataLoader(..., num_workers=N, "
       "persistent_workers=True, prefetch_factor=2..4, pin_memory=True), N up to the CPU cores "
       "the job may use (more for loaders that wait on storage rather than compute)"},
      {"host_sync",
       "keep values on the GPU and read them every N steps (accumulate the loss in a tensor; "
       "loss.item(), float(t), print(t) and .cpu() each wait for the GPU), copy with "
       ".to(device, non_blocking=True) from pinned memory, avoid ops whose output size depends on "
       "the data (nonzero, masked_select, unique, boolean indexing) in the step, and remove "
       "torch.cuda.synchronize() calls"},
      {"pageable_copies",
       "pin the batches (DataLoader(..., pin_memory=True), or tensor.pin_memory()) and copy with "
       ".to(device, non_blocking=True)"},
      {"launch_bound",
       "give each launch more work (a larger batch, with gradient accumulation to keep the global "
       "batch), fuse ops with torch.compile(model), or capture the step in a CUDA graph "
       "(torch.compile(model, mode=\"reduce-overhead\"), or torch.cuda.CUDAGraph)"},
      {"host_bound",
       "move host work off the training loop: decoding, augmentation and collation into "
       "DataLoader workers (num_workers), per-sample Python loops into batched tensor ops; "
       "torch.compile(model) cuts the Python overhead of each op"},
      {"fp32_matmul",
       "compute forward and loss in bf16 under torch.autocast(\"cuda\", dtype=torch.bfloat16), "
       "keeping fp32 weights and optimizer state; or, with numerics closer to fp32, allow TF32: "
       "torch.set_float32_matmul_precision(\"high\")"},
      {"unfused_attention",
       "replace it with torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=..., "
       "is_causal=...), which runs a fused flash or memory-efficient kernel"},
      {"unfused_linear_bias",
       "use torch.nn.functional.linear(x, weight, bias) (nn.Linear does), which adds the bias in "
       "the GEMM"},
      {"per_parameter_optimizer",
       "use the fused optimizer: torch.optim.AdamW(params, fused=True) (or foreach=True)"},
      {"exposed_communication",
       "overlap the gradient all-reduce with backward: DistributedDataParallel does (its "
       "bucket_cap_mb sets the buckets), rather than all-reducing after backward by hand"},
      {"low_bus_bandwidth",
       "fewer, larger all-reduces: DistributedDataParallel(bucket_cap_mb=...) larger buckets; "
       "NCCL_DEBUG=INFO shows the transport NCCL chose"},
      {"memory_pressure",
       "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against fragmentation, recompute "
       "activations (torch.utils.checkpoint), or a smaller micro-batch with gradient "
       "accumulation"},
      {"checkpoint",
       "save off the training thread: torch.distributed.checkpoint.async_save, or copy the state "
       "to pinned CPU memory and write it from a background thread"},
  };
  const auto it = kPython.find(id);
  return it == kPython.end() ? std::string() : it->second;
}

namespace {

// The advisor's estimate at the end of its action: from the earliest clause outside parentheses
// that starts with "estimated" or says what the gain rests on ("the gain ...", "no gain ...");
// "" when none.
std::string estimate_clause(const std::string& action) {
  size_t best = std::string::npos;
  for (const char* lead : {"; estimated", ". Estimated", "; the gain", "; no gain", ". The gain"}) {
    for (size_t at = action.find(lead); at != std::string::npos && at < best;
         at = action.find(lead, at + 1)) {
      const auto open = std::count(action.begin(), action.begin() + static_cast<long>(at), '(');
      const auto close = std::count(action.begin(), action.begin() + static_cast<long>(at), ')');
      if (open == close) {
        best = at;
        break;
      }
    }
  }
  return best == std::string::npos ? std::string() : action.substr(best + 2);
}

}  // namespace

void use_frontend_actions(const std::string& frontend, std::vector<Advice>& advice) {
  if (frontend != "python") return;
  for (Advice& a : advice) {
    std::string action = python_action(a.id);
    if (action.empty()) continue;
    std::string estimate = estimate_clause(a.action);
    if (!estimate.empty() && estimate[0] == 'E') estimate[0] = 'e';  // after "; "
    a.action = estimate.empty() ? action : action + "; " + estimate;
  }
}

}  // namespace torchpilot
