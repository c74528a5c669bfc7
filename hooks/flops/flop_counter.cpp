// FlopCounter: RecordFunction callbacks -> FlopTally (flop_accumulation.h) in counting windows.
#include "torchpilot/hooks/flops/flop_counter.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <c10/core/ScalarType.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "torchpilot/hooks/core/compat.h"
#include "torchpilot/runtime/flops/attention_detector.h"
#include "torchpilot/runtime/flops/flop_formulas.h"

#if defined(TORCHPILOT_TORCH_CUDA) && TORCHPILOT_TORCH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

namespace torchpilot {
namespace {

// ---- state shared by the callbacks (process-wide; the callbacks are plain functions) ------------

struct Shared {
  std::mutex mu;
  FlopTally tally;                       // the open window's ops (guarded by mu)
  std::atomic<uint64_t> generation{1};   // bumped when a window opens: threads reset
  std::atomic<bool> tf32_matmul{false};  // read at the window's start
  std::atomic<bool> tf32_conv{false};
  // Forward op's autograd sequence number -> the module it ran in (guarded by mu; per window).
  std::unordered_map<int64_t, std::string> seq_module;
};

Shared& shared() {
  static Shared* s = new Shared();  // never destroyed: callbacks may run during exit
  return *s;
}

std::atomic<FlopCounter*> g_owner{nullptr};

thread_local int t_recompute_depth = 0;
thread_local std::vector<std::string> t_modules;  // open ModuleScopes on this thread

// A tracked op in flight on a thread (the RecordFunction owns it between start and end).
struct Frame final : at::ObserverContext {
  Frame* parent = nullptr;
  uint64_t generation = 0;
  OpKind kind = OpKind::kUntracked;
  bool has_child = false;  // a tracked op of the same class ran inside: this one is no leaf
  bool recompute = false;
  bool inside_sdpa = false;
  bool module_marker = false;  // a backward function whose forward op ran in a named module
  double flops = 0;            // NaN: the arguments could not be read
  double recompute_flops = 0;  // recomputed inside the op (fused attention backward)
  MathPrecision precision = MathPrecision::kOther;
  std::optional<MatmulShapes> matmul;
  std::optional<Shape> softmax;
  int64_t element_bytes = 4;
};

struct ThreadState {
  uint64_t generation = 0;
  Frame* top = nullptr;  // innermost tracked op open on this thread
  int sdpa_depth = 0;    // open aten::scaled_dot_product_attention (composite) calls
  AttentionDetector detector;
  std::vector<std::string> backward_modules;  // modules of the backward functions open here
};

ThreadState& thread_state() {
  thread_local ThreadState t;
  const uint64_t g = shared().generation.load(std::memory_order_acquire);
  if (t.generation != g) {  // a new window: forget whatever the last one left open
    t.generation = g;
    t.top = nullptr;
    t.sdpa_depth = 0;
    t.detector.reset();
    t.backward_modules.clear();
  }
  return t;
}

OpArg convert(const c10::IValue& v) {
  OpArg a;
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (!t.defined()) return OpArg::none();
    if (t.is_nested()) return a;  // kOther: nested sizes are not one shape
    a.kind = OpArg::Kind::kTensor;
    a.ints = t.sizes().vec();
    a.dtype = c10::toString(t.scalar_type());
    a.cuda = t.is_cuda();
  } else if (v.isInt()) {
    a = OpArg::integer(v.toInt());
  } else if (v.isIntList()) {
    a = OpArg::int_list(v.toIntVector());
  } else if (v.isBool()) {
    a = OpArg::boolean(v.toBool());
  } else if (v.isBoolList()) {
    a.kind = OpArg::Kind::kBoolList;
    const auto list = v.toBoolList();
    for (size_t i = 0; i < list.size(); ++i) a.ints.push_back(list.get(i) ? 1 : 0);
  } else if (v.isDouble()) {
    a = OpArg::real_number(v.toDouble());
  } else if (v.isNone()) {
    a = OpArg::none();
  }
  return a;
}

// Marks the nearest open op of the same class (formula ops vs softmax markers) as no leaf.
void mark_parent(Frame* top, OpKind kind) {
  for (Frame* f = top; f != nullptr; f = f->parent) {
    if (has_formula(f->kind) == has_formula(kind)) {
      f->has_child = true;
      return;
    }
  }
}

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  try {
    const char* name = fn.name();
    if (name == nullptr) return nullptr;
    if (fn.scope() == at::RecordScope::BACKWARD_FUNCTION) {
      // A backward node runs: its ops count for the module its forward op ran in.
      const int64_t seq = fn.seqNr();
      if (seq < 0) return nullptr;
      std::string module;
      {
        Shared& s = shared();
        std::lock_guard<std::mutex> lock(s.mu);
        const auto it = s.seq_module.find(seq);
        if (it == s.seq_module.end()) return nullptr;
        module = it->second;
      }
      ThreadState& ts = thread_state();
      auto frame = std::make_unique<Frame>();
      frame->generation = ts.generation;
      frame->module_marker = true;
      ts.backward_modules.push_back(std::move(module));
      return frame;
    }
    const OpKind kind = op_kind(name);
    if (kind == OpKind::kUntracked) return nullptr;
    ThreadState& ts = thread_state();
    auto frame = std::make_unique<Frame>();
    frame->generation = ts.generation;
    frame->kind = kind;
    if (kind == OpKind::kAttentionComposite) {
      ++ts.sdpa_depth;
      return frame;
    }
    frame->recompute = t_recompute_depth > 0;
    frame->inside_sdpa = ts.sdpa_depth > 0;
    if (!t_modules.empty() && fn.scope() == at::RecordScope::FUNCTION && fn.seqNr() >= 0) {
      // The autograd node this op makes carries this sequence number into the backward pass.
      Shared& s = shared();
      std::lock_guard<std::mutex> lock(s.mu);
      s.seq_module[fn.seqNr()] = t_modules.back();
    }
    OpArgs args;
    try {
      const auto inputs = fn.inputs();
      args.reserve(inputs.size());
      for (const c10::IValue& v : inputs) args.push_back(convert(v));
    } catch (...) {
      args.clear();  // unreadable: the formula gives NaN and the call counts as unparsed
    }
    if (has_formula(kind)) {
      frame->flops = op_flops(name, args);
      frame->recompute_flops = op_recompute_flops(name, args);
      const MathFlags flags{shared().tf32_matmul.load(std::memory_order_relaxed),
                            shared().tf32_conv.load(std::memory_order_relaxed)};
      frame->precision = op_precision(name, args, flags);
      if (kind == OpKind::kMatmul) frame->matmul = matmul_shapes(name, args);
    } else {
      frame->softmax = softmax_shape(name, args);
      if (!args.empty()) frame->element_bytes = dtype_bytes(args[0].dtype);
    }
    mark_parent(ts.top, kind);
    frame->parent = ts.top;
    ts.top = frame.get();
    return frame;
  } catch (...) {
    return nullptr;
  }
}

