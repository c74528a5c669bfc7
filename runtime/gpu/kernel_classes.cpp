// Kernel classes from names, and a window's time by class (kernel_classes.h).
#include "torchpilot/runtime/gpu/kernel_classes.h"

#include <algorithm>
#include <cctype>
#include <initializer_list>
#include <iterator>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "torchpilot/runtime/core/format.h"
#include "torchpilot/runtime/gpu/gpu_backend.h"
#include "torchpilot/runtime/gpu/gpu_metrics.h"
#include "torchpilot/runtime/gpu/gpu_step_stats.h"

namespace torchpilot {
namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool has(const std::string& s, std::initializer_list<const char*> words) {
  for (const char* w : words) {
    if (s.find(w) != std::string::npos) return true;
  }
  return false;
}

// The n-th (from 0) top-level template argument after `prefix<`, trimmed; empty when absent.
std::string template_arg(const std::string& s, const char* prefix, int n) {
  size_t i = s.find(prefix);
  if (i == std::string::npos) return {};
  i += std::string_view(prefix).size();
  int depth = 0, arg = 0;
  size_t start = i;
  for (; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '<' || c == '(') {
      ++depth;
    } else if ((c == '>' || c == ')') && depth > 0) {
      --depth;
    } else if ((c == ',' || c == '>') && depth == 0) {
      if (arg == n) {
        std::string a = s.substr(start, i - start);
        a.erase(0, a.find_first_not_of(' '));
        a.erase(a.find_last_not_of(' ') + 1);
        return a;
      }
      if (c == '>') return {};
      ++arg;
      start = i + 1;
    }
  }
  return {};
}

// ATen's log_softmax shares its kernels with softmax: cunn_SoftMax* name it in the epilogue,
// softmax_warp_* in their 5th template argument (is_log_softmax).
bool log_softmax(const std::string& n) {
  if (has(n, {"logsoftmax", "log_softmax"})) return true;
  for (const char* p : {"softmax_warp_forward<", "softmax_warp_backward<"}) {
    if (template_arg(n, p, 4) == "true") return true;
  }
  return false;
}

// cuBLAS's Hopper kernels: nvjet_[smNN_]<A><compute><C>_...; "sss" is fp32 in and out with
// fp32 compute (CUDA cores), any other code a tensor-core type (h fp16, t bf16/TF32, e fp8).
bool nvjet_on_tensor_cores(const std::string& n) {
  size_t i = n.find("nvjet_");
  if (i == std::string::npos) return true;
  i += 6;
  if (n.compare(i, 2, "sm") == 0) {
    const size_t u = n.find('_', i);
    if (u == std::string::npos) return true;
    i = u + 1;
  }
  return n.compare(i, 4, "sss_") != 0;
}

bool gemm_family(const std::string& n) {
  return has(n, {"gemm", "gemv", "nvjet", "xmma", "cutlass", "cublas", "matmul", "dot_kernel",
                 "convolve", "convolution", "conv1d", "conv2d", "conv3d", "conv_depthwise", "fprop",
                 "dgrad", "wgrad", "winograd"});
}

bool tensor_core_markers(const std::string& n) {
  return has(n, {"tensorop", "wgmma", "gmma", "hmma", "imma", "16816", "1688", "884", "tf32",
                 "bf16", "f16", "e4m3", "e5m2", "fp8"});
}

bool elementwise_family(const std::string& n) {
  return has(n, {"elementwise", "vectorized", "unrolled", "pointwise",   "reduce",     "norm",
                 "dropout",     "gelu",       "relu",     "silu",        "sigmoid",    "tanh",
                 "copy",        "cat",        "index",    "gather",      "scatter",    "embedding",
                 "loss",        "softmax",    "fill",     "where",       "triton_poi", "triton_red",
                 "triton_per",  "cast",       "convert",  "transpose",   "permute",    "bias",
                 "pool",        "upsample",   "sort",     "scan",        "cumsum",     "arange",
                 "rand",        "philox",     "masked",   "splitkreduce"});
}

}  // namespace

