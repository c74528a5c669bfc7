// Sections: a collector's named part of an epoch summary or of a late step record. The Pilot and
// the sinks handle them without knowing their types: a section writes its own JSON object and its
// own advisory-log lines. Advisors and programs read a section's typed value with get<T>().
//
// A type T becomes a section by giving it
//   static constexpr const char* kSectionName = "gpu";      // JSON key, unique per type
// and two free functions in its namespace (found by argument-dependent lookup):
//   std::string section_json(const T& value);               // one JSON object, e.g. {"a":1}
//   void section_text(const T& value, const EpochSummary& epoch,
//                     std::vector<std::string>& lines);      // advisory-log lines (may add none)
// Late step records (published after their step, e.g. GPU figures once samples arrived) also
// give `static constexpr const char* kRecordType = "gpu_step";` (the JSON-lines record type).
//
// Thread-safety: plain values. Failure behaviour: nothing here throws except allocation.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace torchpilot {

struct EpochSummary;

class Section {
 public:
  virtual ~Section() = default;
  virtual std::string_view name() const = 0;
  virtual std::string json() const = 0;
  virtual void text(const EpochSummary& epoch, std::vector<std::string>& lines) const = 0;
  virtual std::unique_ptr<Section> clone() const = 0;
};

// The section holding a value of type T.
template <typename T>
class RecordSection final : public Section {
 public:
  explicit RecordSection(T v) : value(std::move(v)) {}
  std::string_view name() const override { return T::kSectionName; }
  std::string json() const override { return section_json(value); }
  void text(const EpochSummary& epoch, std::vector<std::string>& lines) const override {
    section_text(value, epoch, lines);
  }
  std::unique_ptr<Section> clone() const override {
    return std::make_unique<RecordSection<T>>(value);
  }
  T value;
};

// An ordered set of sections with value semantics (copies clone). One section per name: setting
// a name that is present replaces it in place.
class Sections {
 public:
  Sections() = default;
  Sections(const Sections& other) { *this = other; }
  Sections& operator=(const Sections& other) {
    if (this == &other) return *this;
    items_.clear();
    for (const auto& s : other.items_) items_.push_back(s->clone());
    return *this;
  }
  Sections(Sections&&) noexcept = default;
  Sections& operator=(Sections&&) noexcept = default;

  // The value of the section of type T, or null.
  template <typename T>
  const T* get() const {
    for (const auto& s : items_) {
      if (auto* r = dynamic_cast<const RecordSection<T>*>(s.get())) return &r->value;
    }
    return nullptr;
  }
  template <typename T>
  T* get() {
    for (const auto& s : items_) {
      if (auto* r = dynamic_cast<RecordSection<T>*>(s.get())) return &r->value;
    }
    return nullptr;
  }
  template <typename T>
  T& set(T value) {
    auto section = std::make_unique<RecordSection<T>>(std::move(value));
    T& ref = section->value;
    put(std::move(section));
    return ref;
  }
  // Adds or replaces (by name) a section of any type.
  void put(std::unique_ptr<Section> section) {
    for (auto& s : items_) {
      if (s->name() == section->name()) {
        s = std::move(section);
        return;
      }
    }
    items_.push_back(std::move(section));
  }
  template <typename T>
  void erase() {
    for (auto it = items_.begin(); it != items_.end(); ++it) {
      if (dynamic_cast<const RecordSection<T>*>(it->get()) != nullptr) {
        items_.erase(it);
        return;
      }
    }
  }
  const std::vector<std::unique_ptr<Section>>& all() const { return items_; }
  bool empty() const { return items_.empty(); }

 private:
  std::vector<std::unique_ptr<Section>> items_;
};

// A section published after its step (Sink::on_late_step).
struct LateStepRecord {
  int64_t step = 0;
  int64_t epoch = 0;
  std::string_view record_type;  // T::kRecordType (static storage)
  std::shared_ptr<const Section> section;

  template <typename T>
  const T* get() const {
    auto* r = dynamic_cast<const RecordSection<T>*>(section.get());
    return r != nullptr ? &r->value : nullptr;
  }
};

template <typename T>
LateStepRecord make_late_step(int64_t step, int64_t epoch, T value) {
  return {step, epoch, T::kRecordType, std::make_shared<RecordSection<T>>(std::move(value))};
}

}  // namespace torchpilot
