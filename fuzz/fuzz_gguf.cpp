// libFuzzer target for the GGUF reader: any input must either parse into views that lie inside it or be
// refused with tandem::Error. Sanitizers turn overreads, overflows and undefined behaviour into crashes.
#include <cstddef>
#include <cstdint>
#include <string>

#include "tandem/gguf/reader.h"
#include "tandem/util/error.h"

namespace {

// Calls every typed getter on every key; each may refuse the value's type with tandem::Error.
void exercise_getters(const tandem::gguf::File& f) {
  for (const auto& [key, value] : f.metadata()) {
    try {
      (void)f.get_string(key);
    } catch (const tandem::Error&) {
    }
    try {
      (void)f.get_int(key);
    } catch (const tandem::Error&) {
    }
    try {
      (void)f.get_float(key);
    } catch (const tandem::Error&) {
    }
    try {
      (void)f.get_bool(key);
    } catch (const tandem::Error&) {
    }
    try {
      (void)f.get_strings(key);
    } catch (const tandem::Error&) {
    }
    try {
      (void)f.get_f32_array(key);
    } catch (const tandem::Error&) {
    }
    try {
      (void)f.get_i32_array(key);
    } catch (const tandem::Error&) {
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    tandem::gguf::File f = tandem::gguf::File::parse(data, size, "fuzz.gguf");
    exercise_getters(f);
    // Touch the first and last byte of every tensor so the address sanitizer checks the bounds.
    volatile uint8_t sink = 0;
    for (const auto& t : f.tensors()) {
      (void)t.shape_string();
      if (t.bytes > 0) sink = static_cast<uint8_t>(sink + t.data[0] + t.data[t.bytes - 1]);
      if (f.tensor(t.name) == nullptr) __builtin_trap();
    }
    (void)sink;
  } catch (const tandem::Error&) {
  }
  return 0;
}
