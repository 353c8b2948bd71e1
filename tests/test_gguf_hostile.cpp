// Hostile and damaged GGUF files: every one must be refused with a tandem::Error that says what is wrong,
// never a crash, a hang or an allocation the file does not justify.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/gguf/reader.h"
#include "tandem/gguf/writer.h"
#include "tandem/util/error.h"

namespace {

using tandem::DType;
using tandem::Error;
using tandem::gguf::File;
using tandem::gguf::ValueType;
using tandem::gguf::Writer;
using Bytes = std::vector<uint8_t>;

constexpr uint64_t kHuge = uint64_t{1} << 60;

Bytes to_bytes(const Writer& w) {
  Bytes out;
  w.write([&out](std::span<const uint8_t> b) { out.insert(out.end(), b.begin(), b.end()); });
  return out;
}

Bytes pattern(size_t n) {
  Bytes v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 37 + 11);
  return v;
}

// A small valid file with every kind of metadata value and a few tensors. The markers used to find fields
// below ("k.text", "t.q8", ...) each occur once in it.
Bytes small_file(uint32_t alignment = 32) {
  Writer w(alignment);
  w.add_string("general.architecture", "llama");
  w.add_u32("k.u32", 7);
  w.add_u32("k.x1", 1);
  w.add_u32("k.x2", 2);
  w.add_bool("k.flag", true);
  w.add_string("k.text", "value!");
  w.add_f64("k.f64", 0.5);
  const bool bools[] = {true, false, true};
  w.add_array("k.bools", std::span<const bool>(bools));
  const std::vector<std::string> names = {"one", "two!"};
  w.add_array("k.names", std::span<const std::string>(names));
  const std::vector<float> f32s = {1.0f, 2.0f, 3.0f};
  w.add_array("k.floats", std::span<const float>(f32s));
  const Bytes first = pattern(4 * 8 * 2);
  const Bytes q8 = pattern(34 * 2);
  const Bytes last = pattern(2 * 3);
  w.add_tensor("t.first", DType::F32, {8, 2}, first);
  w.add_tensor("t.q8", DType::Q8_0, {64}, q8);
  w.add_tensor("t.x1", DType::F16, {3}, last);
  w.add_tensor("t.x2", DType::F16, {3}, last);
  return to_bytes(w);
}

// Position just past the only occurrence of `marker` in `b`.
size_t after(const Bytes& b, std::string_view marker) {
  std::string_view all(reinterpret_cast<const char*>(b.data()), b.size());
  size_t at = all.find(marker);
  EXPECT_NE(at, std::string_view::npos) << marker;
  EXPECT_EQ(all.find(marker, at + 1), std::string_view::npos) << marker << " is not unique";
  return at == std::string_view::npos ? 0 : at + marker.size();
}

template <typename T>
void poke(Bytes& b, size_t at, T v) {
  ASSERT_LE(at + sizeof(T), b.size());
  std::memcpy(b.data() + at, &v, sizeof(T));
}

// The fields of a tensor info that follow its name.
size_t dims_count_at(const Bytes& b, std::string_view name) {
  return after(b, name);
}
size_t dim_at(const Bytes& b, std::string_view name, int d) {
  return after(b, name) + 4 + 8 * static_cast<size_t>(d);
}
size_t type_at(const Bytes& b, std::string_view name, int n_dims) {
  return dim_at(b, name, n_dims);
}
size_t offset_at(const Bytes& b, std::string_view name, int n_dims) {
  return type_at(b, name, n_dims) + 4;
}

// Parses a copy sized exactly to the input (so an overread would leave the buffer) and expects a
// tandem::Error mentioning `phrase`.
void expect_refused(const Bytes& b, const std::string& phrase) {
  Bytes copy(b);
  try {
    File f = File::parse(copy.data(), copy.size(), "hostile.gguf");
    ADD_FAILURE() << "parsed, expected an error containing '" << phrase << "'";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("hostile.gguf"), std::string::npos) << msg;
    EXPECT_NE(msg.find(phrase), std::string::npos) << "expected '" << phrase << "' in: " << msg;
  }
}

