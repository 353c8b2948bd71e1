#include <gtest/gtest.h>

#include "tandem/gguf/reader.h"
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
