// The GGUF writer, checked by reading its files back with gguf::File.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "tandem/gguf/reader.h"
#include "tandem/gguf/writer.h"
#include "tandem/util/error.h"
#include "test_util.h"

namespace {

using tandem::testing::TempDir;

using tandem::DType;
using tandem::Error;
using tandem::gguf::ByteSink;
using tandem::gguf::File;
using tandem::gguf::ValueType;
using tandem::gguf::Writer;
namespace fs = std::filesystem;

std::vector<uint8_t> pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>((i * 131 + seed * 7 + (i >> 8)) & 0xFF);
  return v;
}

std::vector<uint8_t> to_bytes(const Writer& w) {
  std::vector<uint8_t> out;
  w.write([&out](std::span<const uint8_t> b) { out.insert(out.end(), b.begin(), b.end()); });
  return out;
}

bool same_bytes(const tandem::gguf::TensorInfo& t, const std::vector<uint8_t>& want) {
  return t.bytes == want.size() && std::memcmp(t.data, want.data(), want.size()) == 0;
}

TEST(GgufWriter, RoundTripsEveryMetadataTypeAndTensors) {
  const TempDir dir("tandem-gguf-writer");
  const std::string path = dir.file("all.gguf");

  const std::vector<uint8_t> a_u8 = {0, 1, 255};
  const std::vector<int8_t> a_i8 = {-128, 0, 127};
  const std::vector<uint16_t> a_u16 = {0, 65535};
  const std::vector<int16_t> a_i16 = {-32768, 32767, -1};
  const std::vector<uint32_t> a_u32 = {0, 4000000000u};
  const std::vector<int32_t> a_i32 = {-2147483647 - 1, 2147483647, 5};
  const std::vector<uint64_t> a_u64 = {0, std::numeric_limits<uint64_t>::max()};
  const std::vector<int64_t> a_i64 = {std::numeric_limits<int64_t>::min(), -2, 3};
  const std::vector<float> a_f32 = {1.5f, -0.25f, 3e38f};
  const std::vector<double> a_f64 = {0.1, -1e300};
  const std::vector<bool> bools = {true, false, true};
  const bool a_bool[] = {true, false, true};
  const std::vector<std::string> a_str = {"hello", "", "héllo wörld ✓", "\xF0\x9F\x98\x80"};
  const std::vector<std::string_view> a_sv = {"a", "bc"};
  const std::vector<int32_t> a_empty;

  Writer w;
  w.add_u8("t.u8", 200);
  w.add_i8("t.i8", -100);
  w.add_u16("t.u16", 60000);
  w.add_i16("t.i16", -30000);
  w.add_u32("t.u32", 4000000000u);
  w.add_i32("t.i32", -2000000000);
  w.add_u64("t.u64", 18000000000000000000ull);
  w.add_i64("t.i64", -9000000000000000000ll);
  w.add_f32("t.f32", 0.15625f);
  w.add_f64("t.f64", -2.718281828459045);
  w.add_bool("t.true", true);
  w.add_bool("t.false", false);
  w.add_string("t.str", "llama ✓");
  w.add_string("t.empty_str", "");
  w.add_array("a.u8", std::span<const uint8_t>(a_u8));
  w.add_array("a.i8", std::span<const int8_t>(a_i8));
  w.add_array("a.u16", std::span<const uint16_t>(a_u16));
  w.add_array("a.i16", std::span<const int16_t>(a_i16));
  w.add_array("a.u32", std::span<const uint32_t>(a_u32));
  w.add_array("a.i32", std::span<const int32_t>(a_i32));
  w.add_array("a.u64", std::span<const uint64_t>(a_u64));
  w.add_array("a.i64", std::span<const int64_t>(a_i64));
  w.add_array("a.f32", std::span<const float>(a_f32));
  w.add_array("a.f64", std::span<const double>(a_f64));
  w.add_array("a.bool", std::span<const bool>(a_bool));
  w.add_array("a.str", std::span<const std::string>(a_str));
  w.add_array("a.sv", std::span<const std::string_view>(a_sv));
  w.add_array("a.empty", std::span<const int32_t>(a_empty));

  // Several types, shapes and sizes; one tensor is produced in small pieces by a callback.
  const auto f32 = pattern(4 * 7 * 3, 1);       // F32 [7, 3]
  const auto f16 = pattern(2 * 5, 2);           // F16 [5]
  const auto q8 = pattern(34 * 2 * 2 * 3, 3);   // Q8_0 [64, 2, 3]: 2 blocks per row
  const auto q4k = pattern(144 * 2, 4);         // Q4_K [256, 1, 1, 2]
  const auto big = pattern(4 * 1000 * 300, 5);  // F32 [1000, 300], larger than the file buffer
  w.add_tensor("tok.f32", DType::F32, {7, 3}, f32);
  w.add_tensor("tok.f16", DType::F16, {5}, f16);
  w.add_tensor("blk.0.q8", DType::Q8_0, {64, 2, 3}, q8);
  w.add_tensor("blk.0.q4k", DType::Q4_K, {256, 1, 1, 2}, q4k);
  int producer_calls = 0;
  w.add_tensor("streamed", DType::F32, {1000, 300}, [&](const ByteSink& sink) {
    ++producer_calls;
    for (size_t at = 0; at < big.size(); at += 4093)
      sink(std::span<const uint8_t>(big.data() + at, std::min<size_t>(4093, big.size() - at)));
  });
  w.write_file(path);
  EXPECT_EQ(producer_calls, 1);
  EXPECT_FALSE(fs::exists(path + ".tmp"));

  File f = File::open(path);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.file_size() % 32, 0u);

  // Metadata: order, types and values.
  const std::vector<std::string> keys = {
      "t.u8",   "t.i8",    "t.u16", "t.i16",       "t.u32",  "t.i32", "t.u64", "t.i64",  "t.f32", "t.f64",
      "t.true", "t.false", "t.str", "t.empty_str", "a.u8",   "a.i8",  "a.u16", "a.i16",  "a.u32", "a.i32",
      "a.u64",  "a.i64",   "a.f32", "a.f64",       "a.bool", "a.str", "a.sv",  "a.empty"};
  ASSERT_EQ(f.metadata().size(), keys.size());
  for (size_t i = 0; i < keys.size(); ++i) EXPECT_EQ(f.metadata()[i].first, keys[i]);
  EXPECT_EQ(f.find("t.u8")->type, ValueType::U8);
  EXPECT_EQ(f.get_int("t.u8").value(), 200);
  EXPECT_EQ(f.find("t.i8")->type, ValueType::I8);
  EXPECT_EQ(f.get_int("t.i8").value(), -100);
  EXPECT_EQ(f.find("t.u16")->type, ValueType::U16);
  EXPECT_EQ(f.get_int("t.u16").value(), 60000);
  EXPECT_EQ(f.find("t.i16")->type, ValueType::I16);
  EXPECT_EQ(f.get_int("t.i16").value(), -30000);
  EXPECT_EQ(f.find("t.u32")->type, ValueType::U32);
  EXPECT_EQ(f.get_int("t.u32").value(), 4000000000ll);
  EXPECT_EQ(f.find("t.i32")->type, ValueType::I32);
  EXPECT_EQ(f.get_int("t.i32").value(), -2000000000);
  EXPECT_EQ(f.find("t.u64")->type, ValueType::U64);
  EXPECT_EQ(f.find("t.u64")->u, 18000000000000000000ull);
  EXPECT_EQ(f.find("t.i64")->type, ValueType::I64);
  EXPECT_EQ(f.get_int("t.i64").value(), -9000000000000000000ll);
  EXPECT_EQ(f.find("t.f32")->type, ValueType::F32);
  EXPECT_EQ(f.get_float("t.f32").value(), 0.15625);
  EXPECT_EQ(f.find("t.f64")->type, ValueType::F64);
  EXPECT_EQ(f.get_float("t.f64").value(), -2.718281828459045);
  EXPECT_EQ(f.find("t.true")->type, ValueType::BOOL);
  EXPECT_EQ(f.get_bool("t.true").value(), true);
  EXPECT_EQ(f.get_bool("t.false").value(), false);
  EXPECT_EQ(f.find("t.str")->type, ValueType::STRING);
  EXPECT_EQ(f.get_string("t.str").value(), "llama ✓");
  EXPECT_EQ(f.get_string("t.empty_str").value(), "");

  auto check_array = [&](const char* key, ValueType elem, const auto& want) {
    SCOPED_TRACE(key);
    const tandem::gguf::Value* v = f.find(key);
    ASSERT_NE(v, nullptr);
    EXPECT_EQ(v->type, ValueType::ARRAY);
    EXPECT_EQ(v->elem_type, elem);
    ASSERT_EQ(v->count, want.size());
    for (size_t k = 0; k < want.size(); ++k) {
      if constexpr (std::is_floating_point_v<std::decay_t<decltype(want[0])>>) {
        EXPECT_EQ(v->elem_f64(k), static_cast<double>(want[k]));
      } else if constexpr (std::is_same_v<std::decay_t<decltype(want[0])>, uint64_t>) {
        EXPECT_EQ(static_cast<uint64_t>(v->elem_i64(k)), want[k]);
      } else {
        EXPECT_EQ(v->elem_i64(k), static_cast<int64_t>(want[k]));
      }
    }
  };
  check_array("a.u8", ValueType::U8, a_u8);
  check_array("a.i8", ValueType::I8, a_i8);
  check_array("a.u16", ValueType::U16, a_u16);
  check_array("a.i16", ValueType::I16, a_i16);
  check_array("a.u32", ValueType::U32, a_u32);
  check_array("a.i32", ValueType::I32, a_i32);
  check_array("a.u64", ValueType::U64, a_u64);
  check_array("a.i64", ValueType::I64, a_i64);
  check_array("a.f32", ValueType::F32, a_f32);
  check_array("a.f64", ValueType::F64, a_f64);
  check_array("a.bool", ValueType::BOOL, bools);
  check_array("a.empty", ValueType::I32, a_empty);
  EXPECT_EQ(f.get_i32_array("a.i32"), a_i32);
  EXPECT_EQ(f.get_f32_array("a.f32"), a_f32);

  auto strs = f.get_strings("a.str");
  ASSERT_EQ(strs.size(), a_str.size());
  for (size_t k = 0; k < a_str.size(); ++k) EXPECT_EQ(strs[k], a_str[k]);
  auto svs = f.get_strings("a.sv");
  ASSERT_EQ(svs.size(), a_sv.size());
  for (size_t k = 0; k < a_sv.size(); ++k) EXPECT_EQ(svs[k], a_sv[k]);

  // Tensors: order, types, shapes, aligned offsets and bytes.
  ASSERT_EQ(f.tensors().size(), 5u);
  struct Want {
    const char* name;
    DType type;
    std::vector<int64_t> ne;
    const std::vector<uint8_t>* data;
  };
  const Want want[] = {{"tok.f32", DType::F32, {7, 3}, &f32},
                       {"tok.f16", DType::F16, {5}, &f16},
                       {"blk.0.q8", DType::Q8_0, {64, 2, 3}, &q8},
                       {"blk.0.q4k", DType::Q4_K, {256, 1, 1, 2}, &q4k},
                       {"streamed", DType::F32, {1000, 300}, &big}};
  uint64_t prev_end = 0;
  for (size_t i = 0; i < std::size(want); ++i) {
    const auto& t = f.tensors()[i];
    SCOPED_TRACE(want[i].name);
    EXPECT_EQ(t.name, want[i].name);
    EXPECT_EQ(t.type, want[i].type);
    ASSERT_EQ(t.n_dims, static_cast<int>(want[i].ne.size()));
    for (int d = 0; d < 4; ++d) EXPECT_EQ(t.ne[d], d < t.n_dims ? want[i].ne[static_cast<size_t>(d)] : 1);
    EXPECT_EQ(t.offset % 32, 0u);
    EXPECT_GE(t.offset, prev_end);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % 32, 0u);  // the map is page-aligned
    prev_end = t.offset + t.bytes;
    EXPECT_TRUE(same_bytes(t, *want[i].data));
    EXPECT_EQ(f.tensor(want[i].name), &t);
  }
}

