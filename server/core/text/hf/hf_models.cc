// WordPiece and BPE (hf_models.h), each as the reference's model does it.
#include "server/core/text/hf/hf_models.h"

#include <queue>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "server/core/text/hf/hf_pipeline.h"

namespace qvi::hf {

absl::Status Bad(absl::string_view path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: ", path, ": ", what));
}

absl::Status NotImplemented(absl::string_view path, absl::string_view type, absl::string_view implemented) {
  return Bad(path, absl::StrCat("type '", type.substr(0, 64), "' is not implemented here (", implemented,
                                " are); the model cannot be served with this tokenizer"));
}

absl::StatusOr<std::string> String(const Json& j, absl::string_view path, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) return Bad(absl::StrCat(path, ".", key), "must be a string");
  return it->get<std::string>();
}

bool Flag(const Json& j, const char* key, bool otherwise) {
  auto it = j.find(key);
  return it != j.end() && it->is_boolean() ? it->get<bool>() : otherwise;
}

int64_t IdIn(const Vocab& vocab, absl::string_view token) {
  auto it = vocab.find(token);
  return it == vocab.end() ? -1 : it->second;
}

namespace {

// model.vocab: token -> id, the ids 0..n-1 each once.
absl::Status LoadVocabulary(const Json& model, Vocab* vocab, int64_t* memory) {
  auto v = model.find("vocab");
  if (v == model.end() || !v->is_object()) return Bad("model.vocab", "must be an object of token: id");
  if (v->size() > kMaxVocabulary) {
    return Bad("model.vocab", absl::StrCat(v->size(), " tokens, over the limit of ", kMaxVocabulary));
  }
  const auto size = static_cast<int64_t>(v->size());
  std::vector<bool> seen(v->size(), false);
  for (const auto& [token, id] : v->items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= size) {
      return Bad("model.vocab", absl::StrCat("the id of '", token.substr(0, 64), "' is not in [0, ", size,
                                             "), the vocabulary's size"));
    }
    const int64_t i = id.get<int64_t>();
    if (seen[static_cast<size_t>(i)]) return Bad("model.vocab", absl::StrCat("id ", i, " is given to two tokens"));
    seen[static_cast<size_t>(i)] = true;
    if (token.empty() || token.size() > kMaxTokenBytes) {
      return Bad("model.vocab", absl::StrCat("a token of ", token.size(), " bytes (1 to ", kMaxTokenBytes, ")"));
    }
    vocab->emplace(token, i);
    *memory += static_cast<int64_t>(token.size() + 48);
  }
  return absl::OkStatus();
}

class WordPieceModel final : public SubwordModel {
 public:
  absl::Status Load(const Json& j) {
    absl::StatusOr<std::string> unk = String(j, "model", "unk_token");
    if (!unk.ok()) return unk.status();
    unk_ = *unk;
    if (auto p = j.find("continuing_subword_prefix"); p != j.end() && p->is_string()) prefix_ = p->get<std::string>();
    if (auto m = j.find("max_input_chars_per_word"); m != j.end()) {
      if (!m->is_number_unsigned()) return Bad("model.max_input_chars_per_word", "must be a whole number");
      max_chars_ = m->get<size_t>();
    }
    if (absl::Status s = LoadVocabulary(j, &vocab_, &memory_); !s.ok()) return s;
    tokens_.resize(vocab_.size());
    for (const auto& [token, id] : vocab_) {
      tokens_[static_cast<size_t>(id)] = token;
      memory_ += static_cast<int64_t>(token.size() + 32);
      if (!prefix_.empty() && token.size() > prefix_.size() && token.compare(0, prefix_.size(), prefix_) == 0) {
        continuing_.emplace(token.substr(prefix_.size()), id);
        memory_ += static_cast<int64_t>(token.size() + 48);
      }
    }
    unk_id_ = Id(unk_);
    if (unk_id_ < 0) return Bad("model.unk_token", absl::StrCat("'", unk_.substr(0, 64), "' is not in the vocabulary"));
    return absl::OkStatus();
  }

  void Tokenize(const std::u32string& word, std::vector<SubwordPiece>* out) const override {
    const size_t chars = word.size();
    if (chars > max_chars_) return out->push_back(SubwordPiece{unk_id_, unk_, 0, chars});
    std::string utf8;
    std::vector<size_t> at(chars + 1);
    for (size_t k = 0; k < chars; ++k) {
      at[k] = utf8.size();
      AppendUtf8(word[k], &utf8);
    }
    at[chars] = utf8.size();
    const size_t first = out->size();
    for (size_t start = 0; start < chars;) {  // the longest piece in the vocabulary, from the left
      size_t stop = chars;
      for (; stop > start; --stop) {
        const absl::string_view piece(utf8.data() + at[start], at[stop] - at[start]);
        const Vocab& vocab = start == 0 || prefix_.empty() ? vocab_ : continuing_;  // no prefix: one vocabulary
        if (auto it = vocab.find(piece); it != vocab.end()) {
          out->push_back(
              SubwordPiece{it->second, start == 0 ? std::string(piece) : absl::StrCat(prefix_, piece), start, stop});
          break;
        }
      }
      if (stop == start) {  // no piece from here: the whole word is unknown
        out->resize(first);
        return out->push_back(SubwordPiece{unk_id_, unk_, 0, chars});
      }
      start = stop;
    }
  }

