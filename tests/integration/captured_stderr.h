// stderr (where the advisory log goes) captured into a file while a CapturedStderr lives, for
// tests whose translation unit cannot include spdlog next to LibTorch (the wheel's fmt).
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

namespace torchpilot::testing_support {

class CapturedStderr {
 public:
  // `name` tells the test's file apart: /tmp/torchpilot-<name>-<pid>.log.
  explicit CapturedStderr(const std::string& name)
      : path_("/tmp/torchpilot-" + name + "-" + std::to_string(::getpid()) + ".log") {
    std::fflush(stderr);
    saved_ = ::dup(2);
    const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 2);
    ::close(fd);
  }
  ~CapturedStderr() {
    restore();
    ::unlink(path_.c_str());
  }
  CapturedStderr(const CapturedStderr&) = delete;
  CapturedStderr& operator=(const CapturedStderr&) = delete;
  // What was written so far; stderr is restored first.
  std::string text() {
    restore();
    std::ifstream in(path_);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }

 private:
  void restore() {
    if (saved_ < 0) return;
    std::fflush(stderr);
    ::dup2(saved_, 2);
    ::close(saved_);
    saved_ = -1;
  }
  std::string path_;
  int saved_ = -1;
};

// How often `what` occurs in `text`.
inline int occurrences(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace torchpilot::testing_support
