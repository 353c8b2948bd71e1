#include "tandem/gguf/reader.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <unordered_set>

#include "tandem/util/error.h"
#include "tandem/util/utf8.h"

namespace tandem::gguf {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" little-endian
constexpr uint64_t kMaxKeyBytes = 1 << 16;
constexpr uint32_t kMaxDims = 4;
// Counts are bounded by the bytes left, but an in-memory entry is larger than its encoding: reserve at most
// this many up front and let the vectors grow with what the file really holds.
constexpr uint64_t kMaxReserve = 1 << 16;

// Bounds-checked little-endian reader over the file's bytes. Every read checks the remaining length first.
class Cursor {
 public:
  Cursor(const uint8_t* data, size_t size, const std::string& name) : data_(data), size_(size), name_(name) {}

  size_t pos() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }

  [[noreturn]] void fail(const std::string& what) const {
    throw Error("invalid GGUF file '" + name_ + "': " + what + " (at byte " + std::to_string(pos_) + " of " +
                std::to_string(size_) + ")");
  }

  void need(uint64_t n, const char* what) const {
    if (n > remaining()) fail(std::string("truncated while reading ") + what);
  }

  template <typename T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  std::string_view read_string(const char* what, uint64_t max_len = std::numeric_limits<uint64_t>::max()) {
    uint64_t len = read<uint64_t>(what);
    if (len > max_len) fail(std::string(what) + " is " + std::to_string(len) + " bytes, longer than allowed");
    need(len, what);
    std::string_view s(reinterpret_cast<const char*>(data_ + pos_), static_cast<size_t>(len));
    pos_ += static_cast<size_t>(len);
    if (!utf8_valid(s)) fail(std::string(what) + " is not valid UTF-8");
    return s;
  }

