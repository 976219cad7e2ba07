// Unigram (SentencePiece's model, hf_models.h): the pieces of a word whose scores sum highest, as the
// reference's optimized Viterbi finds them -- ties kept by the first path found, an unknown character
// scored 10 below the lowest piece, and unknown characters in a row fused into one unknown token.
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/core/text/hf/hf_models.h"
#include "server/core/text/hf/hf_pipeline.h"

namespace qvi::hf {
namespace {

constexpr double kUnknownPenalty = 10.0;

class UnigramModel final : public SubwordModel {
 public:
  absl::Status Load(const Json& j) {
    if (Flag(j, "byte_fallback", false)) {
      return Bad("model.byte_fallback", "byte fallback (<0xXX> tokens for unknown characters) is not implemented here");
    }
    auto vocab = j.find("vocab");
    if (vocab == j.end() || !vocab->is_array()) return Bad("model.vocab", "must be an array of [piece, score]");
    if (vocab->size() > kMaxVocabulary) {
      return Bad("model.vocab", absl::StrCat(vocab->size(), " pieces, over the limit of ", kMaxVocabulary));
    }
    for (size_t i = 0; i < vocab->size(); ++i) {
      const Json& entry = (*vocab)[i];
      if (!entry.is_array() || entry.size() != 2 || !entry[0].is_string() || !entry[1].is_number()) {
        return Bad(absl::StrCat("model.vocab[", i, "]"), "must be [piece, score]");
      }
      const std::string piece = entry[0].get<std::string>();
      if (piece.empty() || piece.size() > kMaxTokenBytes) {
        return Bad(absl::StrCat("model.vocab[", i, "]"),
                   absl::StrCat("a piece of ", piece.size(), " bytes (1 to ", kMaxTokenBytes, ")"));
      }
      const double score = entry[1].get<double>();
      pieces_.emplace_back(piece, score);
      ids_.insert_or_assign(piece, static_cast<int64_t>(i));  // a repeat: the last, as the reference's map
      min_score_ = std::min(min_score_, score);
      max_chars_ = std::max(max_chars_, Decode(piece).size());
      memory_ += static_cast<int64_t>(2 * piece.size() + 64);
    }
    auto unk = j.find("unk_id");
    if (unk != j.end() && !unk->is_null()) {
      if (!unk->is_number_unsigned() || unk->get<uint64_t>() >= pieces_.size()) {
        return Bad("model.unk_id", absl::StrCat("must be an id below the vocabulary's size, ", pieces_.size()));
      }
      unk_id_ = unk->get<int64_t>();
    }
    return absl::OkStatus();
  }

  void Tokenize(const std::u32string& word, std::vector<SubwordPiece>* out) const override {
    struct Best {
      int64_t id = -1;
      double score = 0;
      size_t from = 0;
      bool reached = false;
    };
    const size_t n = word.size();
    std::vector<Best> best(n + 1);
    best[0].reached = true;
    const double unknown = min_score_ - kUnknownPenalty;
    std::string piece;
    for (size_t start = 0; start < n; ++start) {
      const double here = best[start].score;
      bool single = false;
      piece.clear();
      for (size_t end = start + 1; end <= n && end - start <= max_chars_; ++end) {  // the shorter first
        AppendUtf8(word[end - 1], &piece);
        auto it = ids_.find(piece);
        if (it == ids_.end()) continue;
        const double candidate = pieces_[static_cast<size_t>(it->second)].second + here;
        if (!best[end].reached || candidate > best[end].score) best[end] = Best{it->second, candidate, start, true};
        single = single || end == start + 1;
      }
      if (!single) {
        const double candidate = unknown + here;
        if (!best[start + 1].reached || candidate > best[start + 1].score) {
          best[start + 1] = Best{unk_id_, candidate, start, true};
        }
      }
    }
    // Back from the end; unknown pieces in a row become one.
    std::vector<SubwordPiece> reversed;
    for (size_t end = n; end > 0;) {
      const Best& b = best[end];
      if (b.id == unk_id_ && !reversed.empty() && reversed.back().id == unk_id_ && reversed.back().begin == end) {
        reversed.back().begin = b.from;
      } else {
        reversed.push_back(SubwordPiece{b.id, "", b.from, end});
      }
      end = b.from;
    }
    for (auto it = reversed.rbegin(); it != reversed.rend(); ++it) {
      std::string text = Utf8(word, it->begin, it->end);
      const int64_t known = IdIn(ids_, text);  // a fused unknown run may spell a piece after all
      it->id = known >= 0 ? known : unk_id_;
      it->token = std::move(text);
      out->push_back(std::move(*it));
    }
  }

  int64_t Id(absl::string_view token) const override { return IdIn(ids_, token); }
  const std::string& Token(int64_t id) const override { return pieces_[static_cast<size_t>(id)].first; }
  int64_t VocabularySize() const override { return static_cast<int64_t>(pieces_.size()); }
  int64_t MemoryBytes() const override { return memory_; }
  std::string Kind() const override { return "Unigram"; }
  bool HasUnknown() const { return unk_id_ >= 0; }

 private:
  std::vector<std::pair<std::string, double>> pieces_;
  Vocab ids_;
  double min_score_ = std::numeric_limits<double>::infinity();
  size_t max_chars_ = 0;
  int64_t unk_id_ = -1;
  int64_t memory_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<SubwordModel>> LoadUnigram(const Json& j) {
  auto model = std::make_unique<UnigramModel>();
  if (absl::Status s = model->Load(j); !s.ok()) return s;
  if (!model->HasUnknown()) {
    return Bad("model.unk_id", "is null: a character no piece covers could not be tokenized (the reference fails)");
  }
  return std::unique_ptr<SubwordModel>(std::move(model));
}

}  // namespace qvi::hf
