// GGUF v3 writer. Metadata and tensor descriptions are collected first; write() then emits the header and
// streams each tensor's bytes from its producer, so a multi-gigabyte model is never held in memory twice.
// Everything the writer accepts is also accepted by gguf::File (valid UTF-8, unique names, dims that fit,
// rows that are whole blocks); it throws tandem::Error as soon as something is added that would not be.
// Not thread-safe: one thread builds and writes a Writer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/gguf/reader.h"
#include "tandem/tensor/dtype.h"

namespace tandem::gguf {

// Receives bytes in order, in pieces of any size.
using ByteSink = std::function<void(std::span<const uint8_t> bytes)>;
// Writes exactly one tensor's bytes (its byte size, no padding) into the sink, in as many pieces as it likes.
// The writer checks the total and throws tandem::Error on a short or long tensor.
using TensorProducer = std::function<void(const ByteSink& sink)>;

class Writer {
 public:
  static constexpr uint32_t kDefaultAlignment = 32;

  // `alignment` (a power of two, at most 2^20) aligns the data section and every tensor; anything but the
  // default is recorded as general.alignment, which the writer therefore owns.
  explicit Writer(uint32_t alignment = kDefaultAlignment);

  // Metadata, in the order added. Keys must be non-empty, valid UTF-8 and unique; strings valid UTF-8.
  void add_u8(std::string_view key, uint8_t value);
  void add_i8(std::string_view key, int8_t value);
  void add_u16(std::string_view key, uint16_t value);
  void add_i16(std::string_view key, int16_t value);
  void add_u32(std::string_view key, uint32_t value);
  void add_i32(std::string_view key, int32_t value);
  void add_u64(std::string_view key, uint64_t value);
  void add_i64(std::string_view key, int64_t value);
  void add_f32(std::string_view key, float value);
  void add_f64(std::string_view key, double value);
  void add_bool(std::string_view key, bool value);
  void add_string(std::string_view key, std::string_view value);

  // Arrays of one element type each (GGUF has no arrays of arrays).
  void add_array(std::string_view key, std::span<const uint8_t> values);
  void add_array(std::string_view key, std::span<const int8_t> values);
  void add_array(std::string_view key, std::span<const uint16_t> values);
  void add_array(std::string_view key, std::span<const int16_t> values);
  void add_array(std::string_view key, std::span<const uint32_t> values);
  void add_array(std::string_view key, std::span<const int32_t> values);
  void add_array(std::string_view key, std::span<const uint64_t> values);
  void add_array(std::string_view key, std::span<const int64_t> values);
  void add_array(std::string_view key, std::span<const float> values);
  void add_array(std::string_view key, std::span<const double> values);
  void add_array(std::string_view key, std::span<const bool> values);
  void add_array(std::string_view key, std::span<const std::string> values);
  void add_array(std::string_view key, std::span<const std::string_view> values);

  // A value read from another file (gguf::File), with its type and element type; copies metadata across.
  void add_value(std::string_view key, const Value& value);

  // Tensors, in the order added. `ne` holds 1 to 4 dimensions, ne[0] innermost (contiguous); ne[0] must be a
  // multiple of the type's block size. The span version borrows `data` (exactly the tensor's byte size) until
  // write() returns; the producer version is called once per write().
  void add_tensor(std::string_view name, DType type, std::vector<int64_t> ne, std::span<const uint8_t> data);
  void add_tensor(std::string_view name, DType type, std::vector<int64_t> ne, TensorProducer producer);

  uint32_t alignment() const { return alignment_; }
  // Byte size of a tensor of this type and shape (validated as add_tensor does).
  static size_t tensor_bytes(DType type, std::span<const int64_t> ne);

  // Emits the whole file into `sink`: header, padding, then each tensor followed by padding to the alignment.
  void write(const ByteSink& sink) const;
  // Writes the file atomically: into PATH.tmp, flushed to disk, then renamed over PATH. On any failure the
  // temporary file is removed and PATH is left as it was. Failures are tandem::Error naming the path (a
  // tandem::Error from a producer gains the path too); other exceptions from a producer propagate unchanged.
  void write_file(const std::string& path) const;

 private:
  struct Tensor {
    std::string name;
    DType type;
    std::vector<int64_t> ne;
    size_t bytes;
    uint64_t offset;  // relative to the data section
    TensorProducer producer;
  };

  void add_metadata(std::string_view key, uint32_t value_type, std::string payload);
  template <typename T>
  void add_numeric_array(std::string_view key, uint32_t elem_type, std::span<const T> values);
  std::string header() const;

  uint32_t alignment_;
  std::vector<std::string> keys_;
  std::vector<std::string> kv_bytes_;  // each pair serialized: key, value type, value
  std::vector<Tensor> tensors_;
  uint64_t data_bytes_ = 0;  // the data section so far, padded
};

}  // namespace tandem::gguf