  const uint8_t* here() const { return data_ + pos_; }
  void skip(uint64_t n, const char* what) {
    need(n, what);
    pos_ += static_cast<size_t>(n);
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
  const std::string& name_;
};

size_t scalar_size(ValueType t) {
  switch (t) {
    case ValueType::U8:
    case ValueType::I8:
    case ValueType::BOOL:
      return 1;
    case ValueType::U16:
    case ValueType::I16:
      return 2;
    case ValueType::U32:
    case ValueType::I32:
    case ValueType::F32:
      return 4;
    case ValueType::U64:
    case ValueType::I64:
    case ValueType::F64:
      return 8;
    default:
      return 0;
  }
}

bool known_type(uint32_t t) {
  return t <= static_cast<uint32_t>(ValueType::F64);
}

// Converting a float outside int64's range (or NaN) to an integer is undefined behaviour: refuse it.
int64_t float_to_i64(double x) {
  if (!(x >= -9223372036854775808.0 && x < 9223372036854775808.0))
    throw Error("array element " + std::to_string(x) + " cannot be read as an integer");
  return static_cast<int64_t>(x);
}

void read_scalar(Cursor& c, ValueType t, Value& v) {
  v.type = t;
  switch (t) {
    case ValueType::U8:
      v.u = c.read<uint8_t>("u8 value");
      v.i = static_cast<int64_t>(v.u);
      break;
    case ValueType::I8:
      v.i = c.read<int8_t>("i8 value");
      v.u = static_cast<uint64_t>(v.i);
      break;
    case ValueType::U16:
      v.u = c.read<uint16_t>("u16 value");
      v.i = static_cast<int64_t>(v.u);
      break;
    case ValueType::I16:
      v.i = c.read<int16_t>("i16 value");
      v.u = static_cast<uint64_t>(v.i);
      break;
    case ValueType::U32:
      v.u = c.read<uint32_t>("u32 value");
      v.i = static_cast<int64_t>(v.u);
      break;
    case ValueType::I32:
      v.i = c.read<int32_t>("i32 value");
      v.u = static_cast<uint64_t>(v.i);
      break;
    case ValueType::U64:
      v.u = c.read<uint64_t>("u64 value");
      v.i = static_cast<int64_t>(v.u);
      break;
    case ValueType::I64:
      v.i = c.read<int64_t>("i64 value");
      v.u = static_cast<uint64_t>(v.i);
      break;
    case ValueType::BOOL: {
      uint8_t b = c.read<uint8_t>("bool value");
      if (b > 1) c.fail("bool value " + std::to_string(b) + " is neither 0 nor 1");
      v.u = b;
      v.i = b;
      break;
    }
    case ValueType::F32:
      v.f = c.read<float>("f32 value");
      return;
    case ValueType::F64:
      v.f = c.read<double>("f64 value");
      return;
    default:
      c.fail("internal: not a scalar type");
  }
  v.f = t == ValueType::U64 ? static_cast<double>(v.u) : static_cast<double>(v.i);
}

void read_value(Cursor& c, ValueType t, Value& v, const std::string& key) {
  if (t == ValueType::STRING) {
    v.type = t;
    v.str = c.read_string("string value");
    return;
  }
  if (t != ValueType::ARRAY) {
    read_scalar(c, t, v);
    return;
  }
  v.type = ValueType::ARRAY;
  uint32_t et = c.read<uint32_t>("array element type");
  if (!known_type(et)) c.fail("metadata '" + key + "' has unknown array element type " + std::to_string(et));
  v.elem_type = static_cast<ValueType>(et);
  if (v.elem_type == ValueType::ARRAY) c.fail("metadata '" + key + "' is an array of arrays (not supported)");
  v.count = c.read<uint64_t>("array length");
  if (v.elem_type == ValueType::STRING) {
    // Each string takes at least its 8-byte length: bound the count by the bytes left before allocating.
    if (v.count > c.remaining() / 8) c.fail("metadata '" + key + "' claims more strings than the file holds");
    v.strings.reserve(static_cast<size_t>(std::min<uint64_t>(v.count, kMaxReserve)));
    for (uint64_t k = 0; k < v.count; ++k) v.strings.push_back(c.read_string("array string"));
    return;
  }
  size_t es = scalar_size(v.elem_type);
  if (v.count > c.remaining() / es) c.fail("metadata '" + key + "' claims more elements than the file holds");
  v.elems = c.here();
  c.skip(v.count * es, "array elements");
  if (v.elem_type == ValueType::BOOL) {
    for (uint64_t k = 0; k < v.count; ++k)
      if (v.elems[k] > 1) c.fail("metadata '" + key + "' has a bool element that is neither 0 nor 1");
  }
}

}  // namespace

std::string_view value_type_name(ValueType t) {
  static constexpr std::string_view names[] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                               "bool", "string", "array", "u64", "i64", "f64"};
  auto i = static_cast<uint32_t>(t);
  return i < std::size(names) ? names[i] : "unknown";
}

bool Value::is_integer() const {
  switch (type) {
    case ValueType::U8:
    case ValueType::I8:
    case ValueType::U16:
    case ValueType::I16:
    case ValueType::U32:
    case ValueType::I32:
    case ValueType::U64:
    case ValueType::I64:
      return true;
    default:
      return false;
  }
}

double Value::elem_f64(uint64_t k) const {
  TANDEM_CHECK(k < count, "array index out of range");
  const uint8_t* p = elems + k * scalar_size(elem_type);
  switch (elem_type) {
    case ValueType::F32: {
      float x;
      std::memcpy(&x, p, 4);
      return x;
    }
    case ValueType::F64: {
      double x;
      std::memcpy(&x, p, 8);
      return x;
    }
    case ValueType::U64: {
      uint64_t x;
      std::memcpy(&x, p, 8);
      return static_cast<double>(x);
    }
    default:
      return static_cast<double>(elem_i64(k));
  }
}

