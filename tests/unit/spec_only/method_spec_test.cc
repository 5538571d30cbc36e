// The spec registry on its own: this executable links bitpush_compressor_specs and nothing of
// the kernels (tests/CMakeLists.txt), so it stops linking the day spec parsing pulls in a
// kernel. It parses every method's specs, checks the descriptors' tables against each other,
// and checks the docs that are generated from them (docs/compressors.md, wire-format.md).
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "compressors/spec_registry.h"

#ifndef BITPUSH_SOURCE_DIR
#error "BITPUSH_SOURCE_DIR must name the source tree (tests/CMakeLists.txt)"
#endif

namespace bitpush::compressors {
namespace {

std::string Canon(const std::string& spec) {
  auto c = ParseCompressorSpec(spec);
  EXPECT_TRUE(c.ok()) << spec << ": " << c.status().ToString();
  return c.ok() ? CompressorSpecString(*c) : "";
}

std::string ReadSourceFile(const std::string& relative) {
  std::ifstream in(std::string(BITPUSH_SOURCE_DIR) + "/" + relative);
  EXPECT_TRUE(in.good()) << relative;
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The shortest spec of a method that parses: its name, or its name with the first
// parameter's example (a method with a required parameter).
std::string MinimalSpec(const MethodSpec& m) {
  if (ParseCompressorSpec(m.name).ok()) return m.name;
  return std::string(m.name) + ":" + m.params[0].name + "=" + m.params[0].example;
}

// `spec` with one more "param=value".
std::string With(const std::string& spec, const std::string& item) {
  return spec + (spec.find(':') == std::string::npos ? ":" : ",") + item;
}

TEST(MethodSpec, EveryMethodParsesToItsCanonicalForm) {
  // The canonical forms are part of config agreement between nodes: they must not drift.
  const char* kCanonical[][2] = {
      {"none", "none"},
      {"fp16", "fp16"},
      {"bf16", "bf16"},
      {"onebit", "onebit:scaled=true"},
      {"onebit:scaled=off", "onebit:scaled=false"},
      {"topk:ratio=0.001", "topk:ratio=0.001"},
      {"topk:k=1000", "topk:k=1000"},
      {"randomk:k=5", "randomk:k=5,unbiased=false,seed=0"},
      {"randomk:seed=9,unbiased=yes,ratio=0.25", "randomk:ratio=0.25,unbiased=true,seed=9"},
      {"dithering", "dithering:levels=15,partition=linear,norm=max,seed=0"},
      {"dithering:partition=natural,levels=31,norm=l2,seed=3",
       "dithering:levels=31,partition=natural,norm=l2,seed=3"},
      {"loco", "loco:scale=524288,error_scale=4,block=256,beta=0.2,reset=512,error=int8,pull=loco"},
      {"loco:scale=4096",
       "loco:scale=4096,error_scale=4,block=0,beta=0.2,reset=512,error=int8,pull=loco"},
      {"loco:pull=fp16,block=128,beta=1,reset=0,error=fp32,scale=131072,error_scale=6",
       "loco:scale=131072,error_scale=6,block=128,beta=1,reset=0,error=fp32,pull=fp16"},
      {"sdp4bit", "sdp4bit:bits=4,group=128,hadamard=on,seed=0,pull=sdp4bit"},
      {"sdp4bit:hadamard=off,group=30,bits=8,pull=bf16,seed=2",
       "sdp4bit:bits=8,group=30,hadamard=off,seed=2,pull=bf16"},
      {"separate", "separate:ratio=16,block=32,beta=0.95,reset=128,ema=stable,seed=0"},
      {"separate:seed=3407,ema=printed,reset=0,beta=1,block=256,ratio=4.5",
       "separate:ratio=4.5,block=256,beta=1,reset=0,ema=printed,seed=3407"},
      {"binsgdm", "binsgdm:beta=0.95,eps=1e-08,seed=0"},
      {"binsgdm:seed=3,eps=1e-6,beta=0.9", "binsgdm:beta=0.9,eps=1e-06,seed=3"},
  };
  std::set<std::string> covered;
  for (const auto& [spec, canonical] : kCanonical) {
    EXPECT_EQ(Canon(spec), canonical) << spec;
    const std::string c(canonical);
    covered.insert(c.substr(0, c.find(':')));
  }
  for (const MethodSpec* m : Methods()) {
    EXPECT_EQ(covered.count(m->name), 1u) << m->name << " has no canonical-form case here";
    const std::string c = Canon(MinimalSpec(*m));
    EXPECT_EQ(Canon(c), c) << m->name;
  }
}

TEST(MethodSpec, TableIsConsistent) {
  std::set<std::string> names;
  int last_id = 0;
  ASSERT_EQ(Methods().size(), CompressorNames().size());
  for (size_t i = 0; i < Methods().size(); ++i) {
    const MethodSpec* m = Methods()[i];
    EXPECT_GT(static_cast<int>(m->id), last_id) << m->name << ": methods.inc is in id order";
    last_id = m->id;
    EXPECT_TRUE(v1::CompressorId_IsValid(m->id)) << m->name << ": id not in compression.proto";
    EXPECT_TRUE(names.insert(m->name).second) << m->name << " listed twice";
    EXPECT_EQ(CompressorNames()[i], m->name);
    EXPECT_EQ(FindMethod(m->id), m);
    EXPECT_EQ(FindMethod(std::string_view(m->name)), m);
    EXPECT_EQ(CompressorName(m->id), m->name);
    // params_case names a message member of CompressorConfig's params oneof.
    const auto* field = v1::CompressorConfig::descriptor()->FindFieldByNumber(m->params_case);
    ASSERT_NE(field, nullptr) << m->name;
    ASSERT_NE(field->containing_oneof(), nullptr) << m->name;
    EXPECT_EQ(field->containing_oneof()->name(), "params") << m->name;
    EXPECT_NE(field->message_type(), nullptr) << m->name;
    EXPECT_EQ(m->payload_format, v1::PAYLOAD_FORMAT_V1) << m->name;
    EXPECT_EQ(m->params.empty(), m->set_param == nullptr) << m->name;
  }
  EXPECT_EQ(FindMethod(static_cast<v1::CompressorId>(63)), nullptr);
  EXPECT_EQ(FindMethod(std::string_view("twobit")), nullptr);
}

TEST(MethodSpec, EveryDocumentedParameterIsAcceptedAndPrinted) {
  for (const MethodSpec* m : Methods()) {
    const std::string canonical_default = Canon(MinimalSpec(*m));
    for (const ParamDoc& p : m->params) {
      SCOPED_TRACE(std::string(m->name) + ":" + p.name);
      EXPECT_NE(std::string(p.doc), "");
      EXPECT_NE(std::string(p.values), "");
      // Its default shows in the canonical form of a spec that does not set it.
      if (*p.default_value) {
        EXPECT_NE(canonical_default.find(std::string(p.name) + "=" + p.default_value),
                  std::string::npos)
            << canonical_default;
      }
      // Its example parses, alone or beside the method's minimal spec, and prints back.
      std::string spec = std::string(m->name) + ":" + p.name + "=" + p.example;
      if (!ParseCompressorSpec(spec).ok()) {
        spec = With(MinimalSpec(*m), std::string(p.name) + "=" + p.example);
      }
      EXPECT_NE(Canon(spec).find(std::string(p.name) + "=" + p.example), std::string::npos) << spec;
    }
  }
}

TEST(MethodSpec, UnknownParameterMessageListsTheDocumentedParameters) {
  for (const MethodSpec* m : Methods()) {
    const Status s = ParseCompressorSpec(With(MinimalSpec(*m), "bogus=1")).status();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    std::string valid;
    for (const ParamDoc& p : m->params) valid += (valid.empty() ? "" : ", ") + std::string(p.name);
    if (valid.empty()) valid = "(none: this compressor takes no parameters)";
    EXPECT_EQ(s.message(),
              std::string(m->name) + ": unknown parameter 'bogus'; valid parameters: " + valid);
  }
}

TEST(MethodSpec, ErrorFeedbackRules) {
  // The refusal the scheduler reports for compression.error_feedback, word for word.
  const v1::CompressorConfig unbiased = *ParseCompressorSpec("randomk:ratio=0.03125,unbiased=true");
  for (auto policy :
       {v1::ERROR_FEEDBACK_WORKER, v1::ERROR_FEEDBACK_SERVER, v1::ERROR_FEEDBACK_BOTH}) {
    const Status s = ValidateErrorFeedback(unbiased, policy);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(s.message(),
              "'" + std::string(ErrorFeedbackPolicyName(policy)) +
                  "' with 'randomk:ratio=0.03125,unbiased=true,seed=0' is refused: unbiased "
                  "random-k is meant for error_feedback: none (Algorithm 3); its residual would "
                  "grow without bound. Use error_feedback: none, or unbiased=false with error "
                  "feedback");
  }
  EXPECT_TRUE(ValidateErrorFeedback(unbiased, v1::ERROR_FEEDBACK_NONE).ok());
  for (const MethodSpec* m : Methods()) {
    const v1::CompressorConfig c = *ParseCompressorSpec(MinimalSpec(*m));
    // SDP4Bit's gradient path is unbiased by design and runs without error feedback (paper
    // 002): it refuses the other policies, naming itself.
    const bool none_only = m->id == v1::COMPRESSOR_ID_SDP4BIT;
    // BinSGDM's worker state holds the optimizer moments: it needs a worker side.
    const bool worker_side = m->id == v1::COMPRESSOR_ID_BINSGDM;
    // separate's servers only sum projections: its error feedback lives on the workers alone.
    const bool no_server = m->id == v1::COMPRESSOR_ID_SEPARATE;
    for (auto policy : {v1::ERROR_FEEDBACK_NONE, v1::ERROR_FEEDBACK_WORKER,
                        v1::ERROR_FEEDBACK_SERVER, v1::ERROR_FEEDBACK_BOTH}) {
      const Status s = ValidateErrorFeedback(c, policy);
      if (none_only && policy != v1::ERROR_FEEDBACK_NONE) {
        EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << m->name;
        EXPECT_NE(s.message().find("SDP4Bit's gradient path is unbiased"), std::string::npos)
            << s.message();
      } else if (worker_side &&
                 (policy == v1::ERROR_FEEDBACK_NONE || policy == v1::ERROR_FEEDBACK_SERVER)) {
        EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << m->name;
        EXPECT_EQ(s.message(),
                  "'" + std::string(ErrorFeedbackPolicyName(policy)) +
                      "' with 'binsgdm:beta=0.95,eps=1e-08,seed=0' is refused: binsgdm keeps its "
                      "optimizer moments (m, b) and the worker residual in the worker's "
                      "error-feedback state, so it needs one on the worker. Use error_feedback: "
                      "both (Algorithm 1: worker and server residuals), or worker (no server "
                      "residual)");
      } else if (no_server &&
                 (policy == v1::ERROR_FEEDBACK_SERVER || policy == v1::ERROR_FEEDBACK_BOTH)) {
        EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << m->name;
        EXPECT_NE(s.message().find("keep no error feedback"), std::string::npos) << s.message();
        EXPECT_NE(s.message().find("Use error_feedback: worker"), std::string::npos) << s.message();
      } else {
        EXPECT_TRUE(s.ok()) << m->name << ": " << s.message();
      }
    }
    EXPECT_EQ(ValidateErrorFeedback(c, v1::ERROR_FEEDBACK_UNSPECIFIED).code(),
              StatusCode::kInvalidArgument);
  }
  v1::CompressorConfig unknown;
  unknown.set_id(static_cast<v1::CompressorId>(63));
  EXPECT_EQ(ValidateErrorFeedback(unknown, v1::ERROR_FEEDBACK_NONE).code(),
            StatusCode::kInvalidArgument);

  // "auto": error feedback on both sides for the biased methods (paper 001).
  const std::pair<const char*, v1::ErrorFeedbackPolicy> kRecommended[] = {
      {"none", v1::ERROR_FEEDBACK_NONE},
      {"fp16", v1::ERROR_FEEDBACK_NONE},
      {"bf16", v1::ERROR_FEEDBACK_NONE},
      {"onebit", v1::ERROR_FEEDBACK_BOTH},
      {"topk:ratio=0.01", v1::ERROR_FEEDBACK_BOTH},
      {"randomk:ratio=0.01", v1::ERROR_FEEDBACK_BOTH},
      {"randomk:ratio=0.01,unbiased=true", v1::ERROR_FEEDBACK_NONE},
      {"dithering", v1::ERROR_FEEDBACK_NONE},
      {"separate", v1::ERROR_FEEDBACK_WORKER},
      {"binsgdm", v1::ERROR_FEEDBACK_BOTH},
  };
  for (const auto& [spec, policy] : kRecommended) {
    EXPECT_EQ(RecommendedErrorFeedback(*ParseCompressorSpec(spec)), policy) << spec;
    EXPECT_TRUE(ValidateErrorFeedback(*ParseCompressorSpec(spec), policy).ok()) << spec;
  }
}

TEST(MethodSpec, OnlyNoneSendsTensorsUncompressed) {
  for (const MethodSpec* m : Methods()) {
    EXPECT_EQ(MethodCompresses(m->id), m->id != v1::COMPRESSOR_ID_NONE) << m->name;
  }
  EXPECT_TRUE(MethodCompresses(static_cast<v1::CompressorId>(63)));  // unknown: the worst case
}

TEST(MethodSpec, AggregationModes) {
  for (const MethodSpec* m : Methods()) {
    // separate's servers sum projection vectors; BinSGDM's count sign bits, add their
    // residual and re-binarise (papers 003, 004); everything else is decompressed and summed.
    const bool compressed_domain =
        m->id == v1::COMPRESSOR_ID_SEPARATE || m->id == v1::COMPRESSOR_ID_BINSGDM;
    EXPECT_EQ(m->aggregation, compressed_domain ? AggregationMode::kCompressedDomainSum
                                                : AggregationMode::kDecompressSumRecompress)
        << m->name;
    // Only a format without non-finite values may drop them (docs/errors.md).
    EXPECT_EQ(m->carries_non_finite, m->id != v1::COMPRESSOR_ID_BINSGDM) << m->name;
  }
  EXPECT_EQ(AggregationModeName(AggregationMode::kDecompressSumRecompress),
            "decompress-sum-recompress");
  EXPECT_EQ(AggregationModeName(AggregationMode::kCompressedDomainSum), "compressed-domain-sum");
}

TEST(MethodSpec, EveryCompressingMethodStatesItsSmallestTensor) {
  for (const MethodSpec* m : Methods()) {
    const v1::CompressorConfig config = *ParseCompressorSpec(MinimalSpec(*m));
    const ElementMinimum minimum = MinimumElements(config);
    if (!m->compresses || m->id == v1::COMPRESSOR_ID_FP16 || m->id == v1::COMPRESSOR_ID_BF16) {
      // Exact (none) or a rounding of each element on its own: nothing to state.
      EXPECT_EQ(m->min_elements, nullptr) << m->name;
      EXPECT_EQ(minimum.elements, 0u) << m->name;
      EXPECT_EQ(minimum.why, "") << m->name;
      continue;
    }
    ASSERT_NE(m->min_elements, nullptr) << m->name << " states no smallest tensor";
    EXPECT_FALSE(minimum.why.empty()) << m->name;
    // Only separate's error does not shrink with the tensor (docs/compressors.md).
    EXPECT_EQ(minimum.elements, m->id == v1::COMPRESSOR_ID_SEPARATE ? 1024u : 0u) << m->name;
  }
  // separate: 64 x CR elements, the noise (B+1)/m of its own blocks.
  const ElementMinimum s = MinimumElements(*ParseCompressorSpec("separate:ratio=4,block=64"));
  EXPECT_EQ(s.elements, 256u);
  EXPECT_EQ(s.why,
            "projection noise (B+1)/m = 4.062x the gradient's energy; SGD diverged on smaller "
            "tensors");
  EXPECT_EQ(MinimumElements(*ParseCompressorSpec("separate:ratio=2.5")).elements, 160u);
  EXPECT_EQ(MinimumElements(v1::CompressorConfig()).elements, 0u);  // unknown id: none
}

std::string Cell(const std::string& text);

// The table of smallest tensors in docs/compressors.md, as the descriptors state them (each
// method's default spec).
std::string MinimumTable() {
  std::string t =
      "| method | smallest tensor compressed (elements) | why |\n"
      "|---|---|---|\n";
  for (const MethodSpec* m : Methods()) {
    const ElementMinimum minimum = MinimumElements(*ParseCompressorSpec(MinimalSpec(*m)));
    t += "| `" + std::string(m->name) + "` | " +
         (minimum.elements == 0 ? std::string("any") : std::to_string(minimum.elements)) + " | " +
         (m->min_elements == nullptr ? std::string("no minimum to state") : Cell(minimum.why)) +
         " |\n";
  }
  return t;
}

// GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to '-'.
std::string Anchor(const std::string& heading) {
  std::string a;
  for (char ch : heading) {
    if (std::isalnum(static_cast<unsigned char>(ch))) {
      a += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    } else if (ch == ' ' || ch == '-') {
      a += '-';
    }
  }
  return a;
}

TEST(MethodSpec, WireFormatSectionsExist) {
  std::set<std::string> anchors;
  std::istringstream doc(ReadSourceFile("docs/wire-format.md"));
  for (std::string line; std::getline(doc, line);) {
    if (line.rfind('#', 0) != 0) continue;
    anchors.insert("wire-format.md#" + Anchor(line.substr(line.find_first_not_of("# "))));
  }
  for (const MethodSpec* m : Methods()) {
    EXPECT_EQ(anchors.count(m->wire_format), 1u)
        << m->name << ": no heading of docs/wire-format.md has the anchor " << m->wire_format;
  }
}

std::string Cell(const std::string& text) {
  std::string out;
  for (char ch : text) {
    if (ch == '|') out += '\\';
    out += ch;
  }
  return out;
}

// The parameter table of docs/compressors.md, as the descriptors describe it.
std::string ParamsTable() {
  std::string t =
      "| method | parameter | valid values | default | meaning |\n"
      "|---|---|---|---|---|\n";
  for (const MethodSpec* m : Methods()) {
    if (m->params.empty()) {
      t += "| `" + std::string(m->name) + "` | — | | | |\n";
      continue;
    }
    for (size_t i = 0; i < m->params.size(); ++i) {
      const ParamDoc& p = m->params[i];
      t += "| " + (i == 0 ? "`" + std::string(m->name) + "`" : std::string()) + " | `" + p.name +
           "` | " + Cell(p.values) + " | " + (*p.default_value ? p.default_value : "—") + " | " +
           Cell(p.doc) + " |\n";
    }
  }
  return t;
}

TEST(MethodSpec, DocsParameterTableMatchesTheDescriptors) {
  const std::string doc = ReadSourceFile("docs/compressors.md");
  const std::string begin = "<!-- method-params: begin -->\n";
  const std::string end = "<!-- method-params: end -->";
  const size_t b = doc.find(begin);
  const size_t e = doc.find(end);
  ASSERT_NE(b, std::string::npos) << "docs/compressors.md lacks " << begin;
  ASSERT_NE(e, std::string::npos) << "docs/compressors.md lacks " << end;
  EXPECT_EQ(doc.substr(b + begin.size(), e - b - begin.size()), ParamsTable())
      << "docs/compressors.md's parameter table differs from the method descriptors; it should "
         "read:\n"
      << ParamsTable();
}

TEST(MethodSpec, DocsMinimumTableMatchesTheDescriptors) {
  const std::string doc = ReadSourceFile("docs/compressors.md");
  const std::string begin = "<!-- method-minimum: begin -->\n";
  const std::string end = "<!-- method-minimum: end -->";
  const size_t b = doc.find(begin);
  const size_t e = doc.find(end);
  ASSERT_NE(b, std::string::npos) << "docs/compressors.md lacks " << begin;
  ASSERT_NE(e, std::string::npos) << "docs/compressors.md lacks " << end;
  EXPECT_EQ(doc.substr(b + begin.size(), e - b - begin.size()), MinimumTable())
      << "docs/compressors.md's table of smallest tensors differs from the method descriptors; "
         "it should read:\n"
      << MinimumTable();
}

}  // namespace
}  // namespace bitpush::compressors