TEST(GgufWriter, EmptyFileRoundTrips) {
  Writer w;
  auto bytes = to_bytes(w);
  EXPECT_EQ(bytes.size(), 32u);  // 24-byte header padded to the alignment
  File f = File::parse(bytes.data(), bytes.size());
  EXPECT_TRUE(f.metadata().empty());
  EXPECT_TRUE(f.tensors().empty());
}

TEST(GgufWriter, CustomAlignmentIsRecordedAndUsed) {
  for (uint32_t alignment : {1u, 8u, 64u, 4096u}) {
    SCOPED_TRACE(alignment);
    Writer w(alignment);
    const auto a = pattern(4 * 3, 1);
    const auto b = pattern(2 * 9, 2);
    w.add_string("general.architecture", "llama");
    w.add_tensor("a", DType::F32, {3}, a);
    w.add_tensor("b", DType::F16, {9}, b);
    auto bytes = to_bytes(w);
    EXPECT_EQ(bytes.size() % alignment, 0u);
    File f = File::parse(bytes.data(), bytes.size());
    EXPECT_EQ(f.alignment(), alignment);
    if (alignment != 32) {
      EXPECT_EQ(f.get_int("general.alignment").value(), alignment);
    } else {
      EXPECT_EQ(f.find("general.alignment"), nullptr);
    }
    ASSERT_EQ(f.tensors().size(), 2u);
    EXPECT_EQ(f.tensors()[1].offset % alignment, 0u);
    EXPECT_EQ(static_cast<size_t>(f.tensors()[0].data - bytes.data()) % alignment, 0u);
    EXPECT_TRUE(same_bytes(f.tensors()[0], a));
    EXPECT_TRUE(same_bytes(f.tensors()[1], b));
  }
}

