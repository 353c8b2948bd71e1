// Zero-filled memory whose pages the system supplies on first touch (an anonymous mapping, RAII): a large
// buffer that is mostly never written costs nothing for the part it does not use. The KV cache sizes its
// blocks for the whole context up front; zero-filling them at creation faults in every page then, inside a
// server iteration, for every stream the first time a cache slot is used (docs/performance.md). A model file
// copied into memory (gguf/mapped_file.h) lives in one too, aligned to 2 MB pages.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tandem {

class ZeroedMemory {
 public:
  ZeroedMemory() = default;
  // `bytes` starting on a multiple of `alignment` (a power of two; 0: the system's page). Throws
  // std::bad_alloc when the system refuses the mapping.
  explicit ZeroedMemory(size_t bytes, size_t alignment = 0);
  ~ZeroedMemory();
  ZeroedMemory(ZeroedMemory&& other) noexcept;
  ZeroedMemory& operator=(ZeroedMemory&& other) noexcept;
  ZeroedMemory(const ZeroedMemory&) = delete;
  ZeroedMemory& operator=(const ZeroedMemory&) = delete;

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void release();
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace tandem
