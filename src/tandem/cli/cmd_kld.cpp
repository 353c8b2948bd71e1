// tandem kld: how much a KV cache type changes the model's next-token distributions, measured against an f32
// cache on the same text: mean and 99th-percentile KL(P_f32 || P_type), top-1 agreement, KV bytes per token.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include <nlohmann/json.hpp>

#include "tandem/cli/commands.h"
#include "tandem/cli/common.h"
#include "tandem/model/session.h"
#include "tandem/tokenizer/tokenizer.h"
#include "tandem/util/error.h"

namespace tandem::cli {
namespace {

// Used when no -f is given: plain story prose of the kind the small test models were trained on, long enough
// for well over a thousand tokens.
constexpr const char* kDefaultText =
    R"(Once upon a time, in a small town by a wide green river, there lived a girl named Mira. She had a red hat, a blue coat and a little brown dog called Pip. Every morning Mira and Pip walked to the bakery at the end of the road. The baker was a tall man with flour on his nose, and he always gave Pip a tiny piece of bread.
One day the baker looked sad. "What is wrong?" asked Mira. The baker said, "My oven is broken, and I cannot bake any bread today. The children at the school will have nothing to eat at lunch." Mira thought for a moment. Then she smiled and said, "My grandma has a big oven. Maybe she can help us."
Mira and Pip ran all the way to her grandma's house. Grandma was sitting in the garden, reading a book under the apple tree. When she heard the story, she put the book down and stood up. "Of course I will help," she said. "Bring the dough, and we will bake together."
The baker carried a big bowl of dough to grandma's kitchen. They worked all morning. Mira shaped the little rolls, grandma watched the oven, and the baker made long loaves with seeds on top. Pip sat by the door and sniffed the warm air. The kitchen smelled so good that the neighbors came to look through the window.
At noon the bread was ready. Mira, grandma and the baker put it in baskets and took it to the school. The children cheered when they saw them. They ate the soft rolls and said thank you again and again. The teacher gave Mira a big hug, and Pip got two pieces of bread that day.
The next week a man came to fix the oven at the bakery. The baker was happy again, but he did not forget what Mira had done. He made a special cake for her, with strawberries and cream and her name written on top in chocolate. Mira shared the cake with grandma, with the baker and with all her friends. Pip licked the cream from the plate.
In the same town there was a boy named Tom who loved boats. He had a small wooden boat with a white sail, and every afternoon he took it to the river. He would put it on the water and watch it float away, and then he would run along the bank to catch it again. His sister Lily thought it was the best game in the world.
One windy afternoon the boat sailed too far. It went past the big rock and past the old bridge, and Tom could not catch it. He sat down on the grass and started to cry. Lily sat next to him and held his hand. "Don't be sad," she said. "Let's follow the river. Rivers always go somewhere."
So they walked and walked. They saw a family of ducks, a frog on a leaf and a fisherman with a long hat. The fisherman pointed down the river and said, "I saw a little white sail go that way." The children thanked him and kept walking. The sun was getting low, and the sky turned pink and orange.
At last they found the boat. It was stuck in the reeds near a small house. An old woman came out of the house and helped them pull it free. She gave them cups of warm milk and cookies shaped like stars. "You are brave children," she said. "But next time, tie a string to your boat." Tom laughed and said he would.
When they got home, their mother was waiting at the gate. She was worried, but when she heard the story she smiled. The next day Tom and Lily went back to the old woman's house with a basket of apples. They became good friends, and every week they visited her and told her about their adventures.
Far away, on a hill above the town, there was a garden where a little bunny named Bella lived. Bella liked carrots, sunny days and her best friend, a bird named Sky. Every day Sky sang songs from the top of the fence, and Bella danced in the grass. They were very happy together.
But one winter the snow came early. The garden was white and cold, and Bella could not find any food. Sky flew over the hill and looked everywhere. Then she saw a farmer's barn with a door that was open just a little. Inside there were sacks of carrots and apples. Sky flew back and told Bella.
Bella was scared of the farmer. "What if he is angry?" she asked. Sky said, "We will ask him nicely." So they went to the barn together. The farmer was a kind man with a gray beard. When he saw the hungry bunny and the little bird, he laughed and gave them a bowl of carrots and some seeds. "You can come here every day until the spring," he said.
All winter long Bella and Sky visited the barn. They helped the farmer too. Sky sang to the cows in the morning, and Bella kept the mice away from the seeds, because the mice were afraid of her big feet. When spring came, the snow melted and the garden was green again.
On the first warm day Bella planted a row of carrots next to the farmer's fence. "These are for you," she said. The farmer was surprised and very happy. From then on, the bunny, the bird and the farmer were the best of friends. They learned that sharing makes a hard winter warm.
Later that year the town had a big fair. There were games, music and a long table full of pies. Mira came with Pip, Tom came with Lily and his boat, and even Bella and Sky came down from the hill with the farmer. The baker brought the biggest loaf anyone had ever seen. Everyone laughed and played until the stars came out, and then they all walked home, tired and happy, under the bright round moon.)";

double log_sum_exp(const float* x, int64_t n) {
  float mx = x[0];
  for (int64_t i = 1; i < n; ++i) mx = std::max(mx, x[i]);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(x[i]) - mx);
  return mx + std::log(sum);
}

int64_t argmax_of(const float* x, int64_t n) {
  return std::max_element(x, x + n) - x;
}

}  // namespace