  int64_t Id(absl::string_view token) const override { return IdIn(vocab_, token); }
  const std::string& Token(int64_t id) const override { return tokens_[static_cast<size_t>(id)]; }
  int64_t VocabularySize() const override { return static_cast<int64_t>(vocab_.size()); }
  int64_t MemoryBytes() const override { return memory_; }
  std::string Kind() const override { return "WordPiece"; }

 private:
  Vocab vocab_;                      // every token
  std::vector<std::string> tokens_;  // by id
  Vocab continuing_;                 // "##ing" by "ing"
  std::string prefix_ = "##";
  std::string unk_;
  int64_t unk_id_ = 0;
  size_t max_chars_ = 100;
  int64_t memory_ = 0;
};

class BpeModel final : public SubwordModel {
 public:
  absl::Status Load(const Json& j);

  void Tokenize(const std::u32string& word, std::vector<SubwordPiece>* out) const override;

  int64_t Id(absl::string_view token) const override { return IdIn(vocab_, token); }
  const std::string& Token(int64_t id) const override { return tokens_[static_cast<size_t>(id)]; }
  int64_t VocabularySize() const override { return static_cast<int64_t>(vocab_.size()); }
  int64_t MemoryBytes() const override { return memory_; }
  std::string Kind() const override { return "BPE"; }

 private:
  struct Symbol {
    int64_t id;
    size_t begin, end;  // the word's characters
    int prev, next;     // -1: none
    bool gone = false;
  };
  absl::Status LoadMerges(const Json& merges);
  // The initial symbols of `word`: each character's token (with the prefix and suffix where due), or the
  // unknown token (fused when fuse_unk); else, with no unknown token, the character is left out.
  std::vector<Symbol> Symbols(const std::u32string& word) const;
  void MergeAll(std::vector<Symbol>* symbols) const;

  Vocab vocab_;
  std::vector<std::string> tokens_;                                                       // by id
  absl::flat_hash_map<std::pair<int64_t, int64_t>, std::pair<int64_t, int64_t>> merges_;  // -> rank, new id
  std::string prefix_, suffix_, unk_;
  int64_t unk_id_ = -1;
  bool fuse_unk_ = false, ignore_merges_ = false;
  int64_t memory_ = 0;
};

absl::Status BpeModel::Load(const Json& j) {
  if (auto d = j.find("dropout"); d != j.end() && !d->is_null()) {
    return Bad("model.dropout", "BPE dropout samples a different tokenization each time; not implemented here");
  }
  auto optional = [&](const char* key, std::string* into) -> absl::Status {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return absl::OkStatus();
    if (!it->is_string()) return Bad(absl::StrCat("model.", key), "must be a string or null");
    *into = it->get<std::string>();
    return absl::OkStatus();
  };
  for (auto [key, into] : {std::pair{"continuing_subword_prefix", &prefix_}, std::pair{"end_of_word_suffix", &suffix_},
                           std::pair{"unk_token", &unk_}}) {
    if (absl::Status s = optional(key, into); !s.ok()) return s;
  }
  fuse_unk_ = Flag(j, "fuse_unk", false);
  if (Flag(j, "byte_fallback", false)) {
    return Bad("model.byte_fallback", "byte fallback (<0xXX> tokens for unknown characters) is not implemented here");
  }
  ignore_merges_ = Flag(j, "ignore_merges", false);
  if (absl::Status s = LoadVocabulary(j, &vocab_, &memory_); !s.ok()) return s;
  tokens_.resize(vocab_.size());
  for (const auto& [token, id] : vocab_) tokens_[static_cast<size_t>(id)] = token;
  if (!unk_.empty()) {
    unk_id_ = Id(unk_);
    if (unk_id_ < 0) return Bad("model.unk_token", absl::StrCat("'", unk_.substr(0, 64), "' is not in the vocabulary"));
  }
  auto merges = j.find("merges");
  if (merges == j.end() || !merges->is_array()) return Bad("model.merges", "must be an array");
  return LoadMerges(*merges);
}

absl::Status BpeModel::LoadMerges(const Json& merges) {
  if (merges.size() > kMaxMerges) {
    return Bad("model.merges", absl::StrCat(merges.size(), " merges, over the limit of ", kMaxMerges));
  }
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const Json& m = merges[rank];
    std::string a, b;
    if (m.is_string()) {  // "a b", the older form
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
        return Bad(absl::StrCat("model.merges[", rank, "]"), "must be two tokens apart by one space");
      }
      a = s.substr(0, space);
      b = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      return Bad(absl::StrCat("model.merges[", rank, "]"), "must be \"a b\" or [\"a\", \"b\"]");
    }
    const bool prefixed = !prefix_.empty() && b.compare(0, prefix_.size(), prefix_) == 0;
    const std::string merged = a + (prefixed ? b.substr(prefix_.size()) : b);
    const int64_t ia = Id(a), ib = Id(b), im = Id(merged);
    if (ia < 0 || ib < 0 || im < 0) {
      return Bad(absl::StrCat("model.merges[", rank, "]"), absl::StrCat("'",
                                                                        (ia < 0   ? a
                                                                         : ib < 0 ? b
                                                                                  : merged)
                                                                            .substr(0, 64),
                                                                        "' is not in the vocabulary"));
    }
    merges_.insert_or_assign(std::pair{ia, ib}, std::pair{static_cast<int64_t>(rank), im});  // a repeat: the last
    memory_ += 48;
  }
  return absl::OkStatus();
}

