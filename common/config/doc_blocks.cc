#include "common/config/doc_blocks.h"

#include <set>

#include "fmt/format.h"

namespace bitpush::config {

namespace {

// The lines of `text`, each without its newline; a trailing newline adds no empty line.
std::vector<std::string> Lines(std::string_view text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start < text.size()) {
    const size_t nl = text.find('\n', start);
    if (nl == std::string_view::npos) {
      out.emplace_back(text.substr(start));
      break;
    }
    out.emplace_back(text.substr(start, nl - start));
    start = nl + 1;
  }
  return out;
}

bool StartsWith(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

}  // namespace

std::string BlockBeginMarker(std::string_view tag, std::string_view name, std::string_view note) {
  return note.empty() ? fmt::format("<!-- {}:{} begin -->", tag, name)
                      : fmt::format("<!-- {}:{} begin: {} -->", tag, name, note);
}

std::string BlockEndMarker(std::string_view tag, std::string_view name) {
  return fmt::format("<!-- {}:{} end -->", tag, name);
}

StatusOr<std::string> ReplaceGeneratedBlocks(std::string_view doc, std::string_view tag,
                                             const DocBlocks& blocks) {
  const std::vector<std::string> lines = Lines(doc);
  const std::string any_marker = fmt::format("<!-- {}:", tag);
  std::set<std::string> seen;
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    out += lines[i] + "\n";
    if (!StartsWith(lines[i], any_marker)) continue;
    const std::string rest = lines[i].substr(any_marker.size());
    const size_t space = rest.find(' ');
    const std::string name = rest.substr(0, space);
    const std::string what = space == std::string::npos ? "" : rest.substr(space + 1);
    if (!StartsWith(what, "begin")) {
      return InvalidArgumentError(
          fmt::format("line {}: '{}' without its begin marker", i + 1, lines[i]));
    }
    const DocBlocks::value_type* block = nullptr;
    for (const auto& b : blocks) {
      if (b.first == name) block = &b;
    }
    if (block == nullptr) {
      return InvalidArgumentError(
          fmt::format("line {}: unknown generated block '{}:{}'", i + 1, tag, name));
    }
    if (!seen.insert(name).second) {
      return InvalidArgumentError(
          fmt::format("line {}: block '{}:{}' appears twice", i + 1, tag, name));
    }
    const std::string end = BlockEndMarker(tag, name);
    size_t j = i + 1;
    while (j < lines.size() && lines[j] != end) ++j;
    if (j == lines.size()) {
      return InvalidArgumentError(
          fmt::format("line {}: block '{}:{}' has no end marker '{}'", i + 1, tag, name, end));
    }
    if (!block->second.empty()) out += block->second + "\n";
    out += end + "\n";
    i = j;
  }
  for (const auto& b : blocks) {
    if (seen.count(b.first) == 0) {
      return InvalidArgumentError(fmt::format("no block '{}:{}' (expected a line '{}')", tag,
                                              b.first, BlockBeginMarker(tag, b.first, "...")));
    }
  }
  // Keep a document without a final newline as it was.
  if (!doc.empty() && doc.back() != '\n' && !out.empty()) out.pop_back();
  return out;
}

}  // namespace bitpush::config
