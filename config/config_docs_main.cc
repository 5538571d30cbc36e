// bitpush-config-docs: the tables of docs/config.md, generated from the knob table
// (config/cluster_knobs.h), and of docs/security.md ("Who may send what"), generated from
// the authorization table (common/node/authorization.h). A build tool; not installed.
//
//   bitpush-config-docs print                       every generated block, with its markers
//   bitpush-config-docs update FILE [--output OUT]  FILE with its blocks regenerated, written
//                                                  to OUT (default: FILE itself)
//
// `make config-docs` runs `update docs/config.md`; the ctest test config_docs fails when the
// file and the table disagree (tests/build/check_config_docs.sh). Exit status: 0 done, 1 the
// file cannot be read or written or its markers are wrong, 2 a usage error.
#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "common/config/doc_blocks.h"
#include "common/node/authorization.h"
#include "config/cluster_knobs.h"

namespace {

using namespace bitpush;

constexpr char kUsage[] =
    "usage: bitpush-config-docs print\n"
    "       bitpush-config-docs update FILE [--output OUT]\n";
constexpr char kNote[] =
    "generated from config/cluster_knobs.cc by `make config-docs`; edit the table there";

int Fail(const std::string& message) {
  std::fprintf(stderr, "bitpush-config-docs: %s\n", message.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  const config::DocBlocks blocks = config::ClusterKnobDocBlocks();
  if (args.size() == 1 && args[0] == "print") {
    for (const auto& [name, content] : blocks) {
      std::printf("%s\n%s\n%s\n\n",
                  config::BlockBeginMarker(config::kKnobDocTag, name, kNote).c_str(),
                  content.c_str(), config::BlockEndMarker(config::kKnobDocTag, name).c_str());
    }
    return 0;
  }
  const bool update = !args.empty() && args[0] == "update";
  if (!update || !(args.size() == 2 || (args.size() == 4 && args[2] == "--output"))) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  const std::string& path = args[1];
  const std::string& out_path = args.size() == 4 ? args[3] : path;
  // docs/security.md carries the authorization table; every other file the knob tables.
  const bool security = path.size() >= 11 && path.compare(path.size() - 11, 11, "security.md") == 0;
  const config::DocBlocks security_blocks = {{"authorization", node::AuthorizationTable()}};
  std::ifstream in(path, std::ios::binary);
  if (!in) return Fail("cannot read " + path);
  const std::string doc((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  StatusOr<std::string> updated =
      security ? config::ReplaceGeneratedBlocks(doc, "tables", security_blocks)
               : config::ReplaceGeneratedBlocks(doc, config::kKnobDocTag, blocks);
  if (!updated.ok()) return Fail(path + ": " + updated.status().message());
  std::ofstream out(out_path, std::ios::binary | std::ios::trunc);
  out << *updated;
  out.close();
  if (!out) return Fail("cannot write " + out_path);
  return 0;
}