void on_end(const at::RecordFunction& fn, at::ObserverContext* ctx) {
  if (ctx == nullptr) return;
  try {
    Frame* f = static_cast<Frame*>(ctx);
    ThreadState& ts = thread_state();
    if (f->generation != ts.generation) return;  // started before the window opened
    if (f->module_marker) {
      if (!ts.backward_modules.empty()) ts.backward_modules.pop_back();
      return;
    }
    if (f->kind == OpKind::kAttentionComposite) {
      if (ts.sdpa_depth > 0) --ts.sdpa_depth;
      return;
    }
    ts.top = f->parent;
    if (f->has_child) return;  // not a leaf: its inner op counted
    if (has_formula(f->kind)) {
      AttentionDelta delta;
      if (f->kind == OpKind::kMatmul && f->matmul && !f->recompute && f->flops >= 0) {
        delta = ts.detector.on_matmul(*f->matmul, f->flops);
      }
      Shared& s = shared();
      std::lock_guard<std::mutex> lock(s.mu);
      if (std::isnan(f->flops)) {
        s.tally.add_unparsed();
      } else {
        std::string_view module;  // the backward node's module, else the open ModuleScope
        if (!ts.backward_modules.empty()) {
          module = ts.backward_modules.back();
        } else if (!t_modules.empty()) {
          module = t_modules.back();
        }
        s.tally.add(fn.name(), f->kind, f->precision, f->flops, f->recompute, module);
        if (f->recompute_flops > 0) {
          s.tally.add(fn.name(), f->kind, f->precision, f->recompute_flops, /*recompute=*/true);
        }
      }
      if (delta.any()) s.tally.add_attention(delta);
    } else if (f->softmax && !f->recompute) {
      // on_softmax never confirms by itself (a matmul after it does); nothing to add here.
      ts.detector.on_softmax(*f->softmax, f->element_bytes, f->kind == OpKind::kSoftmaxBackward,
                             f->inside_sdpa);
    }
  } catch (...) {
  }
}

bool tf32_matmul_allowed() {
  try {
    return at::globalContext().allowTF32CuBLAS();
  } catch (...) {  // 2.9+ rejects mixing the legacy and the fp32_precision APIs
    return false;
  }
}

bool tf32_conv_allowed() {
  try {
    return at::globalContext().allowTF32CuDNN();
  } catch (...) {
    return false;
  }
}

