// qvi-hf-tokenize: the server's sub-word tokenizer (server/core/text/hf/hf_tokenizer.h) on a file of
// texts, for the exactness test against Hugging Face `tokenizers` (tests/python/test_hf_tokenizer.py) and
// for its speed (bench/hf_tokenizer_speed.py).
//
//   qvi-hf-tokenize --tokenizer tokenizer.json --texts texts.jsonl [--out tokens.jsonl]
//   qvi-hf-tokenize --tokenizer tokenizer.json --texts texts.jsonl --repeat 5
//   qvi-hf-tokenize --tokenizer tokenizer.json --decode ids.jsonl [--out texts.jsonl]
//
// texts.jsonl holds one JSON string a line. --out writes, a line per text, {"ids": [...], "offsets":
// [[start, end], ...], "words": [...]} (code points; a special token's word is null) or {"error": "..."}.
// --repeat N encodes every text N times and prints texts/s and tokens/s of one thread instead. --decode reads
// a JSON list of ids a line and writes {"text": its text without the special tokens, "all": with them} or
// {"error": "..."}.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "server/core/text/hf/hf_tokenizer.h"

namespace {

int Decode(const qvi::hf::HfTokenizer& tokenizer, const std::string& ids_path, const std::string& out_path) {
  std::ifstream in(ids_path);
  std::ofstream out(out_path.empty() ? "/dev/stdout" : out_path);
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    const auto ids = nlohmann::json::parse(line).get<std::vector<int64_t>>();
    nlohmann::json answer;
    for (const bool skip : {true, false}) {
      auto text = tokenizer.DecodeIds(ids, skip);
      if (!text.ok()) {
        answer = {{"error", absl::StrCat("ids", text.status().message())}};
        break;
      }
      answer[skip ? "text" : "all"] = *text;
    }
    out << answer.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"The server's sub-word tokenizer on a file of texts"};
  std::string tokenizer_path, texts_path, out_path, decode_path;
  int repeat = 0;
  bool no_special = false;
  app.add_option("--tokenizer", tokenizer_path, "a Hugging Face tokenizer.json")->required();
  auto* texts_option = app.add_option("--texts", texts_path, "one JSON string a line");
  app.add_option("--decode", decode_path, "decode these: one JSON list of ids a line")->excludes(texts_option);
  app.add_option("--out", out_path, "where to write each text's ids, offsets and words (JSON lines)");
  app.add_option("--repeat", repeat, "encode every text this many times and print the speed")
      ->check(CLI::Range(0, 1000));
  app.add_flag("--no-special-tokens", no_special, "leave out the post-processor's special tokens");
  CLI11_PARSE(app, argc, argv);

  std::ifstream file(tokenizer_path);
  std::stringstream json;
  json << file.rdbuf();
  auto tokenizer = qvi::hf::HfTokenizer::FromJson(json.str());
  if (!tokenizer.ok()) {
    std::cerr << tokenizer.status().message() << "\n";
    return 2;
  }
  if (!decode_path.empty()) return Decode(**tokenizer, decode_path, out_path);
  if (texts_path.empty()) {
    std::cerr << "--texts or --decode is required\n";
    return 2;
  }
  std::vector<std::string> texts;
  std::ifstream in(texts_path);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) texts.push_back(nlohmann::json::parse(line).get<std::string>());
  }
  if (repeat > 0) {
    int64_t tokens = 0;
    const auto start = std::chrono::steady_clock::now();
    for (int r = 0; r < repeat; ++r) {
      for (const std::string& t : texts) {
        auto e = (*tokenizer)->Encode(t, !no_special);
        tokens += e.ok() ? static_cast<int64_t>(e->size()) : 0;
      }
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("{\"texts_per_s\": %.1f, \"tokens_per_s\": %.1f, \"seconds\": %.3f}\n",
                static_cast<double>(texts.size()) * repeat / s, static_cast<double>(tokens) / s, s);
    return 0;
  }
  std::ofstream out(out_path.empty() ? "/dev/stdout" : out_path);
  for (const std::string& t : texts) {
    auto e = (*tokenizer)->Encode(t, !no_special);
    nlohmann::json line;
    if (!e.ok()) {
      line["error"] = std::string(e.status().message());
    } else {
      line["ids"] = nlohmann::json::array();
      line["offsets"] = nlohmann::json::array();
      line["words"] = nlohmann::json::array();
      for (const qvi::hf::SubwordToken& token : *e) {
        line["ids"].push_back(token.id);
        line["offsets"].push_back({token.start, token.end});
        line["words"].push_back(token.word < 0 ? nlohmann::json() : nlohmann::json(token.word));
      }
    }
    out << line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  }
  return 0;
}
