// The outputs' paths checked at the Pilot's start (config.h, check_output_paths), before any
// output is opened: a path that cannot work fails start-up with its key and the OS's reason, not
// the first epoch's end. The OS is asked by doing what the output will do and undoing it (a file
// made under a unique name and removed, an existing file opened without truncation): access(2)
// answers for the real user, says yes to root everywhere and knows nothing of /sys.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "torchpilot/runtime/core/config.h"

namespace torchpilot {
namespace {

namespace fs = std::filesystem;

// How each output writes its path (runtime/reports).
enum class Writes {
  kAppend,         // log.json_path: appended to (a FIFO or character device too)
  kReadAndAppend,  // report.journal_path: read, then appended to
  kRename,         // report.html_path: written to "<path>.tmp", then renamed over the path
  kIntoFolder,     // report.trace_dir: files written into it, made if missing
};

struct Output {
  const char* key;
  std::string path;
  Writes writes;
};

std::string in_quotes(const std::string& s) { return "'" + s + "'"; }

std::string folder_of(const std::string& path) {
  const std::string folder = fs::path(path).parent_path().string();
  return folder.empty() ? "." : folder;
}

// 0 when `folder` takes a new file (one is made under a unique name and removed), else errno.
// A unique name, not the output's own: ranks starting together may check one path at once.
int probe_folder(const std::string& folder) {
  std::string name = folder + "/.torchpilot-probe-XXXXXX";
  const int fd = ::mkostemp(name.data(), O_CLOEXEC);
  if (fd < 0) return errno;
  ::close(fd);
  ::unlink(name.c_str());
  return 0;
}

// Why the file output `o` cannot use its path, or "" when it can.
std::string file_problem(const Output& o) {
  const std::string& path = o.path;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    struct stat link {};
    if (err == ENOENT && ::lstat(path.c_str(), &link) == 0) {
      return in_quotes(path) + " is a symbolic link to a missing file: give the file's own path";
    }
    if (err != ENOENT) return "cannot use " + in_quotes(path) + ": " + std::strerror(err);
    // Not there yet: its folder must take it.
    const std::string folder = folder_of(path);
    if (const int e = probe_folder(folder)) {
      return "cannot create " + in_quotes(path) + " (folder " + in_quotes(folder) +
             "): " + std::strerror(e);
    }
    return "";
  }
  if (S_ISDIR(st.st_mode)) {
    return in_quotes(path) + " is a directory (" + std::strerror(EISDIR) + "): give a file's path";
  }
  if (!S_ISREG(st.st_mode)) {
    // The JSON log writes to a FIFO or terminal as to a file; its sink checks a FIFO's reader.
    if (o.writes == Writes::kAppend && (S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode))) return "";
    return in_quotes(path) +
           " is not a regular file (a FIFO, socket or device): give a regular file";
  }
  if (o.writes == Writes::kRename) {  // the file is replaced, never written: its folder matters
    const std::string folder = folder_of(path);
    if (const int e = probe_folder(folder)) {
      return "cannot write " + in_quotes(path) + ": its folder " + in_quotes(folder) +
             " takes no new file (the report is written beside it, then renamed): " +
             std::strerror(e);
    }
    return "";
  }
  // Opened as the output will open it, without O_CREAT or O_TRUNC: nothing changes.
  const bool reads = o.writes == Writes::kReadAndAppend;
  const int fd =
      ::open(path.c_str(), (reads ? O_RDWR : O_WRONLY) | O_APPEND | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    return "cannot open " + in_quotes(path) + (reads ? " to read and append: " : " to append: ") +
           std::strerror(errno);
  }
  ::close(fd);
  return "";
}

// Why the trace folder `dir` cannot take files, or "" when it can.
std::string folder_problem(const std::string& dir) {
  // The nearest folder that exists: the trace sink makes the rest.
  std::string existing = dir;
  struct stat st {};
  while (::stat(existing.c_str(), &st) != 0) {
    const int err = errno;
    const std::string parent = folder_of(existing);
    if (err != ENOENT || parent == existing) {
      return "cannot use " + in_quotes(existing) + ": " + std::strerror(err);
    }
    existing = parent;
  }
  if (!S_ISDIR(st.st_mode)) {
    return in_quotes(existing) + " is not a directory (" + std::strerror(ENOTDIR) + ")";
  }
  if (const int e = probe_folder(existing)) {
    return (existing == dir ? "cannot create files in " + in_quotes(dir)
                            : "cannot make " + in_quotes(dir) + " in " + in_quotes(existing)) +
           ": " + std::strerror(e);
  }
  return "";
}

