#include "tandem/gguf/writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <type_traits>

#include "tandem/gguf/reader.h"
#include "tandem/util/error.h"
#include "tandem/util/utf8.h"

namespace tandem::gguf {
namespace {

static_assert(std::endian::native == std::endian::little, "the GGUF writer assumes a little-endian host");

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" little-endian
constexpr uint32_t kVersion = 3;
constexpr size_t kMaxNameBytes = 1 << 16;  // the reader's limit on keys and tensor names
constexpr uint32_t kMaxAlignment = 1u << 20;
constexpr uint64_t kMaxDim = uint64_t{1} << 40;
constexpr uint64_t kMaxElements = uint64_t{1} << 50;
constexpr std::string_view kAlignmentKey = "general.alignment";

template <typename T>
void put(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}

void put_string(std::string& out, std::string_view s) {
  put<uint64_t>(out, s.size());
  out.append(s);
}

uint32_t type_id(ValueType t) {
  return static_cast<uint32_t>(t);
}

uint64_t align_up(uint64_t n, uint32_t alignment) {
  return (n + alignment - 1) / alignment * alignment;
}

void check_name(std::string_view name, const char* what) {
  if (name.empty()) throw Error(std::string("GGUF writer: a ") + what + " must not be empty");
  if (name.size() > kMaxNameBytes)
    throw Error(std::string("GGUF writer: ") + what + " '" + std::string(name.substr(0, 64)) + "...' is " +
                std::to_string(name.size()) + " bytes, more than " + std::to_string(kMaxNameBytes));
  if (!utf8_valid(name)) throw Error(std::string("GGUF writer: a ") + what + " is not valid UTF-8");
}

void check_string_value(std::string_view key, std::string_view s) {
  if (!utf8_valid(s))
    throw Error("GGUF writer: metadata '" + std::string(key) + "' has a string that is not valid UTF-8");
}

// Buffered output to a file descriptor; closes it on destruction.
class FileSink {
 public:
  explicit FileSink(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) fail("cannot create");
    buffer_.reserve(kBufferBytes);
  }
  ~FileSink() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileSink(const FileSink&) = delete;
  FileSink& operator=(const FileSink&) = delete;

  void append(std::span<const uint8_t> bytes) {
    if (buffer_.size() + bytes.size() > kBufferBytes) flush();
    if (bytes.size() >= kBufferBytes) {
      write_all(bytes.data(), bytes.size());
    } else {
      buffer_.insert(buffer_.end(), bytes.begin(), bytes.end());
    }
  }

  // Flushes, syncs to disk and closes, reporting any error (a failed close can mean lost data).
  void finish() {
    flush();
    if (::fsync(fd_) != 0) fail("cannot sync");
    int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) fail("cannot close");
  }

 private:
  static constexpr size_t kBufferBytes = size_t{1} << 20;

  [[noreturn]] void fail(const char* what) const {
    throw Error(std::string(what) + " '" + path_ + "': " + std::strerror(errno));
  }

  void flush() {
    write_all(buffer_.data(), buffer_.size());
    buffer_.clear();
  }

  void write_all(const uint8_t* p, size_t n) {
    while (n > 0) {
      ssize_t w = ::write(fd_, p, std::min<size_t>(n, size_t{1} << 30));
      if (w < 0) {
        if (errno == EINTR) continue;
        fail("cannot write");
      }
      p += w;
      n -= static_cast<size_t>(w);
    }
  }

  std::string path_;
  int fd_ = -1;
  std::vector<uint8_t> buffer_;
};

}  // namespace

Writer::Writer(uint32_t alignment) : alignment_(alignment) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0 || alignment > kMaxAlignment)
    throw Error("GGUF writer: alignment " + std::to_string(alignment) + " is not a power of two up to 2^20");
  if (alignment != kDefaultAlignment) {
    std::string kv;
    put_string(kv, kAlignmentKey);
    put<uint32_t>(kv, type_id(ValueType::U32));
    put<uint32_t>(kv, alignment);
    keys_.emplace_back(kAlignmentKey);
    kv_bytes_.push_back(std::move(kv));
  }
}

