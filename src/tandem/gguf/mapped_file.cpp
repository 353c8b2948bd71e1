#include "tandem/gguf/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <new>
#include <utility>

#include "tandem/util/error.h"

namespace tandem::gguf {

bool auto_copies(uint64_t file_bytes, uint64_t available_bytes) {
  return available_bytes > 0 && file_bytes <= available_bytes / 2;
}

uint64_t available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kb = 0;
  std::string unit;
  while (in >> key >> kb) {
    std::getline(in, unit);
    if (key == "MemAvailable:") return kb * 1024;
  }
  return 0;
}

MappedFile::MappedFile(const std::string& path, LoadMode mode) : path_(path) {
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
  if (size_ == 0) {
    ::close(fd);
    return;
  }
  // kAuto falls back to a mapping when the memory for a copy is refused; kCopy reports it.
  const bool required = mode == LoadMode::kCopy;
  if (mode == LoadMode::kAuto)
    mode = auto_copies(size_, available_memory_bytes()) ? LoadMode::kCopy : LoadMode::kMap;
  try {
    if (mode == LoadMode::kCopy && copy_in(fd, required)) {
      ::close(fd);
      return;
    }
  } catch (...) {
    ::close(fd);
    throw;
  }
  void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  if (p == MAP_FAILED) {
    int err = errno;
    ::close(fd);
    throw Error("cannot map '" + path + "' into memory: " + std::strerror(err));
  }
  data_ = static_cast<const uint8_t*>(p);
  ::close(fd);
}

namespace {

constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kReadChunk = size_t{8} << 20;

// The span of whole pages of `page` bytes holding [p, p + n).
std::pair<uint8_t*, size_t> page_span(const uint8_t* p, size_t n, uintptr_t page) {
  const uintptr_t b = reinterpret_cast<uintptr_t>(p) & ~(page - 1);
  const uintptr_t e = (reinterpret_cast<uintptr_t>(p) + n + page - 1) & ~(page - 1);
  return {reinterpret_cast<uint8_t*>(b), static_cast<size_t>(e - b)};
}

}  // namespace

bool MappedFile::copy_in(int fd, bool required) {
  // Anonymous memory starting on a 2 MB boundary, so that the kernel can back it with 2 MB pages.
  const size_t len = (size_ + kHugePage - 1) & ~(kHugePage - 1);
  ZeroedMemory copy;
  try {
    copy = ZeroedMemory(len, kHugePage);
  } catch (const std::bad_alloc&) {
    if (!required) return false;
    throw Error("cannot reserve " + std::to_string(size_ >> 20) + " MB to load '" + path_ +
                "' into memory (--mmap maps the file instead)");
  }
  uint8_t* dst = copy.data();
#ifdef MADV_HUGEPAGE
  ::madvise(dst, len, MADV_HUGEPAGE);  // advisory: without it the copy stays in 4 KB pages
#endif
#ifdef MADV_POPULATE_WRITE
  // All pages in one call before the reads (advisory): faulting them in one by one during the copy is several
  // times slower (docs/performance.md, Weights in memory).
  ::madvise(dst, len, MADV_POPULATE_WRITE);
#endif
  size_t done = 0;
  while (done < size_) {
    const ssize_t r = ::pread(fd, dst + done, std::min(size_ - done, kReadChunk), static_cast<off_t>(done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      throw Error("cannot read '" + path_ + "': " +
                  (r < 0 ? std::strerror(errno) : "the file ended early (was it changed while loading?)"));
    }
    done += static_cast<size_t>(r);
  }
  ::mprotect(dst, len, PROT_READ);
  copy_ = std::move(copy);
  data_ = dst;
  copied_ = true;
  return true;
}

// A copy changes the protection of whole 2 MB pages (its own bytes: the copy spans whole 2 MB pages), since a
// change inside one splits its mapping into 4 KB pages, which lose what the copy is for.
uintptr_t MappedFile::protection_unit() const {
  return copied_ ? kHugePage : static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
}

uint8_t* MappedFile::writable(const uint8_t* p, size_t n) {
  if (n == 0 || p < data_ || p + n > data_ + size_) return nullptr;
  const auto [b, len] = page_span(p, n, protection_unit());
  if (::mprotect(b, len, PROT_READ | PROT_WRITE) != 0) return nullptr;
#ifdef MADV_POPULATE_WRITE
  // Copy the pages in one call rather than one fault each (advisory: older kernels fault them one by one).
  ::madvise(b, len, MADV_POPULATE_WRITE);
#endif
  return const_cast<uint8_t*>(p);
}

void MappedFile::seal(const uint8_t* p, size_t n) {
  if (n == 0 || p < data_ || p + n > data_ + size_) return;
  const auto [b, len] = page_span(p, n, protection_unit());
  ::mprotect(b, len, PROT_READ);
}

MappedFile::~MappedFile() {
  release();
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(other.data_),
      size_(other.size_),
      copy_(std::move(other.copy_)),
      copied_(other.copied_),
      path_(std::move(other.path_)) {
  other.data_ = nullptr;
  other.size_ = 0;
  other.copied_ = false;
}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    release();
    data_ = other.data_;
    size_ = other.size_;
    copy_ = std::move(other.copy_);
    copied_ = other.copied_;
    path_ = std::move(other.path_);
    other.data_ = nullptr;
    other.size_ = 0;
    other.copied_ = false;
  }
  return *this;
}

void MappedFile::release() {
  if (data_ != nullptr && !copied_) ::munmap(const_cast<uint8_t*>(data_), size_);
  copy_ = ZeroedMemory();
  data_ = nullptr;
  size_ = 0;
  copied_ = false;
}

}  // namespace tandem::gguf