// Hand-built bytes, for layouts the writer refuses to produce.
class Builder {
 public:
  Builder& u32(uint32_t v) { return raw(&v, 4); }
  Builder& u64(uint64_t v) { return raw(&v, 8); }
  Builder& str(std::string_view s) {
    u64(s.size());
    return raw(s.data(), s.size());
  }
  Builder& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    return raw("GGUF", 4).u32(version).u64(n_tensors).u64(n_kv);
  }
  Builder& zeros(size_t n) {
    bytes_.resize(bytes_.size() + n, 0);
    return *this;
  }
  Bytes bytes() const { return bytes_; }

 private:
  Builder& raw(const void* p, size_t n) {
    const auto* c = static_cast<const uint8_t*>(p);
    bytes_.insert(bytes_.end(), c, c + n);
    return *this;
  }
  Bytes bytes_;
};

TEST(GgufHostile, SmallFileIsValid) {
  Bytes b = small_file();
  File f = File::parse(b.data(), b.size());
  EXPECT_EQ(f.tensors().size(), 4u);
  EXPECT_EQ(f.metadata().size(), 10u);
}

TEST(GgufHostile, EmptyAndTinyFiles) {
  expect_refused({}, "too short to be GGUF (0 bytes)");
  expect_refused({'G', 'G', 'U'}, "too short");
  EXPECT_THROW(File::parse(nullptr, 0), Error);
}

TEST(GgufHostile, BadMagic) {
  Bytes b = small_file();
  b[3] = 'G';
  expect_refused(b, "bad magic");
  expect_refused({'l', 'm', 'g', 'g', 1, 0, 0, 0}, "bad magic");
  expect_refused({0, 0, 0, 0, 0, 0, 0, 0}, "bad magic");
}

TEST(GgufHostile, UnsupportedVersions) {
  for (uint32_t version : {1u, 4u, 0u, 0xFFFFFFFFu}) {
    SCOPED_TRACE(version);
    Bytes b = small_file();
    poke<uint32_t>(b, 4, version);
    expect_refused(b, version == 1 ? "version 1 is not supported" : "unsupported GGUF version");
  }
  Bytes v2 = small_file();
  poke<uint32_t>(v2, 4, 2);
  EXPECT_EQ(File::parse(v2.data(), v2.size()).version(), 2u);
}

TEST(GgufHostile, EveryTruncationIsRefused) {
  const Bytes full = small_file();
  File f = File::parse(full.data(), full.size());
  // The file may end in padding after the last tensor; prefixes that keep every tensor's bytes are valid.
  size_t needed = 0;
  for (const auto& t : f.tensors())
    needed = std::max(needed, static_cast<size_t>(t.data - full.data()) + t.bytes);
  ASSERT_LT(needed, full.size() + 1);
  for (size_t n = 0; n < full.size(); ++n) {
    SCOPED_TRACE(n);
    Bytes prefix(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(n));
    if (n < needed) {
      EXPECT_THROW(File::parse(prefix.data(), prefix.size(), "hostile.gguf"), Error);
    } else {
      EXPECT_NO_THROW(File::parse(prefix.data(), prefix.size()));
    }
  }
}

TEST(GgufHostile, TruncationMessagesSayWhatWasCut) {
  const Bytes full = small_file();
  expect_refused(Bytes(full.begin(), full.begin() + 6), "truncated while reading version");
  expect_refused(Bytes(full.begin(), full.begin() + 20), "truncated while reading metadata count");
  expect_refused(Bytes(full.begin(), full.begin() + 30), "metadata count 10 exceeds what the file holds");
  const auto cut = static_cast<std::ptrdiff_t>(after(full, "value!") - 3);
  expect_refused(Bytes(full.begin(), full.begin() + cut), "truncated while reading string value");
  Bytes no_data(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(after(full, "t.x2") + 24));
  expect_refused(no_data, "past the end of the file; the file may be truncated");
}