void Writer::add_metadata(std::string_view key, uint32_t value_type, std::string payload) {
  check_name(key, "metadata key");
  if (key == kAlignmentKey)
    throw Error("GGUF writer: general.alignment is set through the Writer's constructor, not as metadata");
  if (std::find(keys_.begin(), keys_.end(), key) != keys_.end())
    throw Error("GGUF writer: metadata key '" + std::string(key) + "' added twice");
  std::string kv;
  kv.reserve(8 + key.size() + 4 + payload.size());
  put_string(kv, key);
  put<uint32_t>(kv, value_type);
  kv += payload;
  keys_.emplace_back(key);
  kv_bytes_.push_back(std::move(kv));
}

#define TANDEM_GGUF_SCALAR(fn, T, VT)                   \
  void Writer::fn(std::string_view key, T value) {      \
    std::string payload;                                \
    put<T>(payload, value);                             \
    add_metadata(key, type_id(VT), std::move(payload)); \
  }
TANDEM_GGUF_SCALAR(add_u8, uint8_t, ValueType::U8)
TANDEM_GGUF_SCALAR(add_i8, int8_t, ValueType::I8)
TANDEM_GGUF_SCALAR(add_u16, uint16_t, ValueType::U16)
TANDEM_GGUF_SCALAR(add_i16, int16_t, ValueType::I16)
TANDEM_GGUF_SCALAR(add_u32, uint32_t, ValueType::U32)
TANDEM_GGUF_SCALAR(add_i32, int32_t, ValueType::I32)
TANDEM_GGUF_SCALAR(add_u64, uint64_t, ValueType::U64)
TANDEM_GGUF_SCALAR(add_i64, int64_t, ValueType::I64)
TANDEM_GGUF_SCALAR(add_f32, float, ValueType::F32)
TANDEM_GGUF_SCALAR(add_f64, double, ValueType::F64)
#undef TANDEM_GGUF_SCALAR

void Writer::add_bool(std::string_view key, bool value) {
  add_metadata(key, type_id(ValueType::BOOL), std::string(1, value ? '\1' : '\0'));
}

void Writer::add_string(std::string_view key, std::string_view value) {
  check_string_value(key, value);
  std::string payload;
  put_string(payload, value);
  add_metadata(key, type_id(ValueType::STRING), std::move(payload));
}

template <typename T>
void Writer::add_numeric_array(std::string_view key, uint32_t elem_type, std::span<const T> values) {
  std::string payload;
  payload.reserve(12 + values.size_bytes());
  put<uint32_t>(payload, elem_type);
  put<uint64_t>(payload, values.size());
  for (T v : values) put<T>(payload, v);
  add_metadata(key, type_id(ValueType::ARRAY), std::move(payload));
}

void Writer::add_array(std::string_view key, std::span<const uint8_t> values) {
  add_numeric_array(key, type_id(ValueType::U8), values);
}
void Writer::add_array(std::string_view key, std::span<const int8_t> values) {
  add_numeric_array(key, type_id(ValueType::I8), values);
}
void Writer::add_array(std::string_view key, std::span<const uint16_t> values) {
  add_numeric_array(key, type_id(ValueType::U16), values);
}
void Writer::add_array(std::string_view key, std::span<const int16_t> values) {
  add_numeric_array(key, type_id(ValueType::I16), values);
}
void Writer::add_array(std::string_view key, std::span<const uint32_t> values) {
  add_numeric_array(key, type_id(ValueType::U32), values);
}
void Writer::add_array(std::string_view key, std::span<const int32_t> values) {
  add_numeric_array(key, type_id(ValueType::I32), values);
}
void Writer::add_array(std::string_view key, std::span<const uint64_t> values) {
  add_numeric_array(key, type_id(ValueType::U64), values);
}
void Writer::add_array(std::string_view key, std::span<const int64_t> values) {
  add_numeric_array(key, type_id(ValueType::I64), values);
}
void Writer::add_array(std::string_view key, std::span<const float> values) {
  add_numeric_array(key, type_id(ValueType::F32), values);
}
void Writer::add_array(std::string_view key, std::span<const double> values) {
  add_numeric_array(key, type_id(ValueType::F64), values);
}

void Writer::add_array(std::string_view key, std::span<const bool> values) {
  std::vector<uint8_t> bytes(values.begin(), values.end());  // bool's representation is not the format's
  add_numeric_array(key, type_id(ValueType::BOOL), std::span<const uint8_t>(bytes));
}

