// ATen op entry points by address, from the loaded LibTorch libraries' dynamic symbol tables.
#include "op_symbols.h"

#include <elf.h>
#include <link.h>
#include <unwind.h>

#include <algorithm>
#include <cstring>
#include <thread>
#include <unordered_map>

#include "own_thread.h"

namespace torchpilot {
namespace detail {
namespace {

// Reads "<digits><name>" at *p; advances *p past it. False when malformed.
bool read_source_name(const char** p, std::string* out) {
  const char* s = *p;
  size_t len = 0;
  if (*s < '0' || *s > '9') return false;
  while (*s >= '0' && *s <= '9') len = len * 10 + static_cast<size_t>(*s++ - '0');
  if (len == 0 || std::strlen(s) < len) return false;
  out->assign(s, len);
  *p = s + len;
  return true;
}

bool ends_with(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() > n && s.compare(s.size() - n, n, suffix) == 0;
}

// at::_ops struct names are "<op>" or "<op>_<overload>": the overloads of the ops that may
// synchronize, where the split is not otherwise knowable (to_dense is an op of its own).
std::string op_of_struct(std::string name) {
  static const std::unordered_map<std::string, std::string> kOverloads = {
      {"to_dtype_layout", "to"},
      {"to_device", "to"},
      {"to_dtype", "to"},
      {"to_other", "to"},
      {"repeat_interleave_Tensor", "repeat_interleave"},
      {"repeat_interleave_self_Tensor", "repeat_interleave"},
      {"repeat_interleave_self_int", "repeat_interleave"},
      {"copy__Tensor", "copy_"},
  };
  const auto it = kOverloads.find(name);
  if (it != kOverloads.end()) return "aten::" + it->second;
  if (ends_with(name, "_out")) name.resize(name.size() - 4);  // the out= overload
  return "aten::" + name;
}

// Number of symbols in a GNU hash table: past the largest bucket's chain end.
size_t gnu_hash_symbols(const uint32_t* h) {
  const uint32_t nbuckets = h[0], symoffset = h[1], bloom_size = h[2];
  const auto* bloom = reinterpret_cast<const ElfW(Addr)*>(h + 4);
  const auto* buckets = reinterpret_cast<const uint32_t*>(bloom + bloom_size);
  const uint32_t* chain = buckets + nbuckets;
  uint32_t last = 0;
  for (uint32_t b = 0; b < nbuckets; ++b) last = std::max(last, buckets[b]);
  if (last < symoffset) return symoffset;
  while ((chain[last - symoffset] & 1) == 0) ++last;
  return static_cast<size_t>(last) + 1;
}

struct Collect {
  OpSymbolIndex* index;
  std::vector<OpSymbolIndex::Entry>* entries;
};

int collect_library(dl_phdr_info* info, size_t, void* data) {
  auto* c = static_cast<Collect*>(data);
  // at::_ops lives in libtorch_cpu (libtorch.so in some builds): LibTorch's libraries only.
  if (info->dlpi_name == nullptr || std::strstr(info->dlpi_name, "libtorch") == nullptr) return 0;
  const ElfW(Dyn)* dyn = nullptr;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    if (info->dlpi_phdr[i].p_type == PT_DYNAMIC) {
      dyn = reinterpret_cast<const ElfW(Dyn)*>(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
    }
  }
  if (dyn == nullptr) return 0;
  const ElfW(Addr) base = info->dlpi_addr;
  // glibc relocates these entries in place on x86-64; elsewhere they may still be offsets.
  auto absolute = [base](ElfW(Addr) a) { return a < base ? a + base : a; };
  const ElfW(Sym)* symtab = nullptr;
  const char* strtab = nullptr;
  size_t strsz = 0, nsyms = 0;
  for (const ElfW(Dyn)* d = dyn; d->d_tag != DT_NULL; ++d) {
    switch (d->d_tag) {
      case DT_SYMTAB:
        symtab = reinterpret_cast<const ElfW(Sym)*>(absolute(d->d_un.d_ptr));
        break;
      case DT_STRTAB:
        strtab = reinterpret_cast<const char*>(absolute(d->d_un.d_ptr));
        break;
      case DT_STRSZ:
        strsz = d->d_un.d_val;
        break;
      case DT_HASH:
        nsyms = reinterpret_cast<const uint32_t*>(absolute(d->d_un.d_ptr))[1];  // nchain
        break;
      case DT_GNU_HASH:
        if (nsyms == 0)
          nsyms = gnu_hash_symbols(reinterpret_cast<const uint32_t*>(absolute(d->d_un.d_ptr)));
        break;
      default:
        break;
    }
  }
  if (symtab == nullptr || strtab == nullptr || nsyms == 0) return 0;
  static constexpr char kPrefix[] = "_ZN2at4_ops";
  for (size_t i = 0; i < nsyms; ++i) {
    const ElfW(Sym)& s = symtab[i];
    if (s.st_value == 0 || s.st_size == 0 || (s.st_info & 0xf) != STT_FUNC) continue;
    if (s.st_name >= strsz) continue;
    const char* name = strtab + s.st_name;
    if (std::strncmp(name, kPrefix, sizeof kPrefix - 1) != 0) continue;
    const std::string op = op_of_symbol(name);
    if (op.empty()) continue;
    OpSymbolIndex::Entry e;
    e.begin = base + s.st_value;
    e.end = e.begin + s.st_size;
    e.op = c->index->intern(op);
    c->entries->push_back(e);
  }
  return 0;
}

constexpr int kMaxFrames = 160;

struct Walk {
  const OpSymbolIndex* index;
  OpCall best;
  int frames = 0;
};

_Unwind_Reason_Code on_frame(_Unwind_Context* ctx, void* arg) {
  auto* w = static_cast<Walk*>(arg);
  const uintptr_t ip = _Unwind_GetIP(ctx);
  if (ip == 0) return _URC_END_OF_STACK;
  // ip - 1: inside the call instruction, not past it (a call may end a function).
  if (const std::string* op = w->index->op_at(ip - 1)) {
    w->best.op = op;  // later frames are outer ones: the last found is the outermost
    w->best.pc = ip;
    w->best.cfa = _Unwind_GetCFA(ctx);
  }
  return ++w->frames >= kMaxFrames ? _URC_END_OF_STACK : _URC_NO_REASON;
}

}  // namespace

std::string op_of_symbol(const char* mangled) {
  static constexpr char kPrefix[] = "_ZN2at4_ops";
  if (mangled == nullptr || std::strncmp(mangled, kPrefix, sizeof kPrefix - 1) != 0) return {};
  const char* p = mangled + sizeof kPrefix - 1;
  std::string op, member;
  if (!read_source_name(&p, &op) || !read_source_name(&p, &member) || *p != 'E') return {};
  if (member != "call" && member != "redispatch") return {};
  return op_of_struct(std::move(op));
}

OpSymbolIndex& OpSymbolIndex::instance() {
  static OpSymbolIndex* index = new OpSymbolIndex();  // never destroyed
  return *index;
}

void OpSymbolIndex::build_locked() {
  if (ready_.load(std::memory_order_acquire)) return;
  std::vector<Entry> entries;
  Collect c{this, &entries};
  dl_iterate_phdr(&collect_library, &c);
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.begin < b.begin; });
  entries_ = std::move(entries);
  ready_.store(true, std::memory_order_release);
}