TEST(GgufHostile, AbsurdCountsFailFast) {
  Bytes b = small_file();
  poke<uint64_t>(b, 8, kHuge);
  expect_refused(b, "tensor count 1152921504606846976 exceeds what the file holds");

  b = small_file();
  poke<uint64_t>(b, 16, kHuge);
  expect_refused(b, "metadata count 1152921504606846976 exceeds what the file holds");

  b = small_file();
  poke<uint64_t>(b, 16, ~uint64_t{0});
  expect_refused(b, "exceeds what the file holds");

  b = small_file();  // array: type ARRAY, element type, count
  poke<uint64_t>(b, after(b, "k.floats") + 8, kHuge);
  expect_refused(b, "'k.floats' claims more elements than the file holds");

  b = small_file();
  poke<uint64_t>(b, after(b, "k.floats") + 8, ~uint64_t{0});
  expect_refused(b, "'k.floats' claims more elements than the file holds");

  b = small_file();
  poke<uint64_t>(b, after(b, "k.names") + 8, kHuge);
  expect_refused(b, "'k.names' claims more strings than the file holds");

  b = small_file();  // the string value's length precedes its bytes
  poke<uint64_t>(b, after(b, "value!") - 6 - 8, kHuge);
  expect_refused(b, "truncated while reading string value");

  b = small_file();
  poke<uint64_t>(b, after(b, "two!") - 4 - 8, ~uint64_t{0});
  expect_refused(b, "truncated while reading array string");

  b = small_file();  // a key's length
  poke<uint64_t>(b, after(b, "k.u32") - 5 - 8, kHuge);
  expect_refused(b, "metadata key is 1152921504606846976 bytes, longer than allowed");

  b = small_file();  // a tensor name's length
  poke<uint64_t>(b, after(b, "t.q8") - 4 - 8, kHuge);
  expect_refused(b, "tensor name is 1152921504606846976 bytes, longer than allowed");
}

TEST(GgufHostile, LongKeyWithinTheFileIsRefused) {
  Builder bld;
  bld.header(0, 1).str(std::string(65537, 'k')).u32(4).u32(1);
  expect_refused(bld.bytes(), "metadata key is 65537 bytes, longer than allowed");
}

TEST(GgufHostile, TensorOffsetsPastTheEnd) {
  Bytes b = small_file();
  poke<uint64_t>(b, offset_at(b, "t.x2", 1), uint64_t{1} << 40);
  expect_refused(b, "'t.x2' data (offset 1099511627776, 6 bytes) lies past the end");

  b = small_file();  // aligned and close to 2^64: must not wrap around
  poke<uint64_t>(b, offset_at(b, "t.first", 2), ~uint64_t{31});
  expect_refused(b, "lies past the end");

  b = small_file();  // starts inside the file, ends past it
  size_t data_start = b.size() - 256;
  {
    File f = File::parse(b.data(), b.size());
    data_start = static_cast<size_t>(f.tensors()[0].data - b.data());
  }
  uint64_t last_aligned = (b.size() - data_start) / 32 * 32;
  poke<uint64_t>(b, offset_at(b, "t.q8", 1), last_aligned - 32);
  expect_refused(b, "'t.q8' data");
}

TEST(GgufHostile, TensorDataPastTheEnd) {
  Bytes b = small_file();  // a bigger shape than the bytes the file holds
  poke<uint64_t>(b, dim_at(b, "t.x2", 0), 1000);
  expect_refused(b, "'t.x2' data (offset");
  b = small_file();
  poke<uint64_t>(b, dim_at(b, "t.first", 1), uint64_t{1} << 30);
  expect_refused(b, "lies past the end of the file");
}

TEST(GgufHostile, MisalignedOffsets) {
  for (uint64_t off : {uint64_t{4}, uint64_t{31}, uint64_t{33}}) {
    Bytes b = small_file();
    poke<uint64_t>(b, offset_at(b, "t.q8", 1), off);
    expect_refused(b, "offset " + std::to_string(off) + " is not aligned to 32");
  }
  Bytes b = small_file(64);
  poke<uint64_t>(b, offset_at(b, "t.q8", 1), 32);
  expect_refused(b, "is not aligned to 64");
}

// With general.alignment 1 the data section starts wherever the header ends, so tensor data can sit at any
// address. Placed at each of four consecutive addresses, the file parses at the one where the F32 tensor is
// 4-byte aligned (every other tensor then sits at an even address) and is refused at the other three.
TEST(GgufHostile, DataBelowItsTypesAlignment) {
  const Bytes b = small_file(1);
  int parsed = 0;
  for (size_t shift = 0; shift < 4; ++shift) {
    std::vector<uint32_t> words(b.size() / 4 + 2);  // 4-byte aligned storage
    uint8_t* at = reinterpret_cast<uint8_t*>(words.data()) + shift;
    std::memcpy(at, b.data(), b.size());
    try {
      File::parse(at, b.size(), "hostile.gguf");
      ++parsed;
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("is not aligned to"), std::string::npos) << msg;
      EXPECT_NE(msg.find("general.alignment 1 is too small"), std::string::npos) << msg;
    }
  }
  EXPECT_EQ(parsed, 1);
}