void Writer::add_array(std::string_view key, std::span<const std::string> values) {
  std::vector<std::string_view> views(values.begin(), values.end());
  add_array(key, std::span<const std::string_view>(views));
}

void Writer::add_array(std::string_view key, std::span<const std::string_view> values) {
  std::string payload;
  put<uint32_t>(payload, type_id(ValueType::STRING));
  put<uint64_t>(payload, values.size());
  for (std::string_view s : values) {
    check_string_value(key, s);
    put_string(payload, s);
  }
  add_metadata(key, type_id(ValueType::ARRAY), std::move(payload));
}

size_t Writer::tensor_bytes(DType type, std::span<const int64_t> ne) {
  auto tr = dtype_traits(static_cast<uint32_t>(type));
  if (!tr) throw Error("GGUF writer: unknown tensor type id " + std::to_string(static_cast<uint32_t>(type)));
  if (ne.empty() || ne.size() > 4)
    throw Error("GGUF writer: a tensor has " + std::to_string(ne.size()) + " dimensions (1 to 4 allowed)");
  uint64_t total = 1;
  for (int64_t n : ne) {
    if (n <= 0 || static_cast<uint64_t>(n) > kMaxDim)
      throw Error("GGUF writer: tensor dimension " + std::to_string(n) + " is out of range (1 to 2^40)");
    total *= static_cast<uint64_t>(n);  // at most 2^50 * 2^40 before the check below: no overflow
    if (total > kMaxElements) throw Error("GGUF writer: a tensor has more than 2^50 elements");
  }
  if (static_cast<uint64_t>(ne[0]) % tr->block_size != 0)
    throw Error("GGUF writer: row length " + std::to_string(ne[0]) + " is not a multiple of " +
                std::string(tr->name) + "'s block size " + std::to_string(tr->block_size));
  return static_cast<size_t>(total / tr->block_size * tr->type_size);
}

void Writer::add_tensor(std::string_view name, DType type, std::vector<int64_t> ne,
                        std::span<const uint8_t> data) {
  size_t bytes = tensor_bytes(type, ne);
  if (data.size() != bytes)
    throw Error("GGUF writer: tensor '" + std::string(name) + "' has " + std::to_string(data.size()) +
                " bytes of data, its type and shape need " + std::to_string(bytes));
  add_tensor(name, type, std::move(ne), [data](const ByteSink& sink) { sink(data); });
}

void Writer::add_tensor(std::string_view name, DType type, std::vector<int64_t> ne, TensorProducer producer) {
  check_name(name, "tensor name");
  if (!producer) throw Error("GGUF writer: tensor '" + std::string(name) + "' has no data producer");
  size_t bytes;
  try {
    bytes = tensor_bytes(type, ne);
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + " (tensor '" + std::string(name) + "')");
  }
  for (const Tensor& t : tensors_)
    if (t.name == name) throw Error("GGUF writer: tensor '" + std::string(name) + "' added twice");
  uint64_t offset = data_bytes_;
  data_bytes_ = align_up(offset + bytes, alignment_);
  tensors_.push_back(Tensor{std::string(name), type, std::move(ne), bytes, offset, std::move(producer)});
}

std::string Writer::header() const {
  std::string h;
  put<uint32_t>(h, kMagic);
  put<uint32_t>(h, kVersion);
  put<uint64_t>(h, tensors_.size());
  put<uint64_t>(h, kv_bytes_.size());
  for (const std::string& kv : kv_bytes_) h += kv;
  for (const Tensor& t : tensors_) {
    put_string(h, t.name);
    put<uint32_t>(h, static_cast<uint32_t>(t.ne.size()));
    for (int64_t n : t.ne) put<uint64_t>(h, static_cast<uint64_t>(n));
    put<uint32_t>(h, static_cast<uint32_t>(t.type));
    put<uint64_t>(h, t.offset);
  }
  h.resize(align_up(h.size(), alignment_), '\0');
  return h;
}

