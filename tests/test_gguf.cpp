#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

#include "tandem/gguf/reader.h"
#include "tandem/model/model.h"
#include "test_util.h"

using tandem::gguf::File;

TEST(Gguf, ReadsRealModel) {
  File f = File::open(tandem::testing::shared_path("models/stories260K.gguf"));
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.get_string("general.architecture").value(), "llama");
  EXPECT_EQ(f.get_strings("tokenizer.ggml.tokens").size(), 512u);
  ASSERT_NE(f.tensor("token_embd.weight"), nullptr);
  EXPECT_EQ(f.tensor("token_embd.weight")->ne[0], 64);
}

namespace {

using tandem::gguf::LoadMode;
using tandem::gguf::MappedFile;

std::string write_temp(const std::vector<uint8_t>& bytes) {
  char path[] = "/tmp/tandem-mapped-XXXXXX";
  const int fd = ::mkstemp(path);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(::write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  ::close(fd);
  return path;
}

std::vector<uint8_t> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

// A mapping and a copy hold the same bytes (a size that is no whole number of pages or 2 MB pages), and
// writes through writable() stay in this process: the file and another instance keep their bytes.
TEST(MappedFile, MapAndCopyHoldTheFileAndKeepWritesPrivate) {
  std::vector<uint8_t> bytes((size_t{3} << 20) + 17);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 2654435761u >> 13);
  const std::string path = write_temp(bytes);
  {
    MappedFile map(path, LoadMode::kMap), copy(path, LoadMode::kCopy);
    EXPECT_FALSE(map.copied());
    EXPECT_TRUE(copy.copied());
    for (MappedFile* f : {&map, &copy}) {
      ASSERT_EQ(f->size(), bytes.size());
      EXPECT_EQ(std::memcmp(f->data(), bytes.data(), bytes.size()), 0);
    }
    const size_t at = bytes.size() - 9;
    uint8_t* w = copy.writable(copy.data() + at, 5);
    ASSERT_NE(w, nullptr);
    std::memset(w, 0xA5, 5);
    copy.seal(copy.data() + at, 5);
    EXPECT_EQ(copy.data()[at + 4], 0xA5);
    EXPECT_EQ(std::memcmp(map.data(), bytes.data(), bytes.size()), 0);
    MappedFile moved(std::move(copy));
    EXPECT_TRUE(moved.copied());
    EXPECT_EQ(moved.data()[at], 0xA5);
    EXPECT_EQ(copy.data(), nullptr);
  }
  EXPECT_TRUE(read_all(path) == bytes);
  ::unlink(path.c_str());
}

TEST(MappedFile, AutoCopiesWhatFitsInHalfOfTheAvailableMemory) {
  using tandem::gguf::auto_copies;
  EXPECT_TRUE(auto_copies(100, 200));
  EXPECT_FALSE(auto_copies(101, 200));
  EXPECT_FALSE(auto_copies(1, 0));  // unknown: map
  EXPECT_GT(tandem::gguf::available_memory_bytes(), 0u);
  const std::string path = tandem::testing::shared_path("models/stories260K.gguf");
  EXPECT_TRUE(File::open(path, LoadMode::kAuto).copied());  // a 1 MB file fits anywhere this suite runs
  EXPECT_FALSE(File::open(path).copied());                  // metadata readers map
  EXPECT_TRUE(tandem::model::Model::load(path)->file().copied());
}