TEST(GgufHostile, DimensionsOutOfRange) {
  Bytes b = small_file();
  poke<uint32_t>(b, dims_count_at(b, "t.q8"), 0);
  expect_refused(b, "'t.q8' has 0 dimensions (1 to 4 allowed)");
  for (uint32_t nd : {5u, 64u, 0xFFFFFFFFu}) {
    b = small_file();
    poke<uint32_t>(b, dims_count_at(b, "t.q8"), nd);
    expect_refused(b, "has " + std::to_string(nd) + " dimensions (1 to 4 allowed)");
  }
  b = small_file();
  poke<uint64_t>(b, dim_at(b, "t.first", 1), 0);
  expect_refused(b, "'t.first' has dimension 0, out of range");
  b = small_file();
  poke<uint64_t>(b, dim_at(b, "t.first", 1), uint64_t{1} << 63);
  expect_refused(b, "out of range");
}

TEST(GgufHostile, DimensionProductOverflow) {
  // Four dimensions of 2^40 each: every one is allowed alone, the product (2^160) is not.
  Builder bld;
  bld.header(1, 0).str("w").u32(4);
  for (int d = 0; d < 4; ++d) bld.u64(uint64_t{1} << 40);
  bld.u32(0).u64(0).zeros(64);
  expect_refused(bld.bytes(), "'w' has too many elements (dimensions overflow)");

  // 2^32 * 2^32 wraps a 64-bit product to zero.
  Builder wrap;
  wrap.header(1, 0).str("w").u32(2).u64(uint64_t{1} << 32).u64(uint64_t{1} << 32).u32(0).u64(0).zeros(64);
  expect_refused(wrap.bytes(), "dimensions overflow");

  Bytes b = small_file();
  poke<uint64_t>(b, dim_at(b, "t.first", 0), uint64_t{1} << 26);
  poke<uint64_t>(b, dim_at(b, "t.first", 1), uint64_t{1} << 26);
  expect_refused(b, "dimensions overflow");
}

TEST(GgufHostile, UnknownTensorTypes) {
  for (uint32_t id : {4u, 5u, 31u, 36u, 40u, 1000u, 0xFFFFFFFFu}) {
    Bytes b = small_file();
    poke<uint32_t>(b, type_at(b, "t.x1", 1), id);
    expect_refused(b, "'t.x1' has unknown type id " + std::to_string(id));
  }
}

TEST(GgufHostile, RowLengthNotAWholeNumberOfBlocks) {
  Bytes b = small_file();
  poke<uint64_t>(b, dim_at(b, "t.q8", 0), 48);
  expect_refused(b, "'t.q8' row length 48 is not a multiple of Q8_0's block size 32");
  b = small_file();  // the same shape read as Q4_K (blocks of 256)
  poke<uint32_t>(b, type_at(b, "t.q8", 1), static_cast<uint32_t>(DType::Q4_K));
  expect_refused(b, "row length 64 is not a multiple of Q4_K's block size 256");
}

TEST(GgufHostile, UnknownValueTypes) {
  for (uint32_t t : {13u, 14u, 0x80000000u}) {
    Bytes b = small_file();
    poke<uint32_t>(b, after(b, "k.u32"), t);
    expect_refused(b, "metadata 'k.u32' has unknown value type " + std::to_string(t));
  }
  Bytes b = small_file();
  poke<uint32_t>(b, after(b, "k.floats") + 4, 13);
  expect_refused(b, "'k.floats' has unknown array element type 13");
  b = small_file();
  poke<uint32_t>(b, after(b, "k.floats") + 4, static_cast<uint32_t>(ValueType::ARRAY));
  expect_refused(b, "'k.floats' is an array of arrays");
}