template <typename F>
void expect_error(F&& f, const std::string& phrase) {
  try {
    f();
    ADD_FAILURE() << "expected a tandem::Error containing '" << phrase << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(phrase), std::string::npos) << e.what();
  }
}

TEST(GgufWriter, RejectsWhatTheReaderWouldReject) {
  expect_error([] { Writer w(48); }, "power of two");
  expect_error([] { Writer w(0); }, "power of two");
  expect_error([] { Writer w(1u << 21); }, "power of two");
  Writer w;
  w.add_u32("k", 1);
  expect_error([&] { w.add_string("k", "again"); }, "added twice");
  expect_error([&] { w.add_u32("", 1); }, "must not be empty");
  expect_error([&] { w.add_u32("bad\xFF", 1); }, "not valid UTF-8");
  expect_error([&] { w.add_string("s", "\xC0\xAF"); }, "not valid UTF-8");
  const std::vector<std::string> bad = {"ok", "\xED\xA0\x80"};  // a UTF-16 surrogate
  expect_error([&] { w.add_array("arr", std::span<const std::string>(bad)); }, "not valid UTF-8");
  expect_error([&] { w.add_u32("general.alignment", 64); }, "constructor");
  expect_error([&] { w.add_u32(std::string(70000, 'k'), 1); }, "bytes, more than");

  const auto data = pattern(34, 0);
  expect_error(
      [&] {
        w.add_tensor("q", DType::Q8_0, {16, 2}, data);
      },
      "not a multiple of Q8_0's block size 32");
  expect_error([&] { w.add_tensor("q", DType::Q8_0, {32, 2}, data); }, "need 68");
  expect_error([&] { w.add_tensor("q", DType::F32, {}, data); }, "0 dimensions");
  expect_error([&] { w.add_tensor("q", DType::F32, {1, 1, 1, 1, 1}, data); }, "5 dimensions");
  expect_error([&] { w.add_tensor("q", DType::F32, {0}, data); }, "out of range");
  expect_error([&] { w.add_tensor("q", DType::F32, {-3}, data); }, "out of range");
  expect_error([&] { w.add_tensor("q", DType::F32, {1 << 30, 1 << 30}, data); }, "more than 2^50 elements");
  expect_error([&] { w.add_tensor("q", static_cast<DType>(4), {32}, data); }, "unknown tensor type id 4");
  expect_error([&] { w.add_tensor("", DType::Q8_0, {32}, data); }, "must not be empty");
  expect_error([&] { w.add_tensor("q", DType::Q8_0, {32}, tandem::gguf::TensorProducer()); },
               "no data producer");
  w.add_tensor("q", DType::Q8_0, {32}, data);
  expect_error([&] { w.add_tensor("q", DType::Q8_0, {32}, data); }, "added twice");
}