const char* to_string(KernelClass c) {
  static constexpr const char* kNames[] = {"tensor_gemm", "simt_gemm", "attention",
                                           "elementwise", "optimizer", "communication",
                                           "other"};
  static_assert(std::size(kNames) == kKernelClasses);
  return detail::enum_name(c, kNames, "other");
}

const char* label(KernelClass c) {
  static constexpr const char* kLabels[] = {"tensor-core GEMM/conv",
                                            "non-tensor (fp32/SIMT) GEMM/conv",
                                            "attention",
                                            "elementwise/normalization",
                                            "optimizer",
                                            "communication",
                                            "other kernels"};
  static_assert(std::size(kLabels) == kKernelClasses);
  return detail::enum_name(c, kLabels, "other kernels");
}

bool is_communication_kernel(std::string_view name) {
  return has(lower(name), {"nccl", "onerankreduce"});
}

KernelKind classify_kernel(std::string_view name, bool communication) {
  if (communication || is_communication_kernel(name)) return {KernelClass::kCommunication, false};
  const std::string n = lower(name);
  // Optimizers: multi-tensor (foreach, fused Adam, AMP's unscale) before anything else, since
  // their functors carry elementwise names; addcmul/addcdiv are per-parameter Adam's.
  if (has(n, {"multi_tensor_apply", "fused_adam", "fusedadam", "fused_sgd", "amp_update_scale",
              "non_finite_check_and_unscale"})) {
    return {KernelClass::kOptimizer, true};
  }
  if (has(n, {"addcmul", "addcdiv"})) return {KernelClass::kOptimizer, false};
  if (has(n, {"flash", "fmha", "attention", "sdpa"})) return {KernelClass::kAttention, true};
  if (n.find("softmax") != std::string::npos && !log_softmax(n)) {
    return {KernelClass::kAttention, false};
  }
  if (has(n, {"masked_fill"})) return {KernelClass::kAttention, false};
  if (has(n, {"splitkreduce"})) return {KernelClass::kElementwise, false};
  if (gemm_family(n)) {
    const bool tensor =
        n.find("nvjet") != std::string::npos ? nvjet_on_tensor_cores(n) : tensor_core_markers(n);
    return {tensor ? KernelClass::kTensorGemm : KernelClass::kSimtGemm, false};
  }
  if (elementwise_family(n)) return {KernelClass::kElementwise, false};
  return {KernelClass::kOther, false};
}

bool is_broadcast_add_kernel(std::string_view name) {
  const std::string n = lower(name);
  // ATen's add functor is CUDAFunctor_add (LibTorch 2.11); AddFunctor is matched too, a name
  // older builds may use.
  return n.find("native::elementwise_kernel<") != std::string::npos &&
         has(n, {"cudafunctor_add", "addfunctor"});
}

bool gemm_has_bias_epilogue(std::string_view name) {
  return lower(name).find("bias") != std::string::npos;
}

bool is_convolution_kernel(std::string_view name) {
  return has(lower(name), {"conv", "fprop", "dgrad", "wgrad", "winograd", "implicit", "cudnn"});
}

double KernelClassStats::busy_ns() const {
  double sum = 0;
  for (double v : ns) sum += v;
  return sum;
}

void KernelClassStats::add(const KernelClassStats& o) {
  steps += o.steps;
  traced_ns += o.traced_ns;
  for (int i = 0; i < kKernelClasses; ++i) {
    ns[static_cast<size_t>(i)] += o.ns[static_cast<size_t>(i)];
    launches[static_cast<size_t>(i)] += o.launches[static_cast<size_t>(i)];
  }
  idle_ns += o.idle_ns;
  fused_attention_ns += o.fused_attention_ns;
  fused_optimizer_ns += o.fused_optimizer_ns;
  per_parameter_optimizer_launches += o.per_parameter_optimizer_launches;
  memcpy_ns += o.memcpy_ns;
  memset_ns += o.memset_ns;
  memcpys += o.memcpys;
  memsets += o.memsets;
  kernel_sum_ns += o.kernel_sum_ns;
  kernel_sum_scaled_ns += o.kernel_sum_scaled_ns;
  unfused_attention_pieces_ns += o.unfused_attention_pieces_ns;
  unfused_attention_gemm_ns += o.unfused_attention_gemm_ns;
  unfused_attention_softmaxes += o.unfused_attention_softmaxes;
  unfused_attention_launches += o.unfused_attention_launches;
  unfused_bias_add_ns += o.unfused_bias_add_ns;
  unfused_bias_gemm_ns += o.unfused_bias_gemm_ns;
  unfused_bias_adds += o.unfused_bias_adds;
}

