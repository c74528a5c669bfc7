#include "jpeg_io.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace jpeg_example {
namespace {

namespace fs = std::filesystem;

// An RGB image of width x height, all zero.
Image black_image(int width, int height) {
  Image img;
  img.width = width;
  img.height = height;
  img.rgb.resize(static_cast<size_t>(width) * height * 3);
  return img;
}

// Smooth gradient: compresses almost losslessly, so round-trip error measures the codec path.
Image gradient_image(int width, int height) {
  Image img = black_image(width, height);
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      uint8_t* p = &img.rgb[(static_cast<size_t>(y) * width + x) * 3];
      p[0] = static_cast<uint8_t>(255 * x / (width - 1));
      p[1] = static_cast<uint8_t>(255 * y / (height - 1));
      p[2] = static_cast<uint8_t>(128 + 64 * std::sin(0.1 * (x + y)));
    }
  }
  return img;
}

// Every channel of column x holds column_value(x): lets bilinear results be computed by hand.
Image column_image(int width, int height, int step) {
  Image img = black_image(width, height);
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      for (int c = 0; c < 3; ++c) {
        img.rgb[(static_cast<size_t>(y) * width + x) * 3 + c] = static_cast<uint8_t>(x * step);
      }
    }
  }
  return img;
}

float normalised(double byte_value) {
  return static_cast<float>((byte_value / 255.0 - 0.5) / 0.25);
}

