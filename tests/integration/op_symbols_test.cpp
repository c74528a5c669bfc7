// Which ATen op a call was made from, by the stack (hooks/gpu/op_symbols.h), on this process's
// own LibTorch (1.13 CPU here, 2.x on the GPU machine): the symbol parser, the index of the
// loaded libraries, and a stack walk from inside a real op (a CPU allocator that asks).
#include "torchpilot/hooks/gpu/op_symbols.h"

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>

namespace torchpilot {
namespace detail {
namespace {

TEST(OpSymbols, ParsesOpEntryPoints) {
  EXPECT_EQ(op_of_symbol("_ZN2at4_ops4item4callERKNS_6TensorE"), "aten::item");
  EXPECT_EQ(op_of_symbol("_ZN2at4_ops4item10redispatchEN3c1014DispatchKeySetERKNS_6TensorE"),
            "aten::item");
  EXPECT_EQ(op_of_symbol("_ZN2at4_ops19_local_scalar_dense4callERKNS_6TensorE"),
            "aten::_local_scalar_dense");
  EXPECT_EQ(op_of_symbol("_ZN2at4_ops15to_dtype_layout4callERKNS_6TensorE"), "aten::to");
  EXPECT_EQ(op_of_symbol("_ZN2at4_ops9to_device4callERKNS_6TensorE"), "aten::to");
  EXPECT_EQ(op_of_symbol("_ZN2at4_ops8to_dense4callERKNS_6TensorE"), "aten::to_dense");
  EXPECT_EQ(op_of_symbol("_ZN2at4_ops11nonzero_out4callERKNS_6TensorERS2_"), "aten::nonzero");
  EXPECT_EQ(op_of_symbol("_ZN2at4_ops5copy_4callERNS_6TensorERKS2_b"), "aten::copy_");
  // Not an op's call or redispatch.
  EXPECT_EQ(op_of_symbol("_ZN2at4_ops4item6schemaEv"), "");
  EXPECT_EQ(op_of_symbol("_ZN2at6native4itemERKNS_6TensorE"), "");
  EXPECT_EQ(op_of_symbol("_ZN2at4_ops"), "");
  EXPECT_EQ(op_of_symbol("_ZN2at4_ops99itemE"), "");
  EXPECT_EQ(op_of_symbol(nullptr), "");
}

TEST(OpSymbols, IndexFindsLoadedOps) {
  OpSymbolIndex& index = OpSymbolIndex::instance();
  index.build();
  ASSERT_TRUE(index.ready());
  EXPECT_GT(index.size(), 1000u) << "LibTorch has thousands of op entry points";
  void* item = dlsym(RTLD_DEFAULT, "_ZN2at4_ops4item4callERKNS_6TensorE");
  ASSERT_NE(item, nullptr);
  const std::string* op = index.op_at(reinterpret_cast<uintptr_t>(item) + 1);
  ASSERT_NE(op, nullptr);
  EXPECT_EQ(*op, "aten::item");
  EXPECT_EQ(index.op_at(reinterpret_cast<uintptr_t>(&dlsym)), nullptr);
}

// A CPU allocator that walks the stack on each allocation: inside at::ones the walk must find
// the op the program called (ones), not the ones it called inside (empty, fill_).
class AskingAllocator final : public c10::Allocator {
 public:
  explicit AskingAllocator(c10::Allocator* real) : real_(real) {}
  // LibTorch 1.13 declares allocate() const, 2.x not, and 2.x adds copy_data(): both signatures
  // and copy_data without `override`, so that whichever the headers declare is overridden.
  c10::DataPtr allocate(size_t n) const { return ask(n); }
  c10::DataPtr allocate(size_t n) { return ask(n); }
  void copy_data(void* dest, const void* src, std::size_t count) const {
    std::memcpy(dest, src, count);
  }
  c10::DeleterFnPtr raw_deleter() const override { return real_->raw_deleter(); }
  mutable std::string seen;

 private:
  c10::DataPtr ask(size_t n) const {
    const OpCall call = outermost_op_call();
    if (call.op != nullptr && seen.empty()) seen = *call.op;
    return real_->allocate(n);
  }
  c10::Allocator* real_;
};

TEST(OpSymbols, StackWalkNamesTheOutermostOp) {
  OpSymbolIndex::instance().build();
  c10::Allocator* real = c10::GetCPUAllocator();
  AskingAllocator asking(real);
  c10::SetCPUAllocator(&asking, /*priority=*/100);
  const at::Tensor t = at::ones({64}, at::kFloat);
  c10::SetCPUAllocator(real, /*priority=*/101);
  EXPECT_EQ(asking.seen, "aten::ones");
  EXPECT_EQ(t.sum().item<float>(), 64.0f);
  // Outside any op: nothing.
  EXPECT_EQ(outermost_op_call().op, nullptr);
}

}  // namespace
}  // namespace detail
}  // namespace torchpilot
