#include "jpeg_io.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <csetjmp>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <new>
#include <sstream>
#include <stdexcept>
#include <system_error>
#include <utility>

// Last and on its own: jpeglib.h uses FILE and size_t without including their headers.
#include <jpeglib.h>

namespace jpeg_example {
namespace {

namespace fs = std::filesystem;

constexpr double kPi = 3.14159265358979323846;

// ---------------------------------------------------------------------------------------------
// libjpeg error handling. The default error_exit calls exit(), and throwing a C++ exception
// through libjpeg's C frames is undefined, so errors longjmp back to a setjmp in a function that
// holds only trivially destructible locals (no destructor can be skipped) and report failure by
// return value; the C++ caller then cleans up and throws.

struct ErrorManager {
  jpeg_error_mgr pub;  // First member: libjpeg hands callbacks a jpeg_error_mgr*.
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void on_error_exit(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<ErrorManager*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

// Level -1 is a corrupt-data warning (e.g. premature end of file). libjpeg would continue and pad
// the image with grey, which for training data is worse than failing loudly.
void on_emit_message(j_common_ptr cinfo, int msg_level) {
  if (msg_level < 0) on_error_exit(cinfo);
}

void install_error_manager(ErrorManager* err, j_common_ptr cinfo) {
  cinfo->err = jpeg_std_error(&err->pub);
  err->pub.error_exit = on_error_exit;
  err->pub.emit_message = on_emit_message;
  err->message[0] = '\0';
}

// Kept out of the setjmp frame: std::bad_alloc must not unwind past an undestroyed libjpeg object.
bool try_resize(std::vector<uint8_t>* buffer, size_t size) noexcept {
  try {
    buffer->resize(size);
    return true;
  } catch (...) {
    return false;
  }
}

bool decode_stream(std::FILE* file, Image* out, char* message) {
  jpeg_decompress_struct cinfo{};  // Zeroed so jpeg_destroy is safe even if create fails.
  ErrorManager err{};
  install_error_manager(&err, reinterpret_cast<j_common_ptr>(&cinfo));
  if (setjmp(err.jump) != 0) {
    jpeg_destroy_decompress(&cinfo);
    std::memcpy(message, err.message, JMSG_LENGTH_MAX);
    return false;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_stdio_src(&cinfo, file);
  jpeg_read_header(&cinfo, TRUE);
  cinfo.out_color_space = JCS_RGB;
  jpeg_start_decompress(&cinfo);
  const size_t stride = static_cast<size_t>(cinfo.output_width) * 3;
  if (cinfo.output_components != 3 ||
      !try_resize(&out->rgb, stride * static_cast<size_t>(cinfo.output_height))) {
    std::snprintf(message, JMSG_LENGTH_MAX, "%s",
                  cinfo.output_components != 3 ? "unexpected component count" : "out of memory");
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  out->width = static_cast<int>(cinfo.output_width);
  out->height = static_cast<int>(cinfo.output_height);
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = out->rgb.data() + static_cast<size_t>(cinfo.output_scanline) * stride;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return true;
}

bool encode_stream(std::FILE* file, const Image& img, int quality, char* message) {
  jpeg_compress_struct cinfo{};
  ErrorManager err{};
  install_error_manager(&err, reinterpret_cast<j_common_ptr>(&cinfo));
  if (setjmp(err.jump) != 0) {
    jpeg_destroy_compress(&cinfo);
    std::memcpy(message, err.message, JMSG_LENGTH_MAX);
    return false;
  }
  jpeg_create_compress(&cinfo);
  jpeg_stdio_dest(&cinfo, file);
  cinfo.image_width = static_cast<JDIMENSION>(img.width);
  cinfo.image_height = static_cast<JDIMENSION>(img.height);
  cinfo.input_components = 3;
  cinfo.in_color_space = JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, quality, TRUE);
  jpeg_start_compress(&cinfo, TRUE);
  const size_t stride = static_cast<size_t>(img.width) * 3;
  while (cinfo.next_scanline < cinfo.image_height) {
    // The classic API takes non-const rows but never writes through them when compressing.
    JSAMPROW row =
        const_cast<JSAMPROW>(img.rgb.data() + static_cast<size_t>(cinfo.next_scanline) * stride);
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  return true;
}

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using FilePtr = std::unique_ptr<std::FILE, FileCloser>;

std::string errno_message(int error) {
  // std::strerror is not guaranteed thread-safe; decoding runs in data-loader threads.
  return std::generic_category().message(error);
}

// ---------------------------------------------------------------------------------------------
// Random numbers. The std::*_distribution algorithms differ between standard libraries; only the
// raw mt19937_64 stream is specified, so derive everything from it for portable datasets.

double uniform01(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

double uniform(std::mt19937_64& rng, double lo, double hi) {
  return lo + (hi - lo) * uniform01(rng);
}

// Inclusive range; the modulo bias is negligible for the small ranges used here.
int uniform_int(std::mt19937_64& rng, int lo, int hi) {
  return lo + static_cast<int>(rng() % static_cast<uint64_t>(hi - lo + 1));
}

double normal(std::mt19937_64& rng) {
  const double u1 = 1.0 - uniform01(rng);  // In (0, 1], so the log is finite.
  const double u2 = uniform01(rng);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * kPi * u2);
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// ---------------------------------------------------------------------------------------------
// Procedural drawing.

struct Rgb {
  double r, g, b;
};

Rgb hsv_to_rgb(double h, double s, double v) {
  h = (h - std::floor(h)) * 6.0;
  const int sector = static_cast<int>(h) % 6;
  const double f = h - std::floor(h);
  const double p = v * (1 - s), q = v * (1 - s * f), t = v * (1 - s * (1 - f));
  switch (sector) {
    case 0:
      return {v, t, p};
    case 1:
      return {q, v, p};
    case 2:
      return {p, v, t};
    case 3:
      return {p, q, v};
    case 4:
      return {t, p, v};
    default:
      return {v, p, q};
  }
}

Rgb lerp(const Rgb& a, const Rgb& b, double t) {
  return {a.r + (b.r - a.r) * t, a.g + (b.g - a.g) * t, a.b + (b.b - a.b) * t};
}

enum class Shape { kDisc, kSquare, kTriangle, kRing };

// (u, v) are object coordinates scaled so the shape roughly fills the unit disc.
bool inside_shape(Shape shape, double u, double v) {
  switch (shape) {
    case Shape::kDisc:
      return u * u + v * v <= 1.0;
    case Shape::kSquare:
      return std::abs(u) <= 0.82 && std::abs(v) <= 0.82;
    case Shape::kTriangle: {
      // Equilateral, circumradius 1.15, so its area is comparable to the other shapes.
      const double x = u / 1.15, y = v / 1.15;
      return y >= -0.5 && std::sqrt(3.0) * x + y <= 1.0 && -std::sqrt(3.0) * x + y <= 1.0;
    }
    case Shape::kRing: {
      const double r2 = u * u + v * v;
      return r2 <= 1.0 && r2 >= 0.5 * 0.5;
    }
  }
  return false;
}

uint8_t to_byte(double x) {
  return static_cast<uint8_t>(std::clamp(std::lround(x * 255.0), 0L, 255L));
}

// ---------------------------------------------------------------------------------------------
// Dataset helpers.

std::string zero_pad(int value, int width) {
  std::string s = std::to_string(value);
  return s.size() < static_cast<size_t>(width) ? std::string(width - s.size(), '0') + s : s;
}

int decimal_digits(int value) { return static_cast<int>(std::to_string(value).size()); }

bool all_digits(const std::string& s) {
  return !s.empty() &&
         std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c); });
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool is_hidden(const fs::path& p) {
  const std::string name = p.filename().string();
  return name.empty() || name[0] == '.';
}

// An interrupted earlier generation (possibly with other arguments) may have left files this run
// would not overwrite. Remove only entries that look like our own output: <digits>/<digits>.jpg.
void remove_stale_generated_files(const fs::path& root) {
  for (const auto& class_entry : fs::directory_iterator(root)) {
    if (!class_entry.is_directory() || !all_digits(class_entry.path().filename().string())) {
      continue;
    }
    for (const auto& file_entry : fs::directory_iterator(class_entry.path())) {
      const fs::path& p = file_entry.path();
      if (file_entry.is_regular_file() && p.extension() == ".jpg" &&
          all_digits(p.stem().string())) {
        fs::remove(p);
      }
    }
    if (fs::is_empty(class_entry.path())) fs::remove(class_entry.path());
  }
}

std::string read_marker(const fs::path& marker) {
  std::ifstream in(marker);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  return s;
}

// ---------------------------------------------------------------------------------------------
// Resampling.

struct Crop {
  int x = 0, y = 0, w = 0, h = 0;
};

// torchvision's RandomResizedCrop sampling: 10 tries at a random area/aspect, then a centre crop
// with the aspect clamped into range.
Crop random_resized_crop(int width, int height, std::mt19937_64& rng) {
  constexpr double kMinScale = 0.5, kMaxScale = 1.0, kMinRatio = 3.0 / 4.0, kMaxRatio = 4.0 / 3.0;
  const double area = static_cast<double>(width) * height;
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area = area * uniform(rng, kMinScale, kMaxScale);
    const double ratio = std::exp(uniform(rng, std::log(kMinRatio), std::log(kMaxRatio)));
    const int w = static_cast<int>(std::lround(std::sqrt(target_area * ratio)));
    const int h = static_cast<int>(std::lround(std::sqrt(target_area / ratio)));
    if (w > 0 && w <= width && h > 0 && h <= height) {
      return {uniform_int(rng, 0, width - w), uniform_int(rng, 0, height - h), w, h};
    }
  }
  const double in_ratio = static_cast<double>(width) / height;
  int w = width, h = height;
  if (in_ratio < kMinRatio) {
    h = std::min(height, static_cast<int>(std::lround(w / kMinRatio)));
  } else if (in_ratio > kMaxRatio) {
    w = std::min(width, static_cast<int>(std::lround(h * kMaxRatio)));
  }
  return {(width - w) / 2, (height - h) / 2, w, h};
}

// Source taps for one output axis: half-pixel-centre mapping (align_corners=false), clamped to the
// crop so no pixel outside it leaks in.
struct Taps {
  std::vector<int> i0, i1;
  std::vector<float> frac;
};

Taps make_taps(int crop_start, int crop_len, int out_len) {
  Taps taps;
  taps.i0.resize(out_len);
  taps.i1.resize(out_len);
  taps.frac.resize(out_len);
  const double scale = static_cast<double>(crop_len) / out_len;
  for (int o = 0; o < out_len; ++o) {
    const double s = std::clamp((o + 0.5) * scale - 0.5, 0.0, static_cast<double>(crop_len - 1));
    const int i = static_cast<int>(s);  // s >= 0, so truncation is floor.
    taps.i0[o] = crop_start + i;
    taps.i1[o] = crop_start + std::min(i + 1, crop_len - 1);
    taps.frac[o] = static_cast<float>(s - i);
  }
  return taps;
}

void check_image(const Image& img, const char* where) {
  if (img.width <= 0 || img.height <= 0 ||
      img.rgb.size() != static_cast<size_t>(img.width) * static_cast<size_t>(img.height) * 3) {
    throw std::invalid_argument(std::string(where) + ": malformed image (" +
                                std::to_string(img.width) + "x" + std::to_string(img.height) +
                                ", " + std::to_string(img.rgb.size()) + " bytes)");
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------

Image decode_jpeg_file(const std::string& path) {
  FilePtr file(std::fopen(path.c_str(), "rb"));
  if (!file) {
    const int error = errno;  // Read before anything else can overwrite it.
    throw std::runtime_error("decode_jpeg_file: cannot open '" + path +
                             "': " + errno_message(error));
  }
  Image img;
  char message[JMSG_LENGTH_MAX] = {};
  if (!decode_stream(file.get(), &img, message)) {
    throw std::runtime_error("decode_jpeg_file: '" + path + "': " + message);
  }
  return img;
}

void encode_jpeg_file(const std::string& path, const Image& img, int quality) {
  check_image(img, "encode_jpeg_file");
  if (quality < 1 || quality > 100) {
    throw std::invalid_argument("encode_jpeg_file: quality " + std::to_string(quality) +
                                " not in [1, 100]");
  }
  FilePtr file(std::fopen(path.c_str(), "wb"));
  if (!file) {
    const int error = errno;
    throw std::runtime_error("encode_jpeg_file: cannot open '" + path +
                             "' for writing: " + errno_message(error));
  }
  char message[JMSG_LENGTH_MAX] = {};
  bool ok = encode_stream(file.get(), img, quality, message);
  // fclose flushes; a full disk may only show up here.
  if (std::fclose(file.release()) != 0 && ok) {
    std::snprintf(message, sizeof(message), "close failed: %s", errno_message(errno).c_str());
    ok = false;
  }
  if (!ok) {
    // Drop the partial JPEG, but never unlink a device or other special file we wrote into.
    std::error_code ec;
    if (fs::is_regular_file(path, ec)) fs::remove(path, ec);
    throw std::runtime_error("encode_jpeg_file: '" + path + "': " + message);
  }
}

Image make_class_image(int label, int num_classes, int size, uint64_t seed) {
  if (num_classes < 1 || label < 0 || label >= num_classes || size < 8) {
    throw std::invalid_argument("make_class_image: need 0 <= label < num_classes and size >= 8");
  }
  std::mt19937_64 rng(seed);

  // Class cues in mixed radix: shape (4) x stripe orientation (3) = 12 combinations. Hue jitters by
  // +-1 class spacing, overlapping half of each neighbour's range, so colour alone is no shortcut;
  // yet it separates classes 12 labels apart, which share shape and orientation when
  // num_classes > 12. The extra 2 spacings keep the last class from wrapping round onto red.
  // Orientations are horizontal, vertical and diagonal with a random sign, so a horizontal flip
  // never turns one class into another.
  const auto shape = static_cast<Shape>(label % 4);
  const int orientation = (label / 4) % 3;
  double stripe_angle = orientation == 0 ? 0.0 : orientation == 1 ? kPi / 2 : kPi / 4;
  if (orientation == 2 && uniform01(rng) < 0.5) stripe_angle = -stripe_angle;
  stripe_angle += uniform(rng, -1.0, 1.0) * (10.0 * kPi / 180.0);
  const double hue = (label + 1 + uniform(rng, -1.0, 1.0)) / (num_classes + 2);

  const double s = size;
  // Background: a linear gradient between two muted colours along a random direction.
  const Rgb bg0 = hsv_to_rgb(uniform01(rng), uniform(rng, 0.0, 0.5), uniform(rng, 0.25, 0.85));
  const Rgb bg1 = hsv_to_rgb(uniform01(rng), uniform(rng, 0.0, 0.5), uniform(rng, 0.25, 0.85));
  const double bg_angle = uniform(rng, 0.0, 2.0 * kPi);
  const double bg_dx = std::cos(bg_angle), bg_dy = std::sin(bg_angle);

  // Distractors: small plain discs, drawn under the object.
  struct Blob {
    double x, y, r;
    Rgb color;
  };
  std::vector<Blob> blobs(uniform_int(rng, 0, 2));
  for (Blob& b : blobs) {
    b.r = s * uniform(rng, 0.05, 0.1);
    b.x = uniform(rng, 0.0, s);
    b.y = uniform(rng, 0.0, s);
    b.color = hsv_to_rgb(uniform01(rng), uniform(rng, 0.3, 1.0), uniform(rng, 0.3, 1.0));
  }

  // The object: random radius, position (mostly inside the frame) and rotation.
  const double radius = s * uniform(rng, 0.22, 0.36);
  const double cx = uniform(rng, radius * 0.85, s - radius * 0.85);
  const double cy = uniform(rng, radius * 0.85, s - radius * 0.85);
  const double rotation = uniform(rng, 0.0, 2.0 * kPi);
  const double rot_c = std::cos(rotation), rot_s = std::sin(rotation);
  const double period = radius * uniform(rng, 0.45, 0.7);
  const double phase = uniform01(rng);
  const double sat = uniform(rng, 0.6, 1.0), val = uniform(rng, 0.75, 1.0);
  const Rgb light = hsv_to_rgb(hue, sat, val);
  const Rgb dark = hsv_to_rgb(hue, sat, val * 0.35);
  const double st_dx = -std::sin(stripe_angle), st_dy = std::cos(stripe_angle);  // Stripe normal.
  const double noise_sigma = uniform(rng, 3.0, 10.0) / 255.0;

  Image img;
  img.width = size;
  img.height = size;
  img.rgb.resize(static_cast<size_t>(size) * size * 3);
  for (int y = 0; y < size; ++y) {
    for (int x = 0; x < size; ++x) {
      // 2x2 supersampling keeps edges and stripes from aliasing at small sizes.
      Rgb acc{0, 0, 0};
      for (int sub = 0; sub < 4; ++sub) {
        const double px = x + 0.25 + 0.5 * (sub & 1), py = y + 0.25 + 0.5 * (sub >> 1);
        const double t =
            std::clamp(0.5 + ((px / s - 0.5) * bg_dx + (py / s - 0.5) * bg_dy), 0.0, 1.0);
        Rgb c = lerp(bg0, bg1, t);
        for (const Blob& b : blobs) {
          if ((px - b.x) * (px - b.x) + (py - b.y) * (py - b.y) <= b.r * b.r) c = b.color;
        }
        const double dx = px - cx, dy = py - cy;
        const double u = (dx * rot_c + dy * rot_s) / radius;
        const double v = (-dx * rot_s + dy * rot_c) / radius;
        if (inside_shape(shape, u, v)) {
          const double w = (dx * st_dx + dy * st_dy) / period + phase;
          c = (w - std::floor(w)) < 0.5 ? light : dark;
        }
        acc = {acc.r + c.r, acc.g + c.g, acc.b + c.b};
      }
      uint8_t* p = &img.rgb[(static_cast<size_t>(y) * size + x) * 3];
      p[0] = to_byte(acc.r / 4 + noise_sigma * normal(rng));
      p[1] = to_byte(acc.g / 4 + noise_sigma * normal(rng));
      p[2] = to_byte(acc.b / 4 + noise_sigma * normal(rng));
    }
  }
  return img;
}

DatasetIndex generate_dataset(const std::string& folder, int num_classes, int images_per_class,
                              int size, uint64_t seed) {
  if (num_classes < 1 || images_per_class < 1 || size < 8) {
    throw std::invalid_argument(
        "generate_dataset: need num_classes >= 1, images_per_class >= 1, size >= 8");
  }
  const fs::path root(folder);
  const fs::path marker = root / ".complete";
  const std::string params = "num_classes=" + std::to_string(num_classes) +
                             " images_per_class=" + std::to_string(images_per_class) +
                             " size=" + std::to_string(size) + " seed=" + std::to_string(seed);
  if (fs::exists(marker)) {
    const std::string existing = read_marker(marker);
    if (!existing.empty() && existing != params) {
      throw std::runtime_error("generate_dataset: '" + folder + "' was generated with '" +
                               existing + "', not '" + params +
                               "'; delete it or choose another folder");
    }
    return scan_dataset(folder);
  }

  fs::create_directories(root);
  remove_stale_generated_files(root);
  const int class_digits = decimal_digits(num_classes - 1);
  const int file_digits = decimal_digits(images_per_class - 1);
  for (int label = 0; label < num_classes; ++label) {
    const fs::path class_dir = root / zero_pad(label, class_digits);
    fs::create_directories(class_dir);
    const uint64_t class_seed = splitmix64(seed ^ splitmix64(static_cast<uint64_t>(label)));
    for (int i = 0; i < images_per_class; ++i) {
      // Per-image seeds make every image independent of generation order.
      const uint64_t image_seed = splitmix64(class_seed + static_cast<uint64_t>(i));
      const Image img = make_class_image(label, num_classes, size, image_seed);
      encode_jpeg_file((class_dir / (zero_pad(i, file_digits) + ".jpg")).string(), img, 90);
    }
  }

  // Write then rename, so the marker never exists half-written.
  const fs::path tmp_marker = root / ".complete.tmp";
  {
    std::ofstream out(tmp_marker, std::ios::trunc);
    out << params << '\n';
    out.close();
    if (!out) throw std::runtime_error("generate_dataset: cannot write " + tmp_marker.string());
  }
  fs::rename(tmp_marker, marker);
  return scan_dataset(folder);
}

DatasetIndex scan_dataset(const std::string& folder) {
  const fs::path root(folder);
  std::error_code ec;
  if (!fs::is_directory(root, ec)) {
    throw std::runtime_error("scan_dataset: '" + folder + "' does not exist or is not a directory");
  }
  std::vector<fs::path> class_dirs;
  for (const auto& entry : fs::directory_iterator(root)) {
    if (entry.is_directory() && !is_hidden(entry.path())) class_dirs.push_back(entry.path());
  }
  if (class_dirs.empty()) {
    throw std::runtime_error("scan_dataset: '" + folder +
                             "' holds no class subfolders (expected <folder>/<class>/<image>.jpg)");
  }
  const auto by_name = [](const fs::path& a, const fs::path& b) {
    return a.filename().string() < b.filename().string();
  };
  std::sort(class_dirs.begin(), class_dirs.end(), by_name);

  DatasetIndex index;
  index.num_classes = static_cast<int>(class_dirs.size());
  for (size_t label = 0; label < class_dirs.size(); ++label) {
    std::vector<fs::path> files;
    for (const auto& entry : fs::directory_iterator(class_dirs[label])) {
      const std::string ext = lower(entry.path().extension().string());
      if (entry.is_regular_file() && !is_hidden(entry.path()) &&
          (ext == ".jpg" || ext == ".jpeg")) {
        files.push_back(entry.path());
      }
    }
    // An empty class would get a label no sample can ever teach; fail like torchvision does.
    if (files.empty()) {
      throw std::runtime_error("scan_dataset: class folder '" + class_dirs[label].string() +
                               "' holds no .jpg/.jpeg images");
    }
    std::sort(files.begin(), files.end(), by_name);
    for (const fs::path& f : files) {
      index.files.push_back(f.string());
      index.labels.push_back(static_cast<int64_t>(label));
    }
  }
  return index;
}

void augment_to_chw(const Image& img, int out_size, bool train, std::mt19937_64& rng, float* out) {
  check_image(img, "augment_to_chw");
  if (out_size <= 0 || out == nullptr) {
    throw std::invalid_argument("augment_to_chw: out_size must be positive and out non-null");
  }
  Crop crop;
  bool flip = false;
  if (train) {
    crop = random_resized_crop(img.width, img.height, rng);
    flip = uniform01(rng) < 0.5;
  } else {
    const int side = std::min(img.width, img.height);
    crop = {(img.width - side) / 2, (img.height - side) / 2, side, side};
  }

  Taps xs = make_taps(crop.x, crop.w, out_size);
  const Taps ys = make_taps(crop.y, crop.h, out_size);
  if (flip) {
    // Mirroring the column taps flips the output without a second pass.
    std::reverse(xs.i0.begin(), xs.i0.end());
    std::reverse(xs.i1.begin(), xs.i1.end());
    std::reverse(xs.frac.begin(), xs.frac.end());
  }

  const size_t plane = static_cast<size_t>(out_size) * out_size;
  const size_t row_bytes = static_cast<size_t>(img.width) * 3;
  constexpr float kScale = 1.0f / (255.0f * 0.25f), kShift = 0.5f / 0.25f;
  for (int oy = 0; oy < out_size; ++oy) {
    const uint8_t* row0 = img.rgb.data() + static_cast<size_t>(ys.i0[oy]) * row_bytes;
    const uint8_t* row1 = img.rgb.data() + static_cast<size_t>(ys.i1[oy]) * row_bytes;
    const float wy = ys.frac[oy];
    for (int ox = 0; ox < out_size; ++ox) {
      const size_t a = static_cast<size_t>(xs.i0[ox]) * 3, b = static_cast<size_t>(xs.i1[ox]) * 3;
      const float wx = xs.frac[ox];
      for (int c = 0; c < 3; ++c) {
        const float top = row0[a + c] + (row0[b + c] - row0[a + c]) * wx;
        const float bottom = row1[a + c] + (row1[b + c] - row1[a + c]) * wx;
        const float value = top + (bottom - top) * wy;
        out[c * plane + static_cast<size_t>(oy) * out_size + ox] = value * kScale - kShift;
      }
    }
  }
}

}  // namespace jpeg_example