int64_t Value::elem_i64(uint64_t k) const {
  TANDEM_CHECK(k < count, "array index out of range");
  const uint8_t* p = elems + k * scalar_size(elem_type);
  switch (elem_type) {
    case ValueType::U8:
    case ValueType::BOOL:
      return *p;
    case ValueType::I8:
      return static_cast<int8_t>(*p);
    case ValueType::U16: {
      uint16_t x;
      std::memcpy(&x, p, 2);
      return x;
    }
    case ValueType::I16: {
      int16_t x;
      std::memcpy(&x, p, 2);
      return x;
    }
    case ValueType::U32: {
      uint32_t x;
      std::memcpy(&x, p, 4);
      return x;
    }
    case ValueType::I32: {
      int32_t x;
      std::memcpy(&x, p, 4);
      return x;
    }
    case ValueType::U64: {
      uint64_t x;
      std::memcpy(&x, p, 8);
      return static_cast<int64_t>(x);
    }
    case ValueType::I64: {
      int64_t x;
      std::memcpy(&x, p, 8);
      return x;
    }
    case ValueType::F32: {
      float x;
      std::memcpy(&x, p, 4);
      return float_to_i64(x);
    }
    case ValueType::F64: {
      double x;
      std::memcpy(&x, p, 8);
      return float_to_i64(x);
    }
    default:
      TANDEM_CHECK(false, "not a numeric array");
  }
}

std::string TensorInfo::shape_string() const {
  std::string s = "[";
  for (int d = 0; d < n_dims; ++d) s += (d ? ", " : "") + std::to_string(ne[d]);
  return s + "]";
}

File File::open(const std::string& path, LoadMode mode) {
  auto map = std::make_shared<MappedFile>(path, mode);
  File f;
  f.map_ = map;
  f.data_ = map->data();
  f.size_ = map->size();
  f.name_ = path;
  f.parse_all();
  return f;
}

File File::parse(const uint8_t* data, size_t size, const std::string& name) {
  File f;
  f.data_ = data;
  f.size_ = size;
  f.name_ = name;
  f.parse_all();
  return f;
}

