// Which ATen op a CUDA call was made from, by the calling thread's stack: the trace window names
// each host sync's op this way (docs/metrics.md, "Host syncs by cause"). It costs only the
// synchronizing calls a stack walk (the op-scope hook it replaces cost every op a RecordFunction
// callback: +6.5% step time on the GPT example, bench/README.md).
//
// OpSymbolIndex reads the dynamic symbol tables of the loaded LibTorch libraries from memory (no
// file I/O, no dladdr: glibc's dladdr scans every symbol of a library per call) and keeps the
// address ranges of `at::_ops::<op>::call` and `::redispatch`, the entry points every ATen op
// goes through. Internal to hooks/; no LibTorch or vendor headers.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

namespace torchpilot {
namespace detail {

// "_ZN2at4_ops4item4callERKNS_6TensorE" -> "aten::item"; the overload dropped where it is known
// ("to_dtype_layout" -> "aten::to", "nonzero_out" -> "aten::nonzero"). Empty when the symbol is
// not an op's call or redispatch.
std::string op_of_symbol(const char* mangled);

// One ATen op call on a stack: its op, and the frame's return address and canonical frame
// address, which identify the call (two CUDA calls made inside one `item()` share them).
struct OpCall {
  const std::string* op = nullptr;  // interned by the index; nullptr: no op on the stack
  uintptr_t pc = 0;
  uintptr_t cfa = 0;
};

class OpSymbolIndex {
 public:
  struct Entry {
    uintptr_t begin = 0, end = 0;  // [begin, end)
    const std::string* op = nullptr;
  };

  // The process's index (never destroyed: CUDA calls may come during exit).
  static OpSymbolIndex& instance();

  // Builds the index once, on a thread of its own; until it is ready lookups find nothing.
  void build_async();
  // Builds it on the calling thread (tests); idempotent.
  void build();
  bool ready() const;
  size_t size() const;

  // The op whose code holds `pc`, or nullptr.
  const std::string* op_at(uintptr_t pc) const;

  // While building: the one stored copy of an op name.
  const std::string* intern(const std::string& op) { return &*names_.insert(op).first; }

 private:
  OpSymbolIndex() = default;
  void build_locked();  // reads the libraries and publishes the index; mu_ held

  std::mutex mu_;         // the build
  bool started_ = false;  // a build began
  std::atomic<bool> ready_{false};
  std::vector<Entry> entries_;             // sorted by begin; written once, before ready_
  std::unordered_set<std::string> names_;  // op names (node-based: stable addresses)
};

// The outermost ATen op on the calling thread's stack (the one the program called: `item` rather
// than the `_local_scalar_dense` inside it), or an empty OpCall. A few µs: call it only on rare
// calls (synchronizations).
OpCall outermost_op_call();

}  // namespace detail
}  // namespace torchpilot