void add_kld_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "kld",
      "Compare a KV cache type with an f32 cache: KL divergence of the next-token distributions (mean, 99th "
      "percentile), top-1 agreement and KV bytes per token, over text evaluated in windows of the context "
      "size");
  struct Opts {
    ModelOptions model;
    std::string file;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  add_model_options(*cmd, o->model);
  cmd->add_option("-f,--file", o->file, "Text file to evaluate (default: a built-in story text)");
  cmd->add_flag("--json", o->json,
                "End with one JSON line: mean_kld, p99_kld, top1_agreement, kv_bytes_per_token");
  cmd->callback([o] {
    auto model = model::Model::load(o->model.model_path, o->model.load_mode());
    auto tok = tokenizer::Tokenizer::from_gguf(model->file());
    const std::string text = o->file.empty() ? std::string(kDefaultText) : read_text_file(o->file);
    std::vector<int32_t> ids = tok->encode(text, /*add_special=*/false, /*parse_special=*/false);
    if (ids.empty()) throw Error("the text has no tokens");
    if (o->file.empty()) {
      // The built-in text is repeated if a vocabulary packs it into fewer than 1,024 tokens.
      const std::vector<int32_t> once = ids;
      while (ids.size() < 1024) ids.insert(ids.end(), once.begin(), once.end());
    } else if (ids.size() < 1000) {
      std::fprintf(stderr, "warning: the text has only %zu tokens; at least 1000 give a stable figure\n",
                   ids.size());
    }
    const model::Config& c = model->config();
    const int64_t train_ctx = c.n_ctx_train > 0 ? c.n_ctx_train : 4096;
    const int64_t window = o->model.n_ctx > 0 ? o->model.n_ctx : std::min<int64_t>(train_ctx, 512);
    if (window < 2) throw Error("the context (-c) must hold at least 2 tokens");
    const int32_t bos = tok->bos_id();
    const int64_t per_window = bos >= 0 ? window - 1 : window;  // text tokens per window

    ThreadPool pool(o->model.resolved_threads());
    model::SessionOptions ref_opts;
    ref_opts.n_ctx = window;
    ref_opts.kv_type = cache::KvType::kF32;
    ref_opts.batch = std::min<int64_t>(o->model.batch, window);
    model::SessionOptions test_opts = ref_opts;
    test_opts.kv_type = o->model.resolved_kv_type();
    model::Session ref(*model, pool, ref_opts);
    model::Session test(*model, pool, test_opts);

    const int64_t V = c.n_vocab;
    std::vector<double> klds;
    int64_t agree = 0;
    std::vector<int32_t> chunk;
    std::vector<float> ref_logits;
    for (size_t at = 0; at + 1 < ids.size(); at += static_cast<size_t>(per_window)) {
      chunk.clear();
      if (bos >= 0) chunk.push_back(bos);
      const size_t end = std::min(ids.size(), at + static_cast<size_t>(per_window));
      chunk.insert(chunk.end(), ids.begin() + static_cast<std::ptrdiff_t>(at),
                   ids.begin() + static_cast<std::ptrdiff_t>(end));
      ref.truncate(0);
      test.truncate(0);
      auto lr = ref.eval(chunk, /*all_logits=*/true);
      ref_logits.assign(lr.begin(), lr.end());
      auto lt = test.eval(chunk, /*all_logits=*/true);
      for (size_t r = 0; r < chunk.size(); ++r) {
        const float* p = ref_logits.data() + r * static_cast<size_t>(V);
        const float* q = lt.data() + r * static_cast<size_t>(V);
        const double zp = log_sum_exp(p, V), zq = log_sum_exp(q, V);
        double kl = 0;
        for (int64_t i = 0; i < V; ++i) {
          const double lp = p[i] - zp, lq = q[i] - zq;
          kl += std::exp(lp) * (lp - lq);
        }
        klds.push_back(std::max(0.0, kl));
        agree += argmax_of(p, V) == argmax_of(q, V);
      }
    }
    const size_t n = klds.size();
    double mean = 0;
    for (double k : klds) mean += k;
    mean /= static_cast<double>(n);
    std::sort(klds.begin(), klds.end());
    const double p99 = klds[static_cast<size_t>(std::ceil(0.99 * static_cast<double>(n))) - 1];
    const double top1 = static_cast<double>(agree) / static_cast<double>(n);
    const size_t bytes = test.cache().bytes_per_token();
    const std::string type(cache::kv_type_name(test_opts.kv_type));
    std::printf("kv type            %s\n", type.c_str());
    std::printf("tokens scored      %zu (windows of %lld)\n", n, static_cast<long long>(window));
    std::printf("mean KLD           %.6g\n", mean);
    std::printf("p99 KLD            %.6g\n", p99);
    std::printf("top-1 agreement    %.4f\n", top1);
    std::printf("KV bytes per token %zu (f32: %zu)\n", bytes, ref.cache().bytes_per_token());
    if (c.mla.kv_lora_rank > 0)
      std::printf("latent cache       expanded f16 keys and values would take %zu bytes per token\n",
                  c.expanded_kv_bytes_per_token());
    if (o->json) {
      nlohmann::json j;
      j["kv_type"] = type;
      j["tokens"] = n;
      j["mean_kld"] = mean;
      j["p99_kld"] = p99;
      j["top1_agreement"] = top1;
      j["kv_bytes_per_token"] = bytes;
      if (c.mla.kv_lora_rank > 0) j["kv_expanded_f16_bytes_per_token"] = c.expanded_kv_bytes_per_token();
      std::printf("%s\n", j.dump().c_str());
    }
  });
}

}  // namespace tandem::cli