void File::parse_all() {
  Cursor c(data_, size_, name_);
  if (size_ < 4) c.fail("the file is too short to be GGUF (" + std::to_string(size_) + " bytes)");
  uint32_t magic = c.read<uint32_t>("magic");
  if (magic != kMagic) c.fail("bad magic: this is not a GGUF file");
  version_ = c.read<uint32_t>("version");
  if (version_ == 1) c.fail("GGUF version 1 is not supported; convert the file to version 3");
  if (version_ != 2 && version_ != 3)
    c.fail("unsupported GGUF version " + std::to_string(version_) + " (supported: 2 and 3)");
  uint64_t n_tensors = c.read<uint64_t>("tensor count");
  uint64_t n_kv = c.read<uint64_t>("metadata count");
  // A key-value pair takes at least 8 (key length) + 4 (type) + 1 bytes; a tensor info at least 8+4+4+8
  // bytes.
  if (n_kv > c.remaining() / 13)
    c.fail("metadata count " + std::to_string(n_kv) + " exceeds what the file holds");
  if (n_tensors > c.remaining() / 24)
    c.fail("tensor count " + std::to_string(n_tensors) + " exceeds what the file holds");

  // Names already seen, as views into the file: duplicate checks in linear time even for hostile counts.
  std::unordered_set<std::string_view> seen;
  kv_.reserve(static_cast<size_t>(std::min<uint64_t>(n_kv, kMaxReserve)));
  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string_view key_in_file = c.read_string("metadata key", kMaxKeyBytes);
    std::string key(key_in_file);
    if (key.empty()) c.fail("metadata key " + std::to_string(k) + " is empty");
    uint32_t t = c.read<uint32_t>("metadata value type");
    if (!known_type(t)) c.fail("metadata '" + key + "' has unknown value type " + std::to_string(t));
    Value v;
    read_value(c, static_cast<ValueType>(t), v, key);
    if (!seen.insert(key_in_file).second) c.fail("metadata key '" + key + "' appears twice");
    kv_.emplace_back(std::move(key), std::move(v));
  }

  if (const Value* a = find("general.alignment")) {
    if (!a->is_integer() || a->u == 0 || (a->u & (a->u - 1)) != 0 || a->u > (1u << 20))
      c.fail("general.alignment must be a power of two integer");
    alignment_ = static_cast<uint32_t>(a->u);
  }

  seen.clear();
  tensors_.reserve(static_cast<size_t>(std::min<uint64_t>(n_tensors, kMaxReserve)));
  for (uint64_t k = 0; k < n_tensors; ++k) {
    TensorInfo ti;
    std::string_view name_in_file = c.read_string("tensor name", kMaxKeyBytes);
    ti.name = std::string(name_in_file);
    uint32_t nd = c.read<uint32_t>("tensor dimension count");
    if (nd == 0 || nd > kMaxDims)
      c.fail("tensor '" + ti.name + "' has " + std::to_string(nd) + " dimensions (1 to 4 allowed)");
    ti.n_dims = static_cast<int>(nd);
    uint64_t total = 1;
    for (uint32_t d = 0; d < nd; ++d) {
      uint64_t n = c.read<uint64_t>("tensor dimension");
      if (n == 0 || n > (uint64_t{1} << 40))
        c.fail("tensor '" + ti.name + "' has dimension " + std::to_string(n) + ", out of range");
      if (total > std::numeric_limits<uint64_t>::max() / n || total * n > (uint64_t{1} << 50))
        c.fail("tensor '" + ti.name + "' has too many elements (dimensions overflow)");
      total *= n;
      ti.ne[d] = static_cast<int64_t>(n);
    }
    uint32_t type_id = c.read<uint32_t>("tensor type");
    auto tr = dtype_traits(type_id);
    if (!tr) c.fail("tensor '" + ti.name + "' has unknown type id " + std::to_string(type_id));
    ti.type = static_cast<DType>(type_id);
    if (ti.ne[0] % tr->block_size != 0)
      c.fail("tensor '" + ti.name + "' row length " + std::to_string(ti.ne[0]) + " is not a multiple of " +
             std::string(tr->name) + "'s block size " + std::to_string(tr->block_size));
    ti.bytes = static_cast<size_t>(total / tr->block_size * tr->type_size);
    ti.offset = c.read<uint64_t>("tensor offset");
    if (ti.offset % alignment_ != 0)
      c.fail("tensor '" + ti.name + "' offset " + std::to_string(ti.offset) + " is not aligned to " +
             std::to_string(alignment_));
    if (!seen.insert(name_in_file).second) c.fail("tensor name '" + ti.name + "' appears twice");
    tensors_.push_back(std::move(ti));
  }

  // The data section starts at the next multiple of the alignment.
  uint64_t data_start = (c.pos() + alignment_ - 1) / alignment_ * alignment_;
  for (TensorInfo& ti : tensors_) {
    if (data_start > size_ || ti.offset > size_ - data_start || ti.bytes > size_ - data_start - ti.offset)
      c.fail("tensor '" + ti.name + "' data (offset " + std::to_string(ti.offset) + ", " +
             std::to_string(ti.bytes) + " bytes) lies past the end of the file; the file may be truncated");
    ti.data = data_ + data_start + ti.offset;
    // The kernels read each element (or a block's f16 scales) in place, so the data must sit at that type's
    // natural alignment: always so with the format's default alignment of 32, but not with a smaller one.
    const DTypeTraits& tr = traits(ti.type);
    const size_t need = tr.block_size > 1 ? (tr.type_size % 2 == 0 ? 2 : 1) : tr.type_size;
    if (reinterpret_cast<uintptr_t>(ti.data) % need != 0)
      c.fail("tensor '" + ti.name + "' data (file byte " + std::to_string(data_start + ti.offset) +
             ") is not aligned to " + std::to_string(need) + " bytes as " + std::string(tr.name) +
             " data must be (general.alignment " + std::to_string(alignment_) + " is too small)");
  }

  // Each tensor owns its bytes: data shared with another tensor (a changed offset, or a type or shape that
  // makes a tensor longer than the space it was written in) would be read as two different weights.
  std::vector<const TensorInfo*> by_offset;
  by_offset.reserve(tensors_.size());
  for (const TensorInfo& ti : tensors_) by_offset.push_back(&ti);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->offset < b->offset; });
  for (size_t k = 1; k < by_offset.size(); ++k) {
    const TensorInfo& prev = *by_offset[k - 1];
    const TensorInfo& next = *by_offset[k];
    if (next.offset - prev.offset < prev.bytes)
      c.fail("tensor '" + prev.name + "' data (offset " + std::to_string(prev.offset) + ", " +
             std::to_string(prev.bytes) + " bytes as " + std::string(dtype_name(prev.type)) + " " +
             prev.shape_string() + ") overlaps tensor '" + next.name + "' (offset " +
             std::to_string(next.offset) + "); each tensor needs bytes of its own");
  }
}

