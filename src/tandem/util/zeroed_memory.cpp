#include "tandem/util/zeroed_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <new>
#include <utility>

namespace tandem {

ZeroedMemory::ZeroedMemory(size_t bytes, size_t alignment) : size_(bytes) {
  if (bytes == 0) return;
  // Over-reserve by the alignment, then give back the unaligned head and the tail.
  const size_t extra = alignment > 1 ? alignment : 0;
  void* p = ::mmap(nullptr, bytes + extra, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  const auto b = reinterpret_cast<uintptr_t>(p);
  const uintptr_t a = extra > 0 ? (b + extra - 1) & ~uintptr_t{extra - 1} : b;
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t end = (a + bytes + page - 1) & ~(page - 1), reserved_end = b + bytes + extra;
  if (a > b) ::munmap(p, a - b);
  if (reserved_end > end) ::munmap(reinterpret_cast<void*>(end), reserved_end - end);
  data_ = reinterpret_cast<uint8_t*>(a);
}

ZeroedMemory::~ZeroedMemory() {
  release();
}

ZeroedMemory::ZeroedMemory(ZeroedMemory&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

ZeroedMemory& ZeroedMemory::operator=(ZeroedMemory&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void ZeroedMemory::release() {
  if (data_ != nullptr) ::munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
}

}  // namespace tandem