namespace {

// What a kernel's name says: its class, and the flags the unfused-attention and unfused-bias
// sequences read.
struct NameFacts {
  KernelKind kind;
  bool gemm = false;
  bool softmax = false, backward = false;  // an unfused attention's softmax (backward's)
  // A matrix GEMM (not a convolution: its bias is a separate add too, on ATen's cuDNN path, but
  // torch::linear is no fix for it) that adds no bias in its epilogue; a broadcast add; a split-K
  // reduction (cuBLASLt's, between a GEMM and what follows it).
  bool gemm_no_bias = false, broadcast_add = false, split_k = false;
};

NameFacts name_facts(const std::string& name, bool communication) {
  NameFacts f;
  f.kind = classify_kernel(name, communication);
  const KernelClass c = f.kind.cls;
  f.gemm = c == KernelClass::kTensorGemm || c == KernelClass::kSimtGemm;
  const std::string n = lower(name);
  if (c == KernelClass::kAttention && !f.kind.fused) {  // softmax or masked fill
    f.softmax = n.find("softmax") != std::string::npos;
    f.backward = n.find("backward") != std::string::npos;
  }
  if (f.gemm) f.gemm_no_bias = !gemm_has_bias_epilogue(n) && !is_convolution_kernel(n);
  if (c == KernelClass::kElementwise) {
    f.broadcast_add = is_broadcast_add_kernel(n);
    f.split_k = n.find("splitkreduce") != std::string::npos;
  }
  return f;
}

// The tests above lower-case and search names of hundreds of characters: about 4 us a kernel
// for names like LibTorch's (CPU machine), most of the ~13 ms a traced batch-32 GPT step of 3,000
// kernels took to finish on the H100's training thread. A model launches a few hundred distinct
// names, so each is looked at once per thread (bounded: a run that keeps making new names starts
// the cache over).
NameFacts name_facts_cached(const std::string& name, bool communication) {
  if (communication) return {{KernelClass::kCommunication, false}};
  constexpr size_t kMaxNames = 4096;
  thread_local std::unordered_map<std::string, NameFacts> cache;
  const auto it = cache.find(name);
  if (it != cache.end()) return it->second;
  if (cache.size() >= kMaxNames) cache.clear();
  return cache.emplace(name, name_facts(name, false)).first->second;
}

// A kernel that started in the step, for the unfused-attention segments and unfused biases.
struct Launched {
  const KernelRecord* k;
  NameFacts f;  // a copy: the cache may start over while the step's kernels are read
};

// Kernels between a softmax and its bounding GEMMs are few (scale, mask, casts, dropout): a
// softmax with no GEMM this near on a side is not an attention's there.
constexpr int kMaxPiecesPerSide = 8;
constexpr int kMaxSkippedBetweenGemms = 2;  // e.g. a copy between backward's two GEMMs

// From `from` in direction `dir`: the first GEMM with at most `limit` other kernels before it
// and no softmax among them, else -1. The kernels passed go to `passed` when given.
int gemm_from(const std::vector<Launched>& seq, int from, int dir, int limit,
              std::vector<int>* passed) {
  int count = 0;
  for (int j = from + dir; j >= 0 && j < static_cast<int>(seq.size()); j += dir) {
    const Launched& l = seq[static_cast<size_t>(j)];
    if (l.f.gemm) return j;
    if (l.f.softmax || count == limit) return -1;
    ++count;
    if (passed != nullptr) passed->push_back(j);
  }
  return -1;
}

// The segments of unfused attentions in one stream's kernels of a step, in launch order: around
// each softmax the kernels up to the nearest GEMM on either side, and the GEMMs that bound them
// (one a side in forward, two in backward).
void add_unfused_attention(KernelClassStats& s, const std::vector<Launched>& seq) {
  std::vector<bool> counted(seq.size(), false);
  auto take = [&](int i, double& into) {
    if (counted[static_cast<size_t>(i)]) return;
    counted[static_cast<size_t>(i)] = true;
    ++s.unfused_attention_launches;
    const KernelRecord& k = *seq[static_cast<size_t>(i)].k;
    into += static_cast<double>(k.end - k.begin);
  };
  for (int i = 0; i < static_cast<int>(seq.size()); ++i) {
    const Launched& softmax = seq[static_cast<size_t>(i)];
    if (!softmax.f.softmax) continue;
    std::vector<int> pieces, gemms;
    bool bounded = true;
    for (int dir : {-1, +1}) {
      const int g = gemm_from(seq, i, dir, kMaxPiecesPerSide, &pieces);
      bounded = bounded && g >= 0;
      if (!bounded) break;
      gemms.push_back(g);
      const int second =
          softmax.f.backward ? gemm_from(seq, g, dir, kMaxSkippedBetweenGemms, nullptr) : -1;
      if (second >= 0) gemms.push_back(second);
    }
    if (!bounded) continue;
    ++s.unfused_attention_softmaxes;
    take(i, s.unfused_attention_pieces_ns);
    for (int j : pieces) take(j, s.unfused_attention_pieces_ns);
    for (int j : gemms) take(j, s.unfused_attention_gemm_ns);
  }
}

// An additive attention mask or position bias (scores = q k^T, += mask, softmax) is a broadcast
// add after a GEMM too: a softmax this near after the add, before any GEMM, says so.
constexpr int kMaskToSoftmax = 4;

// Biases added outside their GEMMs in one stream's kernels of a step, in launch order: a matrix
// GEMM without a bias epilogue followed by a broadcast add (a split-K reduction between them
// allowed), no softmax right after it.
void add_unfused_bias(KernelClassStats& s, const std::vector<Launched>& seq) {
  const int n = static_cast<int>(seq.size());
  auto at = [&](int i) -> const Launched& { return seq[static_cast<size_t>(i)]; };
  for (int i = 1; i < n; ++i) {
    if (!at(i).f.broadcast_add) continue;
    const int g = at(i - 1).f.split_k && i >= 2 ? i - 2 : i - 1;
    if (!at(g).f.gemm_no_bias) continue;
    bool mask = false;
    for (int j = i + 1; j < n && j <= i + kMaskToSoftmax && !at(j).f.gemm; ++j) {
      if (at(j).f.softmax) {
        mask = true;
        break;
      }
    }
    if (mask) continue;
    ++s.unfused_bias_adds;
    s.unfused_bias_add_ns += static_cast<double>(at(i).k->end - at(i).k->begin);
    s.unfused_bias_gemm_ns += static_cast<double>(at(g).k->end - at(g).k->begin);
  }
}

}  // namespace

