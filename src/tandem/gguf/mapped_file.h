// A whole file in memory (RAII), read-only: mapped from the page cache, or copied into the process's own
// memory (anonymous pages, 2 MB ones where the kernel gives them). Weights are used in place from it; the
// loader may repack some in place into private pages (writable()).
//
// Why a copy: decode streams every weight once per token, and on some virtual machines pages of a file
// mapping pay periodic stalls that anonymous memory does not (docs/performance.md, Weights in memory). A
// mapping keeps what only it gives: pages shared between processes and files larger than memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "tandem/util/zeroed_memory.h"

namespace tandem::gguf {

// How a file is brought into memory: kAuto copies it when it fits in half of the memory the system reports
// available (else maps it), kMap maps it, kCopy copies it (an error when memory for the copy is refused).
enum class LoadMode { kAuto, kMap, kCopy };

// Whether kAuto copies a file of `file_bytes` when the system reports `available_bytes` free (0: unknown).
bool auto_copies(uint64_t file_bytes, uint64_t available_bytes);

// The memory the system reports available (MemAvailable on Linux), 0 when unknown.
uint64_t available_memory_bytes();

class MappedFile {
 public:
  MappedFile() = default;
  // Throws tandem::Error naming the path and the reason.
  explicit MappedFile(const std::string& path, LoadMode mode = LoadMode::kAuto);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Whether the bytes are a copy in the process's own memory (else a mapping of the file).
  bool copied() const { return copied_; }

  // Makes the pages holding [p, p + n) of the map writable for this process alone (private copy-on-write
  // pages: the file and other processes never see the writes; a written page replaces the file's page in
  // this process, so memory does not double). Returns p as writable, or nullptr when the system refuses.
  uint8_t* writable(const uint8_t* p, size_t n);
  // Those pages read-only again.
  void seal(const uint8_t* p, size_t n);

 private:
  void release();
  uintptr_t protection_unit() const;
  // Copies the file into anonymous memory; false when that memory is refused and !required.
  bool copy_in(int fd, bool required);
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  ZeroedMemory copy_;  // a copy's memory (whole 2 MB pages); empty for a mapping
  bool copied_ = false;
  std::string path_;
};

}  // namespace tandem::gguf