std::string cuda_device_name(int index) {
#if defined(TORCHPILOT_TORCH_CUDA) && TORCHPILOT_TORCH_CUDA
  try {
    if (at::cuda::is_available() && index >= 0 && index < at::cuda::device_count()) {
      return at::cuda::getDeviceProperties(index)->name;
    }
  } catch (...) {
  }
#else
  (void)index;
#endif
  return "";
}

std::string gflops(double f) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", f / 1e9);
  return buf;
}

}  // namespace

// ---- ModuleScope
// ----------------------------------------------------------------------------------

ModuleScope::ModuleScope(std::string name) { t_modules.push_back(std::move(name)); }

ModuleScope::~ModuleScope() {
  if (!t_modules.empty()) t_modules.pop_back();
}

// ---- RecomputeScope
// -------------------------------------------------------------------------------

FlopCounter::RecomputeScope::RecomputeScope() : active_(true) { ++t_recompute_depth; }

FlopCounter::RecomputeScope::~RecomputeScope() {
  if (active_ && t_recompute_depth > 0) --t_recompute_depth;
}

FlopCounter::RecomputeScope::RecomputeScope(RecomputeScope&& other) noexcept
    : active_(other.active_) {
  other.active_ = false;
}

// ---- FlopCounter
// ----------------------------------------------------------------------------------

FlopCounter::FlopCounter(Pilot& pilot) : pilot_(&pilot), planner_(pilot.config().flops) {
  const Config& config = pilot.config();
  if (config.mode == Mode::kOff) return;
  const auto info = [&pilot](const std::string& m) { pilot.log(LogLevel::kInfo, m); };
  const auto warn = [&pilot](const std::string& m) { pilot.log(LogLevel::kWarn, m); };
  const std::string device = cuda_device_name(config.gpu.device);
  peak_ = resolve_peak(device, config.flops.peak_tflops);
  if (config.flops.allow_tf32) {
    try {
      at::globalContext().setAllowTF32CuBLAS(true);
      info("FLOP counter: TF32 turned on for fp32 matmuls (flops.allow_tf32)");
    } catch (const std::exception& e) {
      warn(std::string("FLOP counter: could not turn on TF32 (flops.allow_tf32): ") + e.what());
    }
  }
  FlopCounter* expected = nullptr;
  if (!g_owner.compare_exchange_strong(expected, this)) {
    warn("FLOP counter: another FlopCounter is counting; this one stays inert");
    return;
  }
  try {
    handle_ = at::addGlobalCallback(
        at::RecordFunctionCallback(&on_start, &on_end)
            .needsInputs(true)
            .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}));
    at::disableCallback(handle_);
  } catch (const std::exception& e) {
    g_owner.store(nullptr);
    warn(std::string("FLOP counter off: RecordFunction callback not added: ") + e.what());
    return;
  }
  active_ = true;
  hooks_ = wanted_hooks();
  pilot.add_collector(this);
  if (peak_.any()) {
    info("FLOP counter: device '" + (device.empty() ? std::string("cpu") : device) +
         "', peak from " + peak_.source);
  } else {
    info("FLOP counter: " +
         (device.empty() ? std::string("no CUDA device")
                         : "device '" + device + "' is not in the peak table") +
         "; FLOPs are counted, MFU is not reported (set flops.peak_tflops)");
  }
}

FlopCounter::~FlopCounter() {
  if (pilot_ != nullptr) pilot_->remove_collector(this);
  if (!active_) return;
  try {
    at::disableCallback(handle_);
    at::removeCallback(handle_);
  } catch (...) {
  }
  g_owner.store(nullptr);
}

void FlopCounter::attach(CollectorHost* host) {
  host_ = host;
  if (host != nullptr) return;  // added by the constructor: pilot_ is the host
  pilot_ = nullptr;
  // No more steps will come: a counting window left open would box every op from now on.
  if (active_ && window_open_) {
    try {
      at::disableCallback(handle_);
    } catch (...) {
    }
    window_open_ = false;
  }
}

void FlopCounter::recount() {
  if (!active_) return;
  // The next step is counted; the steps before it that still wait for their figures (a batch)
  // keep the counts they ran under: those are forgotten at the next step's record.
  planner_.start_counting();
  // The step begun last: inside one, that step (it ran under the old counts); between steps,
  // the one that ended.
  recount_after_ = pilot_ == nullptr ? -1 : pilot_->steps() - (pilot_->step_open() ? 0 : 1);
  refresh_hooks();
}

unsigned FlopCounter::wanted_hooks() const {
  if (!active_) return 0;
  return kHookStepRecord | (planner_.counting() ? kHookStepBegin : 0u) |
         (window_open_ ? kHookStepEnd : 0u);
}

void FlopCounter::refresh_hooks() {
  const unsigned want = wanted_hooks();
  if (want == hooks_ || host_ == nullptr) return;
  hooks_ = want;
  host_->set_step_hooks(*this, want);
}

bool FlopCounter::counting() const { return active_ && planner_.counting(); }