void add_kernel_classes(KernelClassStats& stats, const GpuEventBatch& events,
                        const StepSpans& spans, int sm_count, const KernelIndex* kernel_index) {
  if (!spans.traced) return;
  const Interval span = spans.traced_part();
  if (span.end <= span.begin) return;
  KernelClassStats s;
  s.steps = 1;
  s.traced_ns = span.end - span.begin;

  // Sweep over the kernels' start and end points: each stretch of time is shared equally by the
  // kernels running in it (kind: class, and 2 extra slots for the fused parts).
  struct Point {
    Nanos t;
    int delta;
    KernelKind kind;
  };
  std::optional<KernelIndex> own_index;
  if (kernel_index == nullptr) kernel_index = &own_index.emplace(events.kernels);
  const KernelRange in_span = kernel_index->overlapping(span);
  std::vector<Point> points;
  points.reserve(in_span.size() * 2);
  std::vector<Launched> started;  // not communication, in the step it started in
  const double sms = static_cast<double>(std::max(1, sm_count));
  for (const KernelRecord& k : in_span) {
    const Nanos b = std::max(k.begin, span.begin), e = std::min(k.end, span.end);
    if (e <= b) continue;
    const NameFacts facts = name_facts_cached(k.name, k.communication);
    const KernelKind& kind = facts.kind;
    const auto c = static_cast<size_t>(kind.cls);
    if (k.begin >= span.begin) {  // counted in the step it started in, as GpuStats::kernels
      ++s.launches[c];
      if (kind.cls == KernelClass::kOptimizer && !kind.fused) ++s.per_parameter_optimizer_launches;
      if (kind.cls != KernelClass::kCommunication) started.push_back({&k, facts});
    }
    points.push_back({b, +1, kind});
    points.push_back({e, -1, kind});
    // A kernel that fills the GPU (a wave or more) takes factor x as long at factor x the batch;
    // one that leaves SMs free grows only once its blocks fill them.
    const double d = static_cast<double>(e - b);
    const double waves = static_cast<double>(k.blocks) / sms;
    s.kernel_sum_ns += d;
    s.kernel_sum_scaled_ns +=
        d * std::max(1.0, kLaunchBoundBatchFactor * waves) / std::max(1.0, waves);
  }
  std::sort(points.begin(), points.end(), [](const Point& a, const Point& b) { return a.t < b.t; });
  std::array<int, kKernelClasses> active{};
  int fused_attention = 0, fused_optimizer = 0, running = 0;
  Nanos prev = span.begin;
  double busy = 0;
  for (const Point& p : points) {
    if (p.t > prev && running > 0) {
      const double share = static_cast<double>(p.t - prev) / running;
      for (size_t c = 0; c < active.size(); ++c) s.ns[c] += share * active[c];
      s.fused_attention_ns += share * fused_attention;
      s.fused_optimizer_ns += share * fused_optimizer;
      busy += static_cast<double>(p.t - prev);
    }
    prev = std::max(prev, p.t);
    active[static_cast<size_t>(p.kind.cls)] += p.delta;
    running += p.delta;
    if (p.kind.fused && p.kind.cls == KernelClass::kAttention) fused_attention += p.delta;
    if (p.kind.fused && p.kind.cls == KernelClass::kOptimizer) fused_optimizer += p.delta;
  }
  s.idle_ns = static_cast<double>(s.traced_ns) - busy;

  // Unfused attentions and biases, stream by stream in launch order.
  std::stable_sort(started.begin(), started.end(), [](const Launched& a, const Launched& b) {
    return a.k->stream != b.k->stream ? a.k->stream < b.k->stream : a.k->begin < b.k->begin;
  });
  for (auto first = started.begin(); first != started.end();) {
    const auto last = std::find_if(
        first, started.end(), [&](const Launched& l) { return l.k->stream != first->k->stream; });
    const std::vector<Launched> stream(first, last);
    if (std::any_of(first, last, [](const Launched& l) { return l.f.softmax; })) {
      add_unfused_attention(s, stream);
    }
    add_unfused_bias(s, stream);
    first = last;
  }

  std::vector<Interval> copies, memsets;
  for (const CopyRecord& c : events.copies) {
    const Interval i{std::max(c.begin, span.begin), std::min(c.end, span.end)};
    if (i.end <= i.begin) continue;
    (c.memset ? memsets : copies).push_back(i);
    if (c.begin >= span.begin) ++(c.memset ? s.memsets : s.memcpys);
  }
  s.memcpy_ns = union_length(copies, span);
  s.memset_ns = union_length(memsets, span);
  stats.add(s);
}

}  // namespace torchpilot
