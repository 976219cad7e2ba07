#include "client/batch_io.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>

namespace qvi::client {

std::string FormatOf(const std::string& path) {
  std::string ext = std::filesystem::path(path).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  if (ext == ".jsonl" || ext == ".ndjson" || ext == ".json") return "jsonl";
  if (ext == ".csv") return "csv";
  return "text";
}

std::vector<std::vector<std::string>> ParseCsv(std::istream& in) {
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> row;
  std::string field;
  bool quoted = false, any = false;
  int64_t line = 1;
  auto end_row = [&] {
    if (!field.empty() && field.back() == '\r') field.pop_back();
    row.push_back(std::move(field));
    field.clear();
    rows.push_back(std::move(row));
    row.clear();
    any = false;
  };
  for (int c; (c = in.get()) != EOF;) {
    if (quoted) {
      if (c == '"' && in.peek() == '"') {
        field += static_cast<char>(in.get());
      } else if (c == '"') {
        quoted = false;
      } else {
        if (c == '\n') ++line;
        field += static_cast<char>(c);
      }
      continue;
    }
    any = true;
    if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      row.push_back(std::move(field));
      field.clear();
    } else if (c == '\n') {
      ++line;
      end_row();
    } else {
      field += static_cast<char>(c);
    }
  }
  if (quoted) throw std::invalid_argument("a quoted field opened by line " + std::to_string(line) + " never closes");
  if (any) end_row();
  return rows;
}

namespace {

std::vector<BatchText> FromCsv(std::istream& in, const std::string& text_field, const std::string& id_field) {
  std::vector<std::vector<std::string>> rows = ParseCsv(in);
  if (rows.empty()) return {};
  const std::vector<std::string>& header = rows[0];
  const auto column = [&](const std::string& name) {
    return std::find(header.begin(), header.end(), name) - header.begin();
  };
  const size_t text = column(text_field), id = column(id_field);
  if (text == header.size()) throw std::invalid_argument("the CSV header has no column '" + text_field + "'");
  std::vector<BatchText> out;
  for (size_t r = 1; r < rows.size(); ++r) {
    if (rows[r].size() == 1 && rows[r][0].empty()) continue;  // a blank line
    if (rows[r].size() <= text) throw std::invalid_argument("CSV record " + std::to_string(r + 1) + " has no text");
    nlohmann::json key = id < rows[r].size() ? nlohmann::json(rows[r][id]) : nlohmann::json(out.size() + 1);
    out.push_back({std::move(key), rows[r][text]});
  }
  return out;
}

std::vector<BatchText> FromJsonl(std::istream& in, const std::string& text_field, const std::string& id_field) {
  std::vector<BatchText> out;
  int64_t n = 0;
  for (std::string line; std::getline(in, line);) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json row = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!row.is_object()) throw std::invalid_argument("line " + std::to_string(n) + " is not a JSON object");
    auto t = row.find(text_field);
    if (t == row.end() || !t->is_string()) {
      throw std::invalid_argument("line " + std::to_string(n) + " has no string field '" + text_field + "'");
    }
    auto i = row.find(id_field);
    out.push_back({i == row.end() ? nlohmann::json(out.size() + 1) : *i, t->get<std::string>()});
  }
  return out;
}

}  // namespace

std::vector<BatchText> ReadBatchTexts(std::istream& in, const std::string& format, const std::string& text_field,
                                      const std::string& id_field) {
  std::vector<BatchText> texts;
  if (format == "csv") {
    texts = FromCsv(in, text_field, id_field);
  } else if (format == "jsonl") {
    texts = FromJsonl(in, text_field, id_field);
  } else {
    for (std::string line; std::getline(in, line);) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      texts.push_back({nlohmann::json(texts.size() + 1), std::move(line)});
    }
  }
  std::set<std::string> seen;
  for (const BatchText& t : texts) {
    if (!seen.insert(t.id.dump()).second) {
      throw std::invalid_argument("the id " + t.id.dump() + " is given twice; ids must be unique to resume");
    }
  }
  return texts;
}

std::set<std::string> AnsweredIds(const std::string& path) {
  std::set<std::string> done;
  std::ifstream in(path, std::ios::binary);
  if (!in) return done;
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string data = buffer.str();
  in.close();
  const size_t end = data.rfind('\n') == std::string::npos ? 0 : data.rfind('\n') + 1;
  if (end < data.size()) std::filesystem::resize_file(path, end);
  std::istringstream lines(data.substr(0, end));
  for (std::string line; std::getline(lines, line);) {
    nlohmann::json row = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (row.is_object() && row.contains("result")) done.insert(row.value("id", nlohmann::json()).dump());
  }
  return done;
}

ProgressLine::ProgressLine(std::string label, int64_t total, bool show)
    : label_(std::move(label)), total_(total), show_(show) {}

std::string ProgressLine::Format(const std::string& label, int64_t done, int64_t total, double seconds) {
  constexpr int kWidth = 24;
  const double share = total > 0 ? static_cast<double>(done) / static_cast<double>(total) : 1.0;
  const int filled = static_cast<int>(share * kWidth);
  std::string bar(filled, '=');
  if (filled < kWidth) bar += '>' + std::string(kWidth - filled - 1, ' ');
  const double rate = seconds > 0 ? static_cast<double>(done) / seconds : 0.0;
  char buf[256];
  std::string eta = "?";
  if (rate > 0) {
    const auto left = static_cast<int64_t>(std::ceil(static_cast<double>(total - done) / rate));
    std::snprintf(buf, sizeof(buf), "%lld:%02lld", static_cast<long long>(left / 60),
                  static_cast<long long>(left % 60));
    eta = buf;
  }
  std::snprintf(buf, sizeof(buf), "%s  %lld/%lld texts  [%s] %3d%%  %.1f texts/s  ETA %s", label.c_str(),
                static_cast<long long>(done), static_cast<long long>(total), bar.c_str(), static_cast<int>(share * 100),
                rate, eta.c_str());
  return buf;
}

void ProgressLine::Add(int64_t done, Clock::time_point now) {
  done_ += done;
  if (!show_ || (now - last_ < std::chrono::milliseconds(200) && done_ < total_)) return;
  last_ = now;
  const double seconds = std::chrono::duration<double>(now - start_).count();
  std::cerr << "\r" << Format(label_, done_, total_, seconds) << "\x1b[K" << std::flush;
}

void ProgressLine::Close() {
  if (show_) std::cerr << "\n";
}

}  // namespace qvi::client
