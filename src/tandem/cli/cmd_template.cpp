// tandem template render: renders a chat template for each line of JSON variables, for debugging a template
// and for tests.
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "tandem/cli/commands.h"
#include "tandem/cli/common.h"
#include "tandem/server/jinja/template.h"
#include "tandem/util/error.h"

namespace tandem::cli {
namespace {

struct TemplateOptions {
  std::string template_path;
  std::string date;  // strftime_now's time, as YYYY-MM-DD; empty: now
  int64_t max_steps = 2'000'000;
};

void write_line(const nlohmann::ordered_json& value) {
  const std::string line = value.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

// Noon (UTC) of the given day, so that the local date is that day in every time zone within 12 hours.
std::chrono::system_clock::time_point parse_date(const std::string& text) {
  int y = 0, m = 0, d = 0;
  char tail = 0;
  if (std::sscanf(text.c_str(), "%d-%d-%d%c", &y, &m, &d, &tail) != 3 || m < 1 || m > 12 || d < 1 || d > 31)
    throw Error("--date takes a day as YYYY-MM-DD (got '" + text + "')");
  const std::chrono::year_month_day ymd{std::chrono::year(y), std::chrono::month(static_cast<unsigned>(m)),
                                        std::chrono::day(static_cast<unsigned>(d))};
  if (!ymd.ok()) throw Error("--date names no real day: '" + text + "'");
  return std::chrono::sys_days(ymd) + std::chrono::hours(12);
}

void render(const TemplateOptions& o) {
  const server::jinja::Template tmpl = server::jinja::Template::parse(read_text_file(o.template_path));
  server::jinja::RenderOptions options;
  if (!o.date.empty()) options.now = parse_date(o.date);
  options.max_steps = o.max_steps;
  std::string line;
  for (size_t line_no = 1; std::getline(std::cin, line); ++line_no) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    nlohmann::ordered_json vars;
    try {
      vars = nlohmann::ordered_json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      write_line({{"error", "input line " + std::to_string(line_no) + " is not valid JSON: " + e.what()}});
      continue;
    }
    if (!vars.is_object()) {
      write_line({{"error", "input line " + std::to_string(line_no) +
                                " is not a JSON object; write the template variables as one object per line, "
                                "e.g. {\"messages\": [...], \"add_generation_prompt\": true}"}});
      continue;
    }
    try {
      write_line(tmpl.render(vars, options));
    } catch (const server::jinja::RenderError& e) {
      write_line({{"error", e.what()}});
    }
  }
  if (std::cin.bad()) throw Error("cannot read standard input");
}

}  // namespace

void add_template_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("template", "Work with Jinja chat templates");
  cmd->require_subcommand(1);
  auto* r = cmd->add_subcommand(
      "render",
      "Render a chat template: reads one JSON object of template variables per line of standard input and "
      "writes one JSON string (the prompt) or {\"error\": \"...\"} per line");
  auto o = std::make_shared<TemplateOptions>();
  r->add_option("--template", o->template_path, "The template (Jinja source, as in tokenizer.chat_template)")
      ->required();
  r->add_option("--date", o->date, "The day strftime_now() sees, as YYYY-MM-DD (default: today)");
  r->add_option("--max-steps", o->max_steps, "Evaluation steps a render may take (default 2000000)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  r->callback([o] { render(*o); });
}

}  // namespace tandem::cli