TEST(GgufWriter, ShortOrLongProducerFailsAndLeavesNoFile) {
  const TempDir dir("tandem-gguf-writer");
  const std::string path = dir.file("bad.gguf");
  const auto data = pattern(64, 1);
  for (size_t produce : {size_t{0}, size_t{63}, size_t{64 + 1}}) {
    SCOPED_TRACE(produce);
    Writer w;
    w.add_u32("k", 1);
    w.add_tensor("t", DType::F32, {16}, [&](const ByteSink& sink) {
      std::vector<uint8_t> out(produce, 7);
      sink(out);
    });
    expect_error([&] { w.write_file(path); }, "the producer of tensor 't' wrote");
    EXPECT_FALSE(fs::exists(path));
    EXPECT_FALSE(fs::exists(path + ".tmp"));
  }
}

TEST(GgufWriter, FailureKeepsThePreviousFile) {
  const TempDir dir("tandem-gguf-writer");
  const std::string path = dir.file("model.gguf");
  {
    Writer good;
    good.add_string("general.name", "first");
    good.write_file(path);
  }
  struct Boom : std::runtime_error {
    Boom() : std::runtime_error("boom") {}
  };
  Writer w;
  w.add_string("general.name", "second");
  w.add_tensor("t", DType::F32, {4}, [](const ByteSink& sink) {
    uint8_t half[8] = {};
    sink(half);
    throw Boom();
  });
  EXPECT_THROW(w.write_file(path), Boom);  // a producer's own exception type is kept
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  EXPECT_EQ(File::open(path).get_string("general.name").value(), "first");
}