const Value* File::find(std::string_view key) const {
  for (const auto& [k, v] : kv_)
    if (k == key) return &v;
  return nullptr;
}

namespace {
[[noreturn]] void wrong_type(const std::string& file, std::string_view key, const Value& v,
                             const char* want) {
  throw Error("GGUF file '" + file + "': metadata '" + std::string(key) + "' is " +
              std::string(value_type_name(v.type)) + ", expected " + want);
}
}  // namespace

std::optional<std::string_view> File::get_string(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != ValueType::STRING) wrong_type(name_, key, *v, "a string");
  return v->str;
}

std::optional<int64_t> File::get_int(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  // A bool is not a count: a head count stored as `true` would read as 1.
  if (!v->is_integer()) wrong_type(name_, key, *v, "an integer");
  if (v->type == ValueType::U64 && v->u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    throw Error("GGUF file '" + name_ + "': metadata '" + std::string(key) + "' is " + std::to_string(v->u) +
                ", too large for a signed 64-bit integer");
  return v->i;
}

std::optional<double> File::get_float(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  if (!v->is_integer() && !v->is_float()) wrong_type(name_, key, *v, "a number");
  return v->f;
}

std::optional<bool> File::get_bool(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != ValueType::BOOL && !v->is_integer()) wrong_type(name_, key, *v, "a bool");
  return v->u != 0;
}

std::span<const std::string_view> File::get_strings(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return {};
  if (v->type != ValueType::ARRAY || v->elem_type != ValueType::STRING)
    wrong_type(name_, key, *v, "a string array");
  return v->strings;
}

std::vector<float> File::get_f32_array(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return {};
  if (v->type != ValueType::ARRAY || v->elem_type == ValueType::STRING)
    wrong_type(name_, key, *v, "a numeric array");
  std::vector<float> out(static_cast<size_t>(v->count));
  for (uint64_t k = 0; k < v->count; ++k) out[k] = static_cast<float>(v->elem_f64(k));
  return out;
}

std::vector<int32_t> File::get_i32_array(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return {};
  if (v->type != ValueType::ARRAY || v->elem_type == ValueType::STRING)
    wrong_type(name_, key, *v, "a numeric array");
  std::vector<int32_t> out(static_cast<size_t>(v->count));
  for (uint64_t k = 0; k < v->count; ++k) {
    int64_t x = 0;
    try {
      x = v->elem_i64(k);
    } catch (const Error& e) {
      throw Error("GGUF file '" + name_ + "': metadata '" + std::string(key) + "': " + e.what());
    }
    if (x < INT32_MIN || x > INT32_MAX)
      throw Error("GGUF file '" + name_ + "': metadata '" + std::string(key) + "' element " +
                  std::to_string(k) + " (" + std::to_string(x) + ") does not fit a 32-bit integer");
    out[k] = static_cast<int32_t>(x);
  }
  return out;
}

const TensorInfo* File::tensor(std::string_view name) const {
  for (const TensorInfo& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

uint8_t* File::writable(const uint8_t* p, size_t n) const {
  return map_ ? map_->writable(p, n) : nullptr;
}

void File::seal(const uint8_t* p, size_t n) const {
  if (map_) map_->seal(p, n);
}

}  // namespace tandem::gguf