int64_t FlopCounter::windows() const { return planner_.windows(); }

void FlopCounter::open_window() {
  Shared& s = shared();
  s.tf32_matmul.store(tf32_matmul_allowed(), std::memory_order_relaxed);
  s.tf32_conv.store(tf32_conv_allowed(), std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.tally.clear();
    s.seq_module.clear();
  }
  s.generation.fetch_add(1, std::memory_order_acq_rel);
  at::reenableCallback(handle_);
  window_open_ = true;
}

StepFlops FlopCounter::close_window() {
  window_open_ = false;
  at::disableCallback(handle_);
  Shared& s = shared();
  std::lock_guard<std::mutex> lock(s.mu);
  StepFlops count = s.tally.per_step(1);
  s.tally.clear();
  return count;
}

void FlopCounter::on_step_begin(int64_t /*step*/, Nanos /*now*/) {
  if (!active_) return;
  try {
    if (planner_.begin_step()) open_window();
  } catch (const std::exception& e) {
    // Without its callback the counter cannot count: it stops, records stay NaN.
    active_ = false;
    window_open_ = false;
    if (pilot_ != nullptr) {
      pilot_->log(LogLevel::kError, std::string("FLOP counter stopped: ") + e.what());
    }
  }
  refresh_hooks();
}

void FlopCounter::warn_not_counted(int64_t step, const std::exception& e) {
  if (warned_ || pilot_ == nullptr) return;
  warned_ = true;
  pilot_->log(LogLevel::kError,
              "FLOP counter: step " + std::to_string(step) + " not counted: " + e.what());
}

void FlopCounter::on_step_end(StepRecord& record) {
  if (!active_ || !window_open_) return;
  try {
    // The callback goes off at the boundary; the next step's begin must see this count planned.
    counted_ = close_window();
    counted_step_ = record.step;
    if (host_ != nullptr) host_->take_step_now();
  } catch (const std::exception& e) {
    warn_not_counted(record.step, e);
  }
  refresh_hooks();
}

void FlopCounter::on_step_record(StepRecord& record) {
  if (!active_) return;
  try {
    std::optional<StepFlops> own;
    if (counted_ && counted_step_ == record.step) own.swap(counted_);
    if (recount_after_ && record.step > *recount_after_) {
      planner_.recount();
      recount_after_.reset();
    }
    const int64_t windows_before = planner_.windows();
    const StepFlops* count = planner_.end_step(record.samples, own ? &*own : nullptr);
    fill_step_flops(record, count, peak_);
    epoch_.add_step(count, static_cast<double>(record.step_ns()) / 1e9, own.has_value());
    if (planner_.windows() != windows_before) {
      if (const StepFlops* c = planner_.count_for(record.samples)) {
        log_window(*c, record.samples);
      }
    }
  } catch (const std::exception& e) {
    warn_not_counted(record.step, e);
  }
  refresh_hooks();  // the planner may have changed before a throw
}

void FlopCounter::on_epoch_end(EpochSummary& summary) {
  if (!active_) return;
  try {
    summary.sections.set(epoch_.summarize(peak_));
    epoch_.clear();
  } catch (const std::exception& e) {
    if (pilot_ != nullptr) {
      pilot_->log(LogLevel::kError, std::string("FLOP counter: epoch summary: ") + e.what());
    }
  }
}

void FlopCounter::log_window(const StepFlops& c, int64_t samples) {
  if (pilot_ == nullptr) return;
  std::string precisions;
  for (int i = 0; i < kMathPrecisions; ++i) {
    const double f = c.model_by_precision[static_cast<size_t>(i)];
    if (f <= 0 || c.model_flops <= 0) continue;
    if (!precisions.empty()) precisions += ", ";
    char buf[48];
    std::snprintf(buf, sizeof buf, "%s %.0f%%", to_string(static_cast<MathPrecision>(i)),
                  100 * f / c.model_flops);
    precisions += buf;
  }
  const std::string top = c.ops.empty() ? "none" : c.ops.front().op;
  const LogLevel level = planner_.windows() == 1 ? LogLevel::kInfo : LogLevel::kDebug;
  std::string line = "FLOPs per step (" + std::to_string(samples) +
                     " samples): " + gflops(c.model_flops) + " GFLOP model, " +
                     gflops(c.hardware_flops) + " GFLOP hardware (" +
                     (precisions.empty() ? "-" : precisions) + "); largest op " + top +
                     "; unfused attention " + gflops(c.unfused_attention_flops) + " GFLOP, fused " +
                     gflops(c.fused_attention_flops) + " GFLOP";
  if (c.unparsed_calls > 0) line += "; " + std::to_string(c.unparsed_calls) + " calls unreadable";
  pilot_->log(level, line);
}

}  // namespace torchpilot