TEST(GgufWriter, UnwritablePathIsAnError) {
  const TempDir dir("tandem-gguf-writer");
  Writer w;
  expect_error([&] { w.write_file(dir.file("no/such/dir/x.gguf")); }, "cannot create");
}

TEST(GgufWriter, StreamsTensorDataWithoutCopyingIt) {
  // 64 MiB produced from one 64 KiB buffer: the writer never needs the whole tensor at once.
  const TempDir dir("tandem-gguf-writer");
  const std::string path = dir.file("stream.gguf");
  const size_t chunk = 64 * 1024;
  const auto piece = pattern(chunk, 9);
  const int64_t n = static_cast<int64_t>((size_t{64} << 20) / 2);
  Writer w;
  w.add_tensor("big", DType::F16, {n}, [&](const ByteSink& sink) {
    for (size_t at = 0; at < (size_t{64} << 20); at += chunk) sink(piece);
  });
  w.write_file(path);
  File f = File::open(path);
  const auto* t = f.tensor("big");
  ASSERT_NE(t, nullptr);
  ASSERT_EQ(t->bytes, size_t{64} << 20);
  bool same = true;
  for (size_t at = 0; at < t->bytes && same; at += chunk)
    same = std::memcmp(t->data + at, piece.data(), chunk) == 0;
  EXPECT_TRUE(same);
}

}  // namespace

TEST(GgufReaderArrays, I32ArrayOutOfRangeIsAnErrorNamingTheKey) {
  tandem::gguf::Writer w;
  const int64_t big[] = {1, int64_t{1} << 40};
  w.add_array("test.ids", std::span<const int64_t>(big));
  const float nan_values[] = {1.0f, std::numeric_limits<float>::quiet_NaN()};
  w.add_array("test.floats", std::span<const float>(nan_values));
  std::vector<uint8_t> bytes;
  w.write([&](std::span<const uint8_t> b) { bytes.insert(bytes.end(), b.begin(), b.end()); });
  const auto f = tandem::gguf::File::parse(bytes.data(), bytes.size(), "ranges.gguf");
  for (const char* key : {"test.ids", "test.floats"}) {
    try {
      (void)f.get_i32_array(key);
      FAIL() << key << " was read as 32-bit integers";
    } catch (const tandem::Error& e) {
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  }
}
