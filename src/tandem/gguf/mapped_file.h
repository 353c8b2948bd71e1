// A memory map of a whole file (RAII), read-only. Weights are used in place from it; the loader may repack
// some in place into private pages (writable()).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace tandem::gguf {

class MappedFile {
 public:
  MappedFile() = default;
  explicit MappedFile(const std::string& path);  // throws tandem::Error naming the path and the reason
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

  // Makes the pages holding [p, p + n) of the map writable for this process alone (private copy-on-write
  // pages: the file and other processes never see the writes; a written page replaces the file's page in
  // this process, so memory does not double). Returns p as writable, or nullptr when the system refuses.
  uint8_t* writable(const uint8_t* p, size_t n);
  // Those pages read-only again.
  void seal(const uint8_t* p, size_t n);

 private:
  void release();
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

}  // namespace tandem::gguf
