#include "tandem/gguf/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <utility>

#include "tandem/util/error.h"

namespace tandem::gguf {

MappedFile::MappedFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error("cannot open '" + path + "': " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    throw Error("cannot stat '" + path + "': " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error("'" + path + "' is not a regular file");
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      throw Error("cannot map '" + path + "' into memory: " + std::strerror(err));
    }
    data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
}

namespace {

// The page-aligned span holding [p, p + n).
std::pair<uint8_t*, size_t> page_span(const uint8_t* p, size_t n) {
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t b = reinterpret_cast<uintptr_t>(p) & ~(page - 1);
  const uintptr_t e = (reinterpret_cast<uintptr_t>(p) + n + page - 1) & ~(page - 1);
  return {reinterpret_cast<uint8_t*>(b), static_cast<size_t>(e - b)};
}

}  // namespace

uint8_t* MappedFile::writable(const uint8_t* p, size_t n) {
  if (n == 0 || p < data_ || p + n > data_ + size_) return nullptr;
  const auto [b, len] = page_span(p, n);
  if (::mprotect(b, len, PROT_READ | PROT_WRITE) != 0) return nullptr;
#ifdef MADV_POPULATE_WRITE
  // Copy the pages in one call rather than one fault each (advisory: older kernels fault them one by one).
  ::madvise(b, len, MADV_POPULATE_WRITE);
#endif
  return const_cast<uint8_t*>(p);
}

void MappedFile::seal(const uint8_t* p, size_t n) {
  if (n == 0 || p < data_ || p + n > data_ + size_) return;
  const auto [b, len] = page_span(p, n);
  ::mprotect(b, len, PROT_READ);
}

MappedFile::~MappedFile() {
  release();
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(other.data_), size_(other.size_), path_(std::move(other.path_)) {
  other.data_ = nullptr;
  other.size_ = 0;
}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    release();
    data_ = other.data_;
    size_ = other.size_;
    path_ = std::move(other.path_);
    other.data_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

void MappedFile::release() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

}  // namespace tandem::gguf