TEST(GgufHostile, StringsThatAreNotUtf8) {
  struct Case {
    const char* marker;
    size_t back;  // how far before the marker's end to damage it
    const char* phrase;
  };
  const Case cases[] = {{"k.text", 1, "metadata key is not valid UTF-8"},
                        {"value!", 1, "string value is not valid UTF-8"},
                        {"two!", 1, "array string is not valid UTF-8"},
                        {"t.first", 1, "tensor name is not valid UTF-8"},
                        {"general.architecture", 20, "metadata key is not valid UTF-8"}};
  // A stray continuation byte, an overlong '/', a surrogate's lead, and a byte that never occurs.
  for (uint8_t bad : {uint8_t{0x80}, uint8_t{0xC0}, uint8_t{0xED}, uint8_t{0xFF}}) {
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(c.marker) + " " + std::to_string(bad));
      Bytes b = small_file();
      b[after(b, c.marker) - c.back] = bad;
      expect_refused(b, c.phrase);
    }
  }
  // A surrogate (U+D800) and a code point past U+10FFFF, both well-formed in shape.
  for (std::string_view seq : {std::string_view("\xED\xA0\x80"), std::string_view("\xF4\x90\x80\x80")}) {
    Builder bld;
    bld.header(0, 1).str("key").u32(static_cast<uint32_t>(ValueType::STRING)).str(seq);
    expect_refused(bld.bytes(), "string value is not valid UTF-8");
  }
}

TEST(GgufHostile, EmptyKey) {
  Builder bld;
  bld.header(0, 1).str("").u32(4).u32(1);
  expect_refused(bld.bytes(), "metadata key 0 is empty");
}

TEST(GgufHostile, DuplicateNames) {
  Bytes b = small_file();
  b[after(b, "k.x2") - 1] = '1';
  expect_refused(b, "metadata key 'k.x1' appears twice");
  b = small_file();
  b[after(b, "t.x2") - 1] = '1';
  expect_refused(b, "tensor name 't.x1' appears twice");
}

// Many distinct names: duplicate detection must stay linear (a quadratic scan takes minutes on this file and
// hours on a hostile file of a few hundred megabytes).
TEST(GgufHostile, ManyNamesParseInLinearTime) {
  const size_t n = 100000;
  Builder bld;
  bld.header(n, n);
  char name[16];
  for (size_t i = 0; i < n; ++i) {
    std::snprintf(name, sizeof(name), "k%07zu", i);
    bld.str(name).u32(static_cast<uint32_t>(ValueType::U32)).u32(1);
  }
  for (size_t i = 0; i < n; ++i) {
    std::snprintf(name, sizeof(name), "t%07zu", i);
    bld.str(name).u32(1).u64(1).u32(static_cast<uint32_t>(DType::F32)).u64(32 * i);
  }
  bld.zeros(64 + 32 * n);
  const Bytes b = bld.bytes();
  auto start = std::chrono::steady_clock::now();
  File f = File::parse(b.data(), b.size());
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(f.metadata().size(), n);
  EXPECT_EQ(f.tensors().size(), n);
  EXPECT_LT(seconds, 10.0) << "parsing " << n << " names should take well under a second";

  Bytes dup = b;  // the last key renamed to the first
  std::memcpy(dup.data() + after(dup, "k0099999") - 8, "k0000000", 8);
  expect_refused(dup, "metadata key 'k0000000' appears twice");
}

TEST(GgufHostile, BoolsThatAreNeitherZeroNorOne) {
  for (uint8_t v : {uint8_t{2}, uint8_t{0xFF}}) {
    Bytes b = small_file();
    b[after(b, "k.flag") + 4] = v;
    expect_refused(b, "bool value " + std::to_string(v) + " is neither 0 nor 1");
    b = small_file();  // type, element type, count, then the elements
    b[after(b, "k.bools") + 4 + 4 + 8 + 2] = v;
    expect_refused(b, "'k.bools' has a bool element that is neither 0 nor 1");
  }
}

TEST(GgufHostile, AlignmentNotAPowerOfTwo) {
  for (uint32_t a : {0u, 3u, 48u, 1u << 21, 0x80000000u}) {
    SCOPED_TRACE(a);
    Bytes b = small_file(64);
    poke<uint32_t>(b, after(b, "general.alignment") + 4, a);
    expect_refused(b, "general.alignment must be a power of two");
  }
  Bytes b = small_file(64);  // the right number with the wrong type
  poke<uint32_t>(b, after(b, "general.alignment"), static_cast<uint32_t>(ValueType::F32));
  poke<float>(b, after(b, "general.alignment") + 4, 64.0f);
  expect_refused(b, "general.alignment must be a power of two");
}