// What tells two spellings of one file apart from two files: the canonical path (symbolic links,
// "." and ".." resolved as far as the path exists) and, where it exists, the inode (a hard link
// has a canonical path of its own).
struct Identity {
  std::string canonical;
  bool exists = false;
  dev_t dev = 0;
  ino_t ino = 0;
  bool same(const Identity& o) const {
    return canonical == o.canonical || (exists && o.exists && dev == o.dev && ino == o.ino);
  }
};

Identity identity_of(const std::string& path) {
  Identity id;
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::absolute(path, ec), ec);
  if (ec) p = fs::absolute(path, ec).lexically_normal();
  id.canonical = p.string();
  while (id.canonical.size() > 1 && id.canonical.back() == '/') id.canonical.pop_back();
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    id.exists = true;
    id.dev = st.st_dev;
    id.ino = st.st_ino;
  }
  return id;
}

}  // namespace

std::string journal_path_for_rank(const std::string& path, const char* rank) {
  if (rank == nullptr || *rank == '\0') return path;
  char* end = nullptr;
  errno = 0;
  const long long n = std::strtoll(rank, &end, 10);
  if (*end != '\0' || errno != 0 || n <= 0) return path;  // rank 0, or not a rank
  const size_t name = path.find_last_of('/') == std::string::npos ? 0 : path.find_last_of('/') + 1;
  size_t dot = path.find_last_of('.');
  if (dot == std::string::npos || dot <= name) dot = path.size();  // no extension
  return path.substr(0, dot) + ".rank" + std::to_string(n) + path.substr(dot);
}

void check_output_paths(const Config& config) {
  std::vector<Output> outputs;
  auto add = [&](const char* key, const std::string& path, Writes writes) {
    if (!path.empty()) outputs.push_back({key, path, writes});
  };
  add("log.json_path", config.log.json_path, Writes::kAppend);
  add("report.html_path", config.report.html_path, Writes::kRename);
  // The file this rank's journal opens (rank N > 0: its own).
  add("report.journal_path",
      config.report.journal_path.empty()
          ? std::string()
          : journal_path_for_rank(config.report.journal_path, std::getenv("RANK")),
      Writes::kReadAndAppend);
  add("report.trace_dir", config.report.trace_dir, Writes::kIntoFolder);

  // One file for two outputs: one would overwrite or interleave with the other's records. The
  // HTML report's temporary file counts as its own.
  struct Name {
    const Output* output;
    std::string path;
    const char* role;  // "" or what this name is to its output
    Identity id;
  };
  std::vector<Name> names;
  for (const Output& o : outputs) {
    names.push_back({&o, o.path, "", identity_of(o.path)});
    if (o.writes == Writes::kRename) {
      const std::string tmp = o.path + ".tmp";
      names.push_back({&o, tmp, " (its temporary file)", identity_of(tmp)});
    }
  }
  for (size_t b = 0; b < names.size(); ++b) {
    for (size_t a = 0; a < b; ++a) {
      if (names[a].output == names[b].output || !names[a].id.same(names[b].id)) continue;
      const char* key = names[b].output->key;
      const char* other = names[a].output->key;
      const std::string from = source_of(config, other);
      throw ConfigError(source_of(config, key), key,
                        in_quotes(names[b].path) + names[b].role + " is the same file as " + other +
                            "'s " + in_quotes(names[a].path) + names[a].role +
                            (from == "Config" ? "" : " (from " + from + ")") +
                            ": two outputs in one file lose records; give each its own");
    }
  }

  for (const Output& o : outputs) {
    const std::string problem =
        o.writes == Writes::kIntoFolder ? folder_problem(o.path) : file_problem(o);
    if (!problem.empty()) throw ConfigError(source_of(config, o.key), o.key, problem);
  }
}

}  // namespace torchpilot