std::vector<BpeModel::Symbol> BpeModel::Symbols(const std::u32string& word) const {
  std::vector<Symbol> symbols;
  auto add = [&](int64_t id, size_t begin, size_t end) {
    symbols.push_back(Symbol{id, begin, end, static_cast<int>(symbols.size()) - 1, -1});
  };
  bool pending_unk = false;
  size_t unk_begin = 0, unk_end = 0;
  for (size_t i = 0; i < word.size(); ++i) {
    std::string s = Utf8(word, i, i + 1);
    if (i > 0 && !prefix_.empty()) s = prefix_ + s;
    if (i + 1 == word.size() && !suffix_.empty()) s += suffix_;
    if (const int64_t id = Id(s); id >= 0) {
      if (pending_unk) add(unk_id_, unk_begin, unk_end);
      pending_unk = false;
      add(id, i, i + 1);
      continue;
    }
    if (unk_id_ < 0) continue;  // no unknown token: the character is left out, as the reference does
    if (pending_unk && fuse_unk_) {
      unk_end = i + 1;
      continue;
    }
    if (pending_unk) add(unk_id_, unk_begin, unk_end);
    pending_unk = true;
    unk_begin = i;
    unk_end = i + 1;
  }
  if (pending_unk) add(unk_id_, unk_begin, unk_end);
  if (!symbols.empty()) symbols.back().next = -1;
  for (size_t k = 0; k + 1 < symbols.size(); ++k) symbols[k].next = static_cast<int>(k + 1);
  return symbols;
}

void BpeModel::MergeAll(std::vector<Symbol>* symbols) const {
  struct Merge {
    int64_t rank;
    int pos;
    int64_t new_id;
    bool operator>(const Merge& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Merge, std::vector<Merge>, std::greater<Merge>> queue;
  std::vector<Symbol>& s = *symbols;
  auto push = [&](int pos) {
    if (pos < 0 || s[static_cast<size_t>(pos)].next < 0) return;
    auto it =
        merges_.find({s[static_cast<size_t>(pos)].id, s[static_cast<size_t>(s[static_cast<size_t>(pos)].next)].id});
    if (it != merges_.end()) queue.push(Merge{it->second.first, pos, it->second.second});
  };
  for (size_t k = 0; k + 1 < s.size(); ++k) push(static_cast<int>(k));
  while (!queue.empty()) {
    const Merge top = queue.top();
    queue.pop();
    Symbol& left = s[static_cast<size_t>(top.pos)];
    if (left.gone || left.next < 0) continue;
    Symbol& right = s[static_cast<size_t>(left.next)];
    auto it = merges_.find({left.id, right.id});
    if (it == merges_.end() || it->second.second != top.new_id) continue;  // an expired entry
    left.id = top.new_id;
    left.end = right.end;
    right.gone = true;
    left.next = right.next;
    if (left.next >= 0) s[static_cast<size_t>(left.next)].prev = top.pos;
    push(left.prev);
    push(top.pos);
  }
}

void BpeModel::Tokenize(const std::u32string& word, std::vector<SubwordPiece>* out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    std::string whole = Utf8(word, 0, word.size());
    if (const int64_t id = Id(whole); id >= 0)
      return out->push_back(SubwordPiece{id, std::move(whole), 0, word.size()});
  }
  std::vector<Symbol> symbols = Symbols(word);
  MergeAll(&symbols);
  for (const Symbol& sym : symbols) {
    if (!sym.gone) out->push_back(SubwordPiece{sym.id, tokens_[static_cast<size_t>(sym.id)], sym.begin, sym.end});
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<SubwordModel>> LoadModel(const Json& j) {
  if (!j.is_object()) return Bad("model", "must be an object");
  absl::StatusOr<std::string> type = String(j, "model", "type");
  if (!type.ok()) return type.status();
  if (*type == "WordPiece") {
    auto model = std::make_unique<WordPieceModel>();
    if (absl::Status s = model->Load(j); !s.ok()) return s;
    return std::unique_ptr<SubwordModel>(std::move(model));
  }
  if (*type == "BPE") {
    auto model = std::make_unique<BpeModel>();
    if (absl::Status s = model->Load(j); !s.ok()) return s;
    return std::unique_ptr<SubwordModel>(std::move(model));
  }
  if (*type == "Unigram") return LoadUnigram(j);
  return NotImplemented("model.type", *type, "WordPiece, BPE and Unigram");
}

}  // namespace qvi::hf
