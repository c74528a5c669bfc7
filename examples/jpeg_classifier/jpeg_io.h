// JPEG I/O, a procedural image-classification dataset and CPU-side augmentation for the
// jpeg_classifier example. Deliberately free of LibTorch so it can be built and tested alone.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace jpeg_example {

// Interleaved RGB8, row-major: pixel (x, y) channel c is rgb[(y * width + x) * 3 + c].
struct Image {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> rgb;
};

// Decodes any JPEG libjpeg can read (grayscale and YCbCr are converted to RGB). Throws
// std::runtime_error naming `path` and libjpeg's message if the file cannot be opened or is
// corrupt. Corrupt-data warnings (e.g. a truncated file) are treated as errors, because libjpeg
// would otherwise return a silently grey-filled image. Thread-safe (no shared state).
Image decode_jpeg_file(const std::string& path);

// Writes `img` as a baseline JPEG. `quality` must be in [1, 100] and `img` well formed (positive
// size, rgb.size() == width * height * 3), else std::invalid_argument. I/O or libjpeg failures
// throw std::runtime_error naming `path`; a partially written regular file is removed.
void encode_jpeg_file(const std::string& path, const Image& img, int quality);

// Deterministic synthetic image of class `label` in [0, num_classes): a striped object over a
// random gradient background with small distractor discs and per-pixel noise. The class decides
// the object shape (disc, square, triangle, ring), the stripe orientation (horizontal, vertical,
// diagonal) and, weakly, the hue; position, scale, rotation, colours and noise come from `seed`.
// All class cues are invariant under horizontal flips. Same arguments give the same pixels on
// every platform. Throws std::invalid_argument for bad arguments (size must be >= 8).
Image make_class_image(int label, int num_classes, int size, uint64_t seed);

// Flat list of images with labels in [0, num_classes); files are grouped by class, in order.
struct DatasetIndex {
  std::vector<std::string> files;
  std::vector<int64_t> labels;
  int num_classes = 0;
};

// Writes folder/<class>/<i>.jpg (quality 90; names zero-padded so sorted order is numeric order)
// unless folder/.complete exists, then returns scan_dataset(folder). The marker is written last, so
// an interrupted generation is redone on the next call. The marker records the arguments; if it
// exists but records different ones, throws std::runtime_error instead of returning a dataset of
// the wrong shape. Not safe to call concurrently from several processes on the same folder.
DatasetIndex generate_dataset(const std::string& folder, int num_classes, int images_per_class,
                              int size, uint64_t seed);

// ImageFolder-style scan: each non-hidden subfolder of `folder` is a class (sorted by name; label =
// position), holding .jpg/.jpeg files (case-insensitive, sorted by name). Throws
// std::runtime_error if the folder is missing, has no class subfolders or a class has no images.
DatasetIndex scan_dataset(const std::string& folder);

// Writes 3 * out_size * out_size floats to `out`, CHW, normalised as (x / 255 - 0.5) / 0.25.
// train: random-resized crop (area 0.5..1 of the image, aspect 3/4..4/3) resized bilinearly to
// out_size, then a horizontal flip with probability 0.5, drawing from `rng`. Eval: centre crop of
// the largest square resized to out_size; `rng` is not used. No antialiasing, so strong
// downscaling aliases. Thread-safe as long as each thread passes its own `rng` and `out`.
void augment_to_chw(const Image& img, int out_size, bool train, std::mt19937_64& rng, float* out);

}  // namespace jpeg_example