void Writer::write(const ByteSink& sink) const {
  std::string h = header();
  sink(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(h.data()), h.size()));
  const std::vector<uint8_t> zeros(alignment_, 0);
  for (const Tensor& t : tensors_) {
    size_t written = 0;
    ByteSink counted = [&](std::span<const uint8_t> bytes) {
      if (bytes.size() > t.bytes - written)
        throw Error("GGUF writer: the producer of tensor '" + t.name + "' wrote more than its " +
                    std::to_string(t.bytes) + " bytes");
      written += bytes.size();
      sink(bytes);
    };
    t.producer(counted);
    if (written != t.bytes)
      throw Error("GGUF writer: the producer of tensor '" + t.name + "' wrote " + std::to_string(written) +
                  " of its " + std::to_string(t.bytes) + " bytes");
    size_t pad = static_cast<size_t>(align_up(t.bytes, alignment_) - t.bytes);
    if (pad > 0) sink(std::span<const uint8_t>(zeros.data(), pad));
  }
}

void Writer::write_file(const std::string& path) const {
  const std::string tmp = path + ".tmp";
  try {
    FileSink out(tmp);
    try {
      write([&out](std::span<const uint8_t> bytes) { out.append(bytes); });
    } catch (const Error& e) {
      throw Error(std::string(e.what()) + " (while writing '" + path + "')");
    }
    out.finish();
    if (std::rename(tmp.c_str(), path.c_str()) != 0)
      throw Error("cannot rename '" + tmp + "' to '" + path + "': " + std::strerror(errno));
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
}

// Element types are kept: a copied file reads back with the same value types.
void Writer::add_value(std::string_view key, const Value& v) {
  switch (v.type) {
    case ValueType::U8:
      return add_u8(key, static_cast<uint8_t>(v.u));
    case ValueType::I8:
      return add_i8(key, static_cast<int8_t>(v.i));
    case ValueType::U16:
      return add_u16(key, static_cast<uint16_t>(v.u));
    case ValueType::I16:
      return add_i16(key, static_cast<int16_t>(v.i));
    case ValueType::U32:
      return add_u32(key, static_cast<uint32_t>(v.u));
    case ValueType::I32:
      return add_i32(key, static_cast<int32_t>(v.i));
    case ValueType::U64:
      return add_u64(key, v.u);
    case ValueType::I64:
      return add_i64(key, v.i);
    case ValueType::F32:
      return add_f32(key, static_cast<float>(v.f));
    case ValueType::F64:
      return add_f64(key, v.f);
    case ValueType::BOOL:
      return add_bool(key, v.u != 0);
    case ValueType::STRING:
      return add_string(key, v.str);
    case ValueType::ARRAY:
      break;
  }
  auto numeric = [&]<typename T>(T) {
    std::vector<T> out(static_cast<size_t>(v.count));
    for (uint64_t k = 0; k < v.count; ++k) {
      if constexpr (std::is_floating_point_v<T>) {
        out[k] = static_cast<T>(v.elem_f64(k));
      } else {
        out[k] = static_cast<T>(v.elem_i64(k));
      }
    }
    add_array(key, std::span<const T>(out));
  };
  switch (v.elem_type) {
    case ValueType::U8:
      return numeric(uint8_t{});
    case ValueType::I8:
      return numeric(int8_t{});
    case ValueType::U16:
      return numeric(uint16_t{});
    case ValueType::I16:
      return numeric(int16_t{});
    case ValueType::U32:
      return numeric(uint32_t{});
    case ValueType::I32:
      return numeric(int32_t{});
    case ValueType::U64:
      return numeric(uint64_t{});
    case ValueType::I64:
      return numeric(int64_t{});
    case ValueType::F32:
      return numeric(float{});
    case ValueType::F64:
      return numeric(double{});
    case ValueType::BOOL: {
      std::unique_ptr<bool[]> out(new bool[v.count]);
      for (uint64_t k = 0; k < v.count; ++k) out[k] = v.elem_i64(k) != 0;
      return add_array(key, std::span<const bool>(out.get(), static_cast<size_t>(v.count)));
    }
    case ValueType::STRING:
      return add_array(key, std::span<const std::string_view>(v.strings));
    default:
      throw Error("metadata key '" + std::string(key) +
                  "' holds an array of arrays, which GGUF writers do not support");
  }
}

}  // namespace tandem::gguf
