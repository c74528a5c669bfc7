// A file's type in words, for refusing anything but a regular file (the run journal, the trace
// analyzer's input): "a FIFO", "a directory", ...
#pragma once

#include <sys/stat.h>

namespace torchpilot {

inline const char* file_kind(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

}  // namespace torchpilot