// A float array read as integers: NaN and values past int64's range are refused, not converted (which would
// be undefined behaviour).
TEST(GgufHostile, FloatArrayReadAsIntegers) {
  for (float bad :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(), 1e30f, -1e19f}) {
    SCOPED_TRACE(bad);
    Writer w;
    const std::vector<float> values = {1.0f, bad};
    w.add_array("k.floats", std::span<const float>(values));
    const Bytes b = to_bytes(w);
    File f = File::parse(b.data(), b.size());
    EXPECT_EQ(f.find("k.floats")->elem_i64(0), 1);
    try {
      (void)f.get_i32_array("k.floats");
      ADD_FAILURE() << "expected tandem::Error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("cannot be read as an integer"), std::string::npos) << e.what();
    }
  }
  Writer w;
  const std::vector<double> edge = {-9223372036854775808.0, 9.2e18, -0.5};
  w.add_array("k.f64s", std::span<const double>(edge));
  const Bytes b = to_bytes(w);
  File f = File::parse(b.data(), b.size());
  EXPECT_EQ(f.find("k.f64s")->elem_i64(0), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(f.find("k.f64s")->elem_i64(1), 9200000000000000000);
  EXPECT_EQ(f.find("k.f64s")->elem_i64(2), 0);
}

// Random damage to a valid file: the reader either refuses it with tandem::Error or returns a File whose
// every view lies inside the input.
TEST(GgufHostile, RandomByteFlipsNeverCrash) {
  const Bytes valid = small_file();
  std::mt19937_64 rng(20240607);
  int refused = 0;
  const int iterations = 4000;
  for (int it = 0; it < iterations; ++it) {
    Bytes b = valid;
    int flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < flips; ++k) {
      // Most of the interest is in the header: aim three in four flips there.
      size_t span = rng() % 4 != 0 ? std::min<size_t>(b.size(), 400) : b.size();
      size_t at = rng() % span;
      switch (rng() % 3) {
        case 0:
          b[at] ^= static_cast<uint8_t>(1u << (rng() % 8));
          break;
        case 1:
          b[at] = static_cast<uint8_t>(rng());
          break;
        default:
          b[at] = (rng() % 2) ? 0xFF : 0x00;
          break;
      }
    }
    if (rng() % 8 == 0) b.resize(rng() % b.size());
    const uint8_t* lo = b.data();
    const uint8_t* hi = b.data() + b.size();
    auto inside = [&](const void* p, size_t n) {
      const auto* q = static_cast<const uint8_t*>(p);
      return n == 0 || (q >= lo && q <= hi && n <= static_cast<size_t>(hi - q));
    };
    try {
      File f = File::parse(b.data(), b.size(), "flipped.gguf");
      for (const auto& [key, v] : f.metadata()) {
        ASSERT_TRUE(inside(v.str.data(), v.str.size())) << key;
        for (std::string_view s : v.strings) ASSERT_TRUE(inside(s.data(), s.size())) << key;
        if (v.type == ValueType::ARRAY && v.elem_type != ValueType::STRING && v.count > 0) {
          ASSERT_TRUE(inside(v.elems, 1)) << key;
          try {
            (void)f.get_f32_array(key);
            (void)f.get_i32_array(key);
          } catch (const Error&) {
          }
        }
      }
      for (const auto& t : f.tensors()) {
        ASSERT_TRUE(inside(t.data, t.bytes)) << t.name;
        ASSERT_EQ(t.bytes,
                  tandem::row_bytes(t.type, t.ne[0]) * static_cast<size_t>(t.ne[1] * t.ne[2] * t.ne[3]));
      }
    } catch (const Error& e) {
      ASSERT_NE(std::string(e.what()).find("flipped.gguf"), std::string::npos) << e.what();
      ++refused;
    }
  }
  // The flips must actually reach the parser's checks, not only tensor bytes.
  EXPECT_GT(refused, iterations / 4);
}

}  // namespace