void OpSymbolIndex::build() {
  std::lock_guard<std::mutex> lock(mu_);
  started_ = true;
  build_locked();
}

void OpSymbolIndex::build_async() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (started_) return;
    started_ = true;
  }
  try {
    std::thread([this] {
      mark_own_thread("tp-op-symbols");
      std::lock_guard<std::mutex> lock(mu_);
      build_locked();
    }).detach();
  } catch (...) {  // no thread: syncs keep their API names
  }
}

bool OpSymbolIndex::ready() const { return ready_.load(std::memory_order_acquire); }

size_t OpSymbolIndex::size() const { return ready() ? entries_.size() : 0; }

const std::string* OpSymbolIndex::op_at(uintptr_t pc) const {
  if (!ready()) return nullptr;
  auto it = std::upper_bound(entries_.begin(), entries_.end(), pc,
                             [](uintptr_t v, const Entry& e) { return v < e.begin; });
  if (it == entries_.begin()) return nullptr;
  --it;
  return pc < it->end ? it->op : nullptr;
}

OpCall outermost_op_call() {
  const OpSymbolIndex& index = OpSymbolIndex::instance();
  if (!index.ready()) return {};
  Walk w{&index, {}, 0};
  _Unwind_Backtrace(&on_frame, &w);
  return w.best;
}

}  // namespace detail
}  // namespace torchpilot
