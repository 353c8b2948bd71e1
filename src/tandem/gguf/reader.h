// GGUF v2/v3 reader. Parses the header, metadata and tensor infos of a whole file held in memory (normally a
// MappedFile) and validates every count, size and offset against the file's length before using it, so a
// hostile or truncated file yields a tandem::Error and never a crash or an allocation the file does not
// justify. Strings and tensor data are views into the file's bytes: the File must outlive them.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/gguf/mapped_file.h"
#include "tandem/tensor/dtype.h"

namespace tandem::gguf {

enum class ValueType : uint32_t {
  U8 = 0,
  I8 = 1,
  U16 = 2,
  I16 = 3,
  U32 = 4,
  I32 = 5,
  F32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  U64 = 10,
  I64 = 11,
  F64 = 12,
};

std::string_view value_type_name(ValueType t);

// One metadata value. Scalars are widened into `i`/`u`/`f`; strings and arrays view the file.
struct Value {
  ValueType type = ValueType::U8;
  int64_t i = 0;   // signed integer types and bool
  uint64_t u = 0;  // unsigned integer types and bool
  double f = 0;    // float types (and every integer type, widened)
  std::string_view str;

  // Arrays: element type, count, the first element's bytes (numeric) or each string (STRING).
  ValueType elem_type = ValueType::U8;
  uint64_t count = 0;
  const uint8_t* elems = nullptr;
  std::vector<std::string_view> strings;

  bool is_integer() const;
  bool is_float() const { return type == ValueType::F32 || type == ValueType::F64; }
  // Element k of a numeric array, widened (k < count, elem_type not STRING/ARRAY).
  double elem_f64(uint64_t k) const;
  int64_t elem_i64(uint64_t k) const;
};

struct TensorInfo {
  std::string name;
  DType type = DType::F32;
  int n_dims = 0;
  std::array<int64_t, 4> ne = {1, 1, 1, 1};  // ne[0] is the contiguous (innermost) dimension
  uint64_t offset = 0;                       // relative to the data section
  size_t bytes = 0;
  const uint8_t* data = nullptr;  // view into the file

  int64_t elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
  std::string shape_string() const;
};

class File {
 public:
  // Brings a file into memory (MappedFile: mapped or copied, by `mode`) and parses it. Throws tandem::Error
  // with the path and what is wrong. Mapped by default: reading metadata, or each tensor once (info,
  // tokenize, quantize), gains nothing from a copy; model::Model::load decides for the weights a model
  // decodes with.
  static File open(const std::string& path, LoadMode mode = LoadMode::kMap);
  // Parses bytes the caller keeps alive (fuzzing, tests). `name` is used in messages.
  static File parse(const uint8_t* data, size_t size, const std::string& name = "<memory>");

  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  const std::string& path() const { return name_; }
  size_t file_size() const { return size_; }
  // Whether the bytes are a copy in the process's own memory (MappedFile::copied).
  bool copied() const { return map_ && map_->copied(); }

  const std::vector<std::pair<std::string, Value>>& metadata() const { return kv_; }
  const Value* find(std::string_view key) const;

  // Typed getters: nullopt when absent; tandem::Error when present with an incompatible type. get_int takes
  // the integer types only (not bool) and refuses a u64 past int64's range.
  std::optional<std::string_view> get_string(std::string_view key) const;
  std::optional<int64_t> get_int(std::string_view key) const;
  std::optional<double> get_float(std::string_view key) const;  // accepts integer values too
  std::optional<bool> get_bool(std::string_view key) const;
  // Arrays: empty when absent; tandem::Error when present with another element type.
  std::span<const std::string_view> get_strings(std::string_view key) const;
  std::vector<float> get_f32_array(std::string_view key) const;
  std::vector<int32_t> get_i32_array(std::string_view key) const;

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* tensor(std::string_view name) const;

  // Tensor bytes made writable for this process alone (MappedFile::writable), for repacking weights in place
  // at load; nullptr for a file parsed from caller-owned memory or when the system refuses. seal() makes
  // them read-only again.
  uint8_t* writable(const uint8_t* p, size_t n) const;
  void seal(const uint8_t* p, size_t n) const;

 private:
  File() = default;
  void parse_all();

  std::shared_ptr<MappedFile> map_;  // null when parsing caller-owned memory
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string name_;
  uint32_t version_ = 0;
  uint32_t alignment_ = 32;
  std::vector<std::pair<std::string, Value>> kv_;
  std::vector<TensorInfo> tensors_;
};

}  // namespace tandem::gguf
