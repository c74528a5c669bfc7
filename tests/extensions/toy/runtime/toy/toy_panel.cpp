// The toy's panel in the HTML report: slow steps per epoch, from the epochs' "toy" sections.
#include <string>

#include "runtime/toy/toy.h"
#include "torchpilot/runtime/reports/html_report.h"

namespace toy {
namespace {

const bool registered = [] {
  torchpilot::register_report_panel("toy", [](const torchpilot::ReportView& view) {
    std::string rows;
    for (const auto& e : *view.epochs) {
      if (const ToyStats* s = e.sections.get<ToyStats>()) {
        rows += "<tr><td>" + std::to_string(e.epoch) + "</td><td>" + std::to_string(s->slow_steps) +
                "</td></tr>";
      }
    }
    if (rows.empty()) return std::string();
    return "<section id=\"toy-panel\"><h2>Toy: slow steps</h2><table>" + rows +
           "</table></section>\n";
  });
  return true;
}();

}  // namespace
}  // namespace toy