std::vector<char> read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_bytes(const fs::path& p, const std::vector<char>& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// `call` throws a std::runtime_error whose message names `text`.
void expect_runtime_error_naming(const std::function<void()>& call, const std::string& text) {
  try {
    call();
    FAIL() << "expected std::runtime_error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
}

class JpegIoTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::random_device rd;
    const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
    dir_ = fs::temp_directory_path() /
           ("jpeg_io_test_" + std::to_string(now) + "_" + std::to_string(rd()));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

TEST_F(JpegIoTest, RoundTripPreservesSizeAndPixels) {
  const Image img = gradient_image(67, 45);  // Not a multiple of the 8/16-pixel MCU.
  encode_jpeg_file(path("round.jpg"), img, 90);
  const Image back = decode_jpeg_file(path("round.jpg"));
  ASSERT_EQ(back.width, img.width);
  ASSERT_EQ(back.height, img.height);
  ASSERT_EQ(back.rgb.size(), img.rgb.size());
  double total = 0;
  for (size_t i = 0; i < img.rgb.size(); ++i) total += std::abs(int(img.rgb[i]) - int(back.rgb[i]));
  EXPECT_LT(total / static_cast<double>(img.rgb.size()), 8.0);
}

TEST_F(JpegIoTest, DecodeMissingFileThrowsWithPath) {
  const std::string missing = path("does_not_exist.jpg");
  expect_runtime_error_naming([&] { decode_jpeg_file(missing); }, missing);
}

TEST_F(JpegIoTest, DecodeRandomBytesThrowsWithPath) {
  std::mt19937_64 rng(7);
  std::vector<char> junk(4096);
  for (char& c : junk) c = static_cast<char>(rng());
  write_bytes(path("junk.jpg"), junk);
  expect_runtime_error_naming([&] { decode_jpeg_file(path("junk.jpg")); }, path("junk.jpg"));
}

TEST_F(JpegIoTest, DecodeEmptyFileThrows) {
  write_bytes(path("empty.jpg"), {});
  EXPECT_THROW(decode_jpeg_file(path("empty.jpg")), std::runtime_error);
}

TEST_F(JpegIoTest, DecodeTruncatedJpegThrowsWithPath) {
  encode_jpeg_file(path("full.jpg"), make_class_image(1, 4, 64, 3), 90);
  std::vector<char> bytes = read_bytes(path("full.jpg"));
  ASSERT_GT(bytes.size(), 200u);
  bytes.resize(bytes.size() / 2);
  write_bytes(path("truncated.jpg"), bytes);
  expect_runtime_error_naming([&] { decode_jpeg_file(path("truncated.jpg")); },
                              path("truncated.jpg"));
}

TEST_F(JpegIoTest, EncodeErrors) {
  const std::string bad_dir = path("no_such_dir/out.jpg");
  expect_runtime_error_naming([&] { encode_jpeg_file(bad_dir, gradient_image(16, 16), 90); },
                              bad_dir);
  Image malformed = gradient_image(16, 16);
  malformed.rgb.pop_back();
  EXPECT_THROW(encode_jpeg_file(path("x.jpg"), malformed, 90), std::invalid_argument);
  EXPECT_THROW(encode_jpeg_file(path("x.jpg"), gradient_image(16, 16), 0), std::invalid_argument);
  EXPECT_FALSE(fs::exists(path("x.jpg")));
}

TEST_F(JpegIoTest, EncodeWriteFailureThrowsAndKeepsSpecialFiles) {
  // /dev/full fails every write with ENOSPC: exercises libjpeg's write-error longjmp path, and the
  // cleanup must not unlink the device node (it would, as root, with a plain remove()).
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "/dev/full not available";
  EXPECT_THROW(encode_jpeg_file("/dev/full", gradient_image(64, 64), 90), std::runtime_error);
  EXPECT_TRUE(fs::exists("/dev/full"));
}

TEST_F(JpegIoTest, GenerateDatasetCountsLabelsAndCaching) {
  const std::string folder = path("data");
  const DatasetIndex index = generate_dataset(folder, 3, 5, 32, 42);
  ASSERT_EQ(index.num_classes, 3);
  ASSERT_EQ(index.files.size(), 15u);
  ASSERT_EQ(index.labels.size(), 15u);
  for (size_t i = 0; i < index.files.size(); ++i) {
    EXPECT_EQ(index.labels[i], static_cast<int64_t>(i / 5));
    EXPECT_EQ(fs::path(index.files[i]).parent_path().filename().string(), std::to_string(i / 5));
  }
  EXPECT_TRUE(fs::exists(fs::path(folder) / ".complete"));
  const Image first = decode_jpeg_file(index.files[0]);
  EXPECT_EQ(first.width, 32);
  EXPECT_EQ(first.height, 32);

  // Second call must not regenerate: mtimes unchanged and a deleted file stays deleted.
  const auto mtime = fs::last_write_time(index.files[3]);
  fs::remove(index.files[0]);
  const DatasetIndex again = generate_dataset(folder, 3, 5, 32, 42);
  EXPECT_EQ(again.files.size(), 14u);
  EXPECT_EQ(fs::last_write_time(index.files[3]), mtime);

  // Without the marker (an interrupted run) the dataset is generated again, identically.
  fs::remove(fs::path(folder) / ".complete");
  const DatasetIndex redone = generate_dataset(folder, 3, 5, 32, 42);
  EXPECT_EQ(redone.files, index.files);
  EXPECT_EQ(redone.labels, index.labels);

  // A marker for other arguments is an error, not a silently different dataset.
  EXPECT_THROW(generate_dataset(folder, 4, 5, 32, 42), std::runtime_error);
}

TEST_F(JpegIoTest, GenerateDatasetPadsClassNamesSoLabelsAreNumeric) {
  const DatasetIndex index = generate_dataset(path("many"), 12, 1, 16, 1);
  ASSERT_EQ(index.num_classes, 12);
  EXPECT_EQ(fs::path(index.files[2]).parent_path().filename().string(), "02");
  EXPECT_EQ(fs::path(index.files[11]).parent_path().filename().string(), "11");
}

TEST_F(JpegIoTest, InterruptedGenerationWithOtherArgumentsLeavesNoStaleFiles) {
  generate_dataset(path("data"), 2, 6, 16, 5);
  fs::remove(fs::path(path("data")) / ".complete");
  const DatasetIndex index = generate_dataset(path("data"), 2, 3, 16, 5);
  EXPECT_EQ(index.files.size(), 6u);
}

TEST_F(JpegIoTest, ScanDatasetErrors) {
  EXPECT_THROW(scan_dataset(path("missing")), std::runtime_error);
  fs::create_directories(path("empty"));
  EXPECT_THROW(scan_dataset(path("empty")), std::runtime_error);
  fs::create_directories(path("empty_class/a"));
  fs::create_directories(path("empty_class/b"));
  encode_jpeg_file(path("empty_class/a/x.JPEG"), gradient_image(8, 8), 90);
  expect_runtime_error_naming([&] { scan_dataset(path("empty_class")); }, "empty_class/b");
  encode_jpeg_file(path("empty_class/b/y.jpg"), gradient_image(8, 8), 90);
  write_bytes(path("empty_class/b/notes.txt"), {'h', 'i'});
  const DatasetIndex index = scan_dataset(path("empty_class"));
  ASSERT_EQ(index.files.size(), 2u);
  EXPECT_EQ(index.labels, (std::vector<int64_t>{0, 1}));
}

TEST_F(JpegIoTest, AugmentEvalIsExactOnIdentityAndCentreCrops) {
  // Same size: bilinear must reproduce the input exactly.
  const Image img = make_class_image(2, 5, 24, 9);
  std::mt19937_64 rng(1);
  std::vector<float> out(3 * 24 * 24);
  augment_to_chw(img, 24, false, rng, out.data());
  for (int c = 0; c < 3; ++c) {
    for (int y = 0; y < 24; ++y) {
      for (int x = 0; x < 24; ++x) {
        ASSERT_NEAR(out[(c * 24 + y) * 24 + x], normalised(img.rgb[(y * 24 + x) * 3 + c]), 1e-5);
      }
    }
  }
  // 6x4 with columns 0,10,..,50: the centre square is columns 1..4, output 4x4 is identity.
  std::vector<float> crop(3 * 4 * 4);
  augment_to_chw(column_image(6, 4, 10), 4, false, rng, crop.data());
  for (int x = 0; x < 4; ++x) EXPECT_NEAR(crop[x], normalised(10.0 * (x + 1)), 1e-5);
  // 4x4 -> 2x2 halves: half-pixel centres sample at 0.5 and 2.5, i.e. values 5 and 25.
  std::vector<float> half(3 * 2 * 2);
  augment_to_chw(column_image(4, 4, 10), 2, false, rng, half.data());
  EXPECT_NEAR(half[0], normalised(5), 1e-5);
  EXPECT_NEAR(half[1], normalised(25), 1e-5);
  EXPECT_NEAR(half[2 * 2 * 2 + 3], normalised(25), 1e-5);
}

TEST_F(JpegIoTest, AugmentEvalDeterministicTrainRandomAndFinite) {
  const Image img = make_class_image(3, 5, 48, 11);
  const int n = 32;
  std::mt19937_64 rng_a(1), rng_b(2);
  std::vector<float> a(3 * n * n, NAN), b(3 * n * n, NAN);
  augment_to_chw(img, n, false, rng_a, a.data());
  augment_to_chw(img, n, false, rng_b, b.data());
  EXPECT_EQ(a, b);
  for (float v : a) ASSERT_TRUE(std::isfinite(v));

  std::mt19937_64 rng(3);
  std::vector<float> prev(3 * n * n, NAN);
  int changed = 0;
  for (int i = 0; i < 20; ++i) {
    std::vector<float> cur(3 * n * n, NAN);
    augment_to_chw(img, n, true, rng, cur.data());
    for (float v : cur) {
      ASSERT_TRUE(std::isfinite(v));
      ASSERT_GE(v, normalised(0) - 1e-5);
      ASSERT_LE(v, normalised(255) + 1e-5);
    }
    if (cur != prev) ++changed;
    prev = cur;
  }
  EXPECT_EQ(changed, 20);

  // Same rng state, same output.
  std::mt19937_64 r1(99), r2(99);
  augment_to_chw(img, n, true, r1, a.data());
  augment_to_chw(img, n, true, r2, b.data());
  EXPECT_EQ(a, b);
}

TEST_F(JpegIoTest, AugmentTrainFlipsAboutHalfTheTime) {
  // Left half dark, right half bright. Any crop (width >= ~0.61 of the image) spans the middle, so
  // the leftmost output column is dark unless flipped.
  Image img = column_image(64, 64, 0);
  for (int y = 0; y < 64; ++y) {
    for (int x = 32; x < 64; ++x) {
      for (int c = 0; c < 3; ++c) img.rgb[(y * 64 + x) * 3 + c] = 255;
    }
  }
  std::mt19937_64 rng(5);
  std::vector<float> out(3 * 16 * 16);
  int flipped = 0;
  const int trials = 200;
  for (int i = 0; i < trials; ++i) {
    augment_to_chw(img, 16, true, rng, out.data());
    const bool left_bright = out[0] > 0, right_bright = out[15] > 0;
    EXPECT_NE(left_bright, right_bright);
    if (left_bright) ++flipped;
  }
  EXPECT_GT(flipped, trials / 4);
  EXPECT_LT(flipped, 3 * trials / 4);
}

TEST_F(JpegIoTest, AugmentRejectsBadArguments) {
  std::mt19937_64 rng(1);
  std::vector<float> out(3 * 4 * 4);
  EXPECT_THROW(augment_to_chw(Image{}, 4, true, rng, out.data()), std::invalid_argument);
  EXPECT_THROW(augment_to_chw(gradient_image(8, 8), 0, true, rng, out.data()),
               std::invalid_argument);
}

TEST_F(JpegIoTest, ClassImagesDeterministicAndDistinct) {
  const Image a = make_class_image(1, 10, 40, 123);
  const Image b = make_class_image(1, 10, 40, 123);
  EXPECT_EQ(a.width, 40);
  EXPECT_EQ(a.height, 40);
  EXPECT_EQ(a.rgb.size(), 40u * 40u * 3u);
  EXPECT_EQ(a.rgb, b.rgb);
  EXPECT_NE(a.rgb, make_class_image(1, 10, 40, 124).rgb);
  for (int label = 0; label < 10; ++label) {
    if (label != 1) {
      EXPECT_NE(a.rgb, make_class_image(label, 10, 40, 123).rgb) << label;
    }
  }
  EXPECT_THROW(make_class_image(10, 10, 40, 1), std::invalid_argument);
  EXPECT_THROW(make_class_image(0, 10, 4, 1), std::invalid_argument);
}

}  // namespace
}  // namespace jpeg_example
